"""The shard evaluator against a brute-force oracle over raw events, and its persistence paths."""

from __future__ import annotations

import math
import zlib
from collections import defaultdict
from dataclasses import replace

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evaluator.catalog import Catalog
from evaluator.panerows import PaneRows
from evaluator.shard import BatchStats, Delta, ShardConfig, ShardEvaluator
from evaluator.spec import Aggregate, Condition, SubscriptionSpec
from tests.evaluator.oracle import oracle, value_of
from tests.examples import examples

ATTRS = ("price", "volume")
PANE, DELAY, HORIZON, PARTITIONS = 1_000, 2_000, 8_000, 2
KEYS = ("A", "B", "C", "D")
CONFIG = ShardConfig(ATTRS, PANE, HORIZON, DELAY, PARTITIONS, value_retention_ms=5_000,
                     block_panes=2)  # MIN/MAX block summaries of 2 panes: windows of 3 or more use them


def partition_of(key: str) -> int:
    return zlib.crc32(key.encode()) % PARTITIONS


def pane_rows(events: list[tuple[str, int, float, float]]) -> PaneRows:
    """What the Spark parser emits for a batch: one row per (key, pane)."""
    if not events:
        return PaneRows.empty(len(ATTRS))
    panes: dict[tuple[str, int], list[tuple[int, float, float]]] = defaultdict(list)
    for key, ts, price, volume in events:
        panes[(key, ts // PANE * PANE)].append((ts, price, volume))
    keys, starts = zip(*panes, strict=True)
    values = [np.array(v, dtype=np.float64).T[1:] for v in panes.values()]  # (attributes, events) per pane
    with np.errstate(over="ignore"):  # the contract tests' extreme finite values sum to inf, as a parser's would
        sums = np.array([v.sum(axis=1) for v in values]).T
    return PaneRows(
        np.array(keys, dtype=object), np.array(starts, dtype=np.int64),
        np.array([v.shape[1] for v in values], dtype=np.int64),
        sums, np.array([v.min(axis=1) for v in values]).T,
        np.array([v.max(axis=1) for v in values]).T,
        np.cumsum([0] + [len(v) for v in panes.values()]).astype(np.int64),
        np.array([e[0] for v in panes.values() for e in v], dtype=np.int64),
        np.concatenate(values, axis=1),
    )


def progress_of(events: list[tuple[str, int, float, float]]) -> dict[int, int]:
    progress: dict[int, int] = {}
    for key, ts, *_ in events:
        p = partition_of(key)
        progress[p] = max(progress.get(p, ts), ts)
    return progress


SIMPLE = [a for a in Aggregate if a not in (Aggregate.EXPR, Aggregate.QUANTILE)]
EXPRESSIONS = [  # (expression, percent_of)
    (("-", ("agg", "MAX", "price", None), ("agg", "MIN", "price", None)), "price"),
    (("-", ("agg", "MAX", "price", None), ("agg", "MIN", "price", None)), None),
    (("/", ("agg", "SUM", "volume", None), ("agg", "COUNT", None, None)), None),
    (("-", ("agg", "LAST", "price", None), ("agg", "QUANTILE", "price", 0.5)), None),
    (("*", ("num", 2.0), ("agg", "AVG", "volume", None)), "volume"),
]


def _condition(kind, attr, window, a, b, shape, inc):
    bounds = {"low": None if shape == "below" else min(a, b), "high": None if shape == "above" else max(a, b),
              "low_inclusive": inc, "high_inclusive": not inc}
    if isinstance(kind, float):
        return Condition(Aggregate.QUANTILE, attr, window, q=kind, **bounds)
    if isinstance(kind, tuple):
        return Condition(Aggregate.EXPR, None, window, expression=kind[0], percent_of=kind[1], **bounds)
    return Condition(kind, None if kind is Aggregate.COUNT else attr, window, **bounds)


conditions = st.builds(
    _condition,
    st.one_of(st.sampled_from(SIMPLE), st.sampled_from([0.1, 0.5, 0.9, 1.0]), st.sampled_from(EXPRESSIONS)),
    st.sampled_from(ATTRS), st.sampled_from([1_000, 2_000, 5_000]),
    st.integers(0, 40).map(float), st.integers(0, 40).map(float), st.sampled_from(["above", "below", "between"]),
    st.booleans(),
)
def catalogs(conditions: st.SearchStrategy[Condition], max_size: int = 8) -> st.SearchStrategy[list[SubscriptionSpec]]:
    """Subscriptions numbered from 1, each of ``conditions`` over every key or a few of :data:`KEYS`."""
    return st.lists(
        st.tuples(conditions, st.one_of(st.none(), st.frozensets(st.sampled_from(KEYS), min_size=1))),
        min_size=1, max_size=max_size,
    ).map(lambda items: [SubscriptionSpec(i + 1, c, keys) for i, (c, keys) in enumerate(items)])


subscriptions = catalogs(conditions)


@st.composite
def streams(draw):
    """Events in per-partition time order up to a jitter within the allowed delay, split into batches."""
    n = draw(st.integers(1, 60))
    events, clock = [], 10_000
    for _ in range(n):
        clock += draw(st.integers(0, 700))
        jitter = draw(st.integers(0, DELAY - PANE))
        events.append((draw(st.sampled_from(KEYS)), clock - jitter, float(draw(st.integers(1, 20))),
                       float(draw(st.integers(0, 10)))))
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=6)))
    return events, [events[a:b] for a, b in zip([0, *cuts], [*cuts, n], strict=True) if b > a]


def run(shard: ShardEvaluator, batches, catalog: Catalog) -> tuple[set[tuple], dict[tuple, float], list[Delta]]:
    got, values, deltas = set(), {}, []
    for batch in batches:
        transitions, delta = shard.step(pane_rows(batch), progress_of(batch), catalog)
        deltas.append(delta)
        for t in transitions:
            got.add((t.subscription_id, t.key, t.state, t.evaluated_at))
            values[(t.subscription_id, t.key, t.state, t.evaluated_at)] = t.value
    return got, values, deltas


def assert_equals_the_oracle(stream, specs: list[SubscriptionSpec], collective: bool) -> None:
    """Run ``specs`` over ``stream`` and past its end (a final heartbeat on every partition): the transitions are
    the brute-force oracle's, and each reported value is its window's exact value."""
    events, batches = stream
    end = max(ts for _, ts, *_ in events) + HORIZON + 3 * PANE
    shard = ShardEvaluator(replace(CONFIG, collective=collective))
    catalog = Catalog(1, tuple(specs))
    got, values, _ = run(shard, batches, catalog)
    shard.ingest(PaneRows.empty(len(ATTRS)), dict.fromkeys(range(PARTITIONS), end))
    more, _delta = shard.advance(catalog)
    got |= {(t.subscription_id, t.key, t.state, t.evaluated_at) for t in more}
    assert got == oracle(events, specs, (end - DELAY) // PANE * PANE, PANE, HORIZON)
    for (sid, key, _state, b), value in values.items():
        c = specs[sid - 1].condition
        window = [e for e in events if e[0] == key and b - c.window_ms <= e[1] // PANE * PANE < b]
        expected = value_of(c, window, (b, PANE))
        assert (value is None and expected is None) or math.isclose(value, expected, rel_tol=1e-9, abs_tol=1e-9)


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=streams(), specs=subscriptions, collective=st.booleans())
def test_transitions_equal_the_brute_force_oracle(stream, specs, collective: bool) -> None:
    assert_equals_the_oracle(stream, specs, collective)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=streams(), specs=subscriptions, split=st.integers(0, 6))
def test_snapshot_and_replayed_deltas_continue_exactly(stream, specs, split: int) -> None:
    assert_a_restored_copy_continues(stream, specs, split)


def assert_a_restored_copy_continues(stream, specs: list[SubscriptionSpec], split: int) -> None:
    """A copy restored from a snapshot and brought up to date by deltas evaluates like the original."""
    events, batches = stream
    catalog = Catalog(1, tuple(specs))
    end = max(ts for _, ts, *_ in events) + HORIZON
    batches = [*batches, [("A", end, 1.0, 1.0)], [("B", end + 3_000, 2.0, 2.0)]]
    split = min(split, len(batches) - 1)
    original = ShardEvaluator(CONFIG)
    _, _, first = run(original, batches[:split], catalog)
    copy = ShardEvaluator.from_snapshot(CONFIG, ShardEvaluator(CONFIG).snapshot())
    for delta in first:
        copy.replay(Delta.from_bytes(delta.to_bytes()))
    restored = ShardEvaluator.from_snapshot(CONFIG, copy.snapshot())
    expected, expected_values, _ = run(original, batches[split:], catalog)
    got, got_values, _ = run(restored, batches[split:], catalog)
    assert got == expected
    assert got_values == expected_values
    assert restored.firing == original.firing


def test_late_event_counts_in_later_extents_and_too_late_is_dropped() -> None:
    spec = SubscriptionSpec(1, Condition(Aggregate.SUM, "volume", 5_000, low=10))
    catalog = Catalog(1, (spec,))
    shard = ShardEvaluator(ShardConfig(ATTRS, PANE, 5_000, 0, 1))
    shard.ingest(pane_rows([("A", 10_100, 1.0, 6.0)]), {0: 13_000})
    transitions, _ = shard.advance(catalog)
    assert transitions == [] and shard.evaluated_at == 13_000
    stats = BatchStats()
    # 6 more in pane 10s, which the indexes already hold: late, still counted from the next extent on
    shard.ingest(pane_rows([("A", 10_500, 1.0, 6.0)]), {0: 14_000}, stats)
    transitions, _ = shard.advance(catalog, stats)
    assert stats.late_events == 1
    assert [(t.state, t.evaluated_at, t.value) for t in transitions] == [("firing", 14_000, 12.0)]
    shard.ingest(pane_rows([("A", 3_000, 1.0, 100.0)]), {0: 15_000}, stats)  # older than every window to come
    transitions, _ = shard.advance(catalog, stats)
    assert stats.dropped_events == 1 and transitions == []
    shard.ingest(PaneRows.empty(2), {0: 20_000})
    transitions, _ = shard.advance(catalog)
    assert [(t.state, t.evaluated_at) for t in transitions] == [("resolved", 16_000)]  # the window slid past it


def test_removed_subscription_is_forgotten_and_a_new_one_fires_at_once() -> None:
    shard = ShardEvaluator(ShardConfig(ATTRS, PANE, 10_000, 0, 1))
    count = SubscriptionSpec(1, Condition(Aggregate.COUNT, None, 5_000, low=0))
    shard.ingest(pane_rows([("A", 1_000, 1.0, 1.0), ("B", 1_200, 1.0, 1.0)]), {0: 2_000})
    transitions, _ = shard.advance(Catalog(1, (count,)))
    assert {(t.key, t.state) for t in transitions} == {("A", "firing"), ("B", "firing")}
    high = SubscriptionSpec(2, Condition(Aggregate.MAX, "price", 5_000, low=0.5))
    shard.ingest(PaneRows.empty(2), {0: 3_000})
    transitions, delta = shard.advance(Catalog(2, (high,)))
    assert delta.dropped_subscriptions == [1] and 1 not in shard.firing
    assert {(t.subscription_id, t.key, t.state, t.evaluated_at) for t in transitions} == {
        (2, "A", "firing", 3_000), (2, "B", "firing", 3_000)}


@settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=streams(), condition=conditions, keys=st.one_of(st.none(), st.frozensets(st.sampled_from(KEYS))),
       collective=st.booleans())
def test_preview_answers_what_the_condition_matches_at_the_last_boundary(stream, condition, keys,
                                                                         collective: bool) -> None:
    events, batches = stream
    shard = ShardEvaluator(replace(CONFIG, collective=collective))
    run(shard, batches, Catalog(1, ()))
    at, matched, watched = shard.preview(condition, keys)
    assert at == shard.evaluated_at
    if at is None:
        assert matched == {} and watched == 0
        return
    known = {k for k, ts, *_ in events if at - HORIZON <= ts // PANE * PANE < at}
    expected = {}
    for key in known if keys is None else keys:  # a listed key is watched even without data (NO DATA)
        window = [e for e in events if e[0] == key and at - condition.window_ms <= e[1] // PANE * PANE < at]
        value = value_of(condition, window)
        if condition.holds(value):
            expected[key] = value
    assert matched.keys() == expected.keys()
    assert all(math.isclose(matched[k], v, rel_tol=1e-9, abs_tol=1e-9) for k, v in expected.items())
    assert watched == len(known if keys is None else keys)
