"""Window SUM/AVG of the shard equal ``math.fsum`` of the window's raw values, whatever the key's history.

Values log-uniform over 1e-3..1e15 (volumes, byte counters), after histories of large values
longer than the horizon; both the collective and the naive paths, ShardEvaluator driven
directly. Threshold decisions equal the fsum oracle's for thresholds farther than 1e-9 from
every window value (the guarantee is 1e-12; a near tie could go either way).
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evaluator.catalog import Catalog
from evaluator.panerows import PaneRows
from evaluator.shard import ShardEvaluator
from evaluator.spec import Aggregate, Condition, SubscriptionSpec
from tests.evaluator.oracle import oracle, value_of
from tests.evaluator.test_shard import ATTRS, CONFIG, DELAY, HORIZON, KEYS, PANE, PARTITIONS, pane_rows, progress_of
from tests.examples import examples

REL = 1e-12
big = st.floats(9, 15).map(lambda e: 10.0**e)
anything = st.floats(-3, 15).map(lambda e: 10.0**e)  # log-uniform 1e-3..1e15


@st.composite
def histories(draw):
    """A long stretch of large values (often longer than the horizon), then values of any size."""
    events, clock = [], 10_000
    for values, n in ((big, draw(st.integers(1, 80))), (anything, draw(st.integers(1, 30)))):
        for _ in range(n):
            clock += draw(st.integers(0, 700))
            events.append((draw(st.sampled_from(KEYS[:2])), clock, draw(values), draw(values)))
    return events


def _spec(i: int, aggregate: Aggregate, attribute: str, window: int, threshold: float, above: bool):
    bound = {"low": threshold} if above else {"high": threshold}
    return SubscriptionSpec(i, Condition(aggregate, attribute, window, **bound))


specs = st.lists(
    st.tuples(st.sampled_from([Aggregate.SUM, Aggregate.AVG]), st.sampled_from(ATTRS),
              st.sampled_from([1_000, 2_000, 5_000]), anything, st.booleans()),
    min_size=1, max_size=6,
).map(lambda items: [_spec(i + 1, *item) for i, item in enumerate(items)])
SUMMED = [Condition(a, attr, w, low=0.0) for a in (Aggregate.SUM, Aggregate.AVG) for attr in ATTRS
          for w in (1_000, 2_000, 5_000)]
RATIO = Condition(Aggregate.EXPR, None, 2_000, low=0.0,
                  expression=("/", ("agg", "SUM", "volume", None), ("agg", "COUNT", None, None)))


def window_of(events, key: str, c: Condition, b: int):
    return [e for e in events if e[0] == key and b - c.window_ms <= e[1] // PANE * PANE < b]


def close(got: float | None, want: float | None) -> bool:
    return (got is None and want is None) or (got is not None and want is not None
                                                and abs(got - want) <= REL * abs(want))


@settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=histories(), specs=specs, collective=st.booleans(), per_batch=st.integers(1, 12))
def test_window_sums_equal_fsum_whatever_the_history(events, specs, collective: bool, per_batch: int) -> None:
    shard = ShardEvaluator(replace(CONFIG, collective=collective))
    catalog = Catalog(1, tuple(specs))
    end = max(ts for _, ts, *_ in events) + HORIZON + 3 * PANE
    batches = [events[i : i + per_batch] for i in range(0, len(events), per_batch)]
    got, checked = set(), 0
    for batch in [*batches, []]:
        progress = progress_of(batch) if batch else dict.fromkeys(range(PARTITIONS), end)
        transitions, _ = shard.step(pane_rows(batch) if batch else PaneRows.empty(len(ATTRS)), progress, catalog)
        got |= {(t.subscription_id, t.key, t.state, t.evaluated_at) for t in transitions}
        for t in transitions:
            if t.state == "firing":  # the value an alert reports
                c = specs[t.subscription_id - 1].condition
                assert close(t.value, value_of(c, window_of(events, t.key, c, t.evaluated_at)))
        b = shard.evaluated_at
        if b is None:
            continue
        for c in [*SUMMED, RATIO]:
            for key in KEYS[:2]:  # every key's value at the last boundary, by the path the mode evaluates
                want = value_of(c, window_of(events, key, c, b))
                assert close(shard.value(c, key, b - 1), want), (c, key, b)
                checked += 1
            if collective:
                _, matched, _ = shard.preview(c)  # the collective lookups' own exact values
                assert all(close(v, value_of(c, window_of(events, k, c, b))) for k, v in matched.items())
    assert checked
    # transitions equal the fsum oracle's unless some window value is a near tie with a threshold
    last = (end - DELAY) // PANE * PANE
    first = min(ts for _, ts, *_ in events) // PANE * PANE + PANE
    for b in range(first, last + 1, PANE):
        for spec in specs:
            c = spec.condition
            threshold = c.low if c.low is not None else c.high
            for key in KEYS[:2]:
                value = value_of(c, window_of(events, key, c, b))
                if value is not None and abs(value - threshold) <= 1e-9 * threshold:
                    return
    assert got == oracle(events, specs, last, PANE, HORIZON)


def _run_issue_case(history: list[float], window: list[float], collective: bool) -> tuple[float, float]:
    """One key: ``history`` one event per pane, then ``window`` in the next panes; SUM and AVG over ``window``."""
    config = replace(CONFIG, partitions=1, delay_ms=0, horizon_ms=len(window) * PANE, collective=collective)
    shard = ShardEvaluator(config)
    values = history + window
    events = [("A", 10_000 + i * PANE, v, v) for i, v in enumerate(values)]
    shard.step(pane_rows(events), {0: 10_000 + len(values) * PANE}, Catalog(1, ()))
    assert shard.evaluated_at == 10_000 + len(values) * PANE
    now = shard.evaluated_at - 1
    c = Condition(Aggregate.SUM, "volume", len(window) * PANE, low=0.0)
    return shard.value(c, "A", now), shard.value(replace(c, aggregate=Aggregate.AVG), "A", now)


def test_the_issue_cases_through_the_shard() -> None:
    """Ten events of 1e15 then three of 1.0; 1,000 prices of 99.99 then [0.1, 0.2] (issue #11)."""
    for collective in (True, False):
        assert _run_issue_case([1e15] * 10, [1.0] * 3, collective) == (3.0, 1.0)
        total, avg = _run_issue_case([99.99] * 1_000, [0.1, 0.2], collective)
        assert (total, avg) == (0.1 + 0.2, (0.1 + 0.2) / 2)
