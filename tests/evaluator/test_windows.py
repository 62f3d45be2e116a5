"""Tuple windows, CHANGE / PCT_CHANGE / RATE and NO DATA in the shard, against the brute-force oracle.

Every plan (incremental, both of its ways, index, naive) on streams with late events, listed keys
that never report, catalog changes, snapshot/restore and replayed deltas; and the bounded
watched-key rule under key churn (a key that left is resolved once silent for the horizon).
"""

from __future__ import annotations

import math
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evaluator.aggregates import AGGREGATES
from evaluator.catalog import Catalog
from evaluator.comparators import COMPARATORS
from evaluator.panerows import PaneRows
from evaluator.shard import BatchStats, Delta, ShardEvaluator
from evaluator.spec import Aggregate, BinOp, Condition, SubscriptionSpec, Term
from tests.evaluator.oracle import oracle, value_of, window_of
from tests.evaluator.test_shard import ATTRS, CONFIG, DELAY, HORIZON, KEYS, PANE, PARTITIONS, pane_rows, progress_of
from tests.evaluator.test_shard import streams as jittered
from tests.evaluator.test_shard_time import disordered
from tests.examples import examples

TUPLE_MAX = 6
BASE = replace(CONFIG, tuple_max_events=TUPLE_MAX)
PLANS = {"incremental": BASE, "index": replace(BASE, plan="index"), "naive": replace(BASE, collective=False)}
TUPLE_AGGREGATES = [name for name, a in AGGREGATES.items() if a.tuple_windows]
NEW = ["CHANGE", "PCT_CHANGE", "RATE"]


def _term(name: str, attribute: str, param: float | None) -> Term:
    a = AGGREGATES[name]
    return Term(name, attribute if a.takes_attribute else None, (param or 0.5) if a.param else None)


@st.composite
def tuple_conditions(draw: st.DrawFn) -> Condition:
    """Any aggregate with a tuple window, alone, in an expression or with a percentage of the last value."""
    term = _term(draw(st.sampled_from(TUPLE_AGGREGATES)), draw(st.sampled_from(ATTRS)),
                 draw(st.sampled_from([0.1, 0.5, 1.0])))
    comparator = draw(st.sampled_from(COMPARATORS))
    ranges = comparator.ranges(*sorted(float(draw(st.integers(-30, 30))) for _ in range(comparator.arity)))
    n = draw(st.integers(1, TUPLE_MAX))
    shape = draw(st.sampled_from(["term", "expression", "percent"]))
    if shape == "term":
        return Condition(Aggregate(term.aggregate), term.attribute, 0, q=term.param, ranges=ranges, events=n)
    other = _term(draw(st.sampled_from(TUPLE_AGGREGATES)), term.attribute or "price", 0.5)
    expression = BinOp(draw(st.sampled_from(["-", "+", "/"])), term, other)
    percent_of = (term.attribute or "price") if shape == "percent" else None
    if percent_of:
        expression = BinOp("-", _term("MAX", percent_of, None), _term("MIN", percent_of, None))
    return Condition(Aggregate.EXPR, None, 0, expression=expression, percent_of=percent_of, ranges=ranges, events=n)


@st.composite
def change_conditions(draw: st.DrawFn) -> Condition:
    """CHANGE, PCT_CHANGE (CHANGE ... %) and RATE over time windows, moving up or down."""
    name = draw(st.sampled_from(NEW))
    low = float(draw(st.integers(-40, 40)))
    bounds = {"low": low} if draw(st.booleans()) else {"high": low}
    return Condition(Aggregate(name), draw(st.sampled_from(ATTRS)), draw(st.sampled_from([1_000, 2_000, 5_000])),
                     **bounds)


no_data = st.builds(lambda w: Condition(Aggregate.COUNT, None, w, high=0.0, high_inclusive=True, no_data=True),
                    st.sampled_from([1_000, 2_000, 5_000]))
# plain COUNTs share NO DATA's group (the same value asked), so the group's loosest ranges mix both
counts = st.builds(lambda w, low: Condition(Aggregate.COUNT, None, w, low=float(low)),
                   st.sampled_from([1_000, 2_000, 5_000]), st.integers(0, 3))
conditions = st.one_of(tuple_conditions(), change_conditions(), no_data, counts)
# "E" never reports: a listed E is watched all the same (NO DATA fires for it)
key_filters = st.one_of(st.none(), st.frozensets(st.sampled_from([*KEYS, "E"]), min_size=1))
specs_of = st.lists(st.tuples(conditions, key_filters), min_size=1, max_size=8).map(
    lambda items: [SubscriptionSpec(i + 1, c, keys) for i, (c, keys) in enumerate(items)])


def _step(shard: ShardEvaluator, batch: list, end: int, catalog: Catalog) -> tuple[list, Delta]:
    progress = progress_of(batch) if batch else dict.fromkeys(range(PARTITIONS), end)
    return shard.step(pane_rows(batch) if batch else PaneRows.empty(len(ATTRS)), progress, catalog)


def _run(shard: ShardEvaluator, batches: list, end: int, catalog: Catalog) -> tuple[set, dict]:
    got, values = set(), {}
    for batch in [*batches, []]:
        for t in _step(shard, batch, end, catalog)[0]:
            got.add((t.subscription_id, t.key, t.state, t.evaluated_at))
            values[(t.subscription_id, t.key, t.state, t.evaluated_at)] = t.value
    return got, values


@settings(max_examples=examples(120), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=jittered(), specs=specs_of)
def test_every_plan_equals_the_oracle(stream, specs: list[SubscriptionSpec]) -> None:
    """Events out of order within the allowed delay: every plan, and the values transitions carry."""
    events, batches = stream
    end = max(ts for _, ts, *_ in events) + HORIZON + 3 * PANE
    expected = oracle(events, specs, (end - DELAY) // PANE * PANE, PANE, HORIZON)
    catalog = Catalog(1, tuple(specs))
    for plan, config in {**PLANS, "scan": BASE}.items():
        shard = ShardEvaluator(config)
        if plan == "scan":
            shard.costs.force = "scan"
        elif plan == "incremental":
            shard.costs.force = "per_key"
        got, values = _run(shard, batches, end, catalog)
        assert got == expected, plan
        for (sid, key, _, b), value in values.items():
            c = specs[sid - 1].condition
            truth = value_of(c, window_of(c, [e for e in events if e[0] == key], b, PANE, HORIZON))
            assert (value is None) == (truth is None), (plan, sid, key, b)
            assert value is None or math.isclose(value, truth, rel_tol=1e-9, abs_tol=1e-9)  # type: ignore[arg-type]


@settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=disordered(), specs=specs_of)
def test_late_and_dropped_events_give_the_same_transitions_in_every_plan(batches, specs) -> None:
    """Disorder beyond the delay and idle gaps beyond the horizon: a late event takes its place by event time
    from the next boundary on (in a tuple window: if it is among the n newest); every plan agrees."""
    end = max(ts for b in batches for _, ts, *_ in b) + HORIZON + 3 * PANE
    catalog = Catalog(1, tuple(specs))
    outputs = {}
    for plan, config in PLANS.items():
        shard, stats, out = ShardEvaluator(config), BatchStats(), []
        for batch in [*batches, []]:
            progress = progress_of(batch) if batch else dict.fromkeys(range(PARTITIONS), end)
            transitions, _ = shard.step(pane_rows(batch), progress, catalog, stats)
            out.append(transitions)
        outputs[plan] = (out, stats.late_events, stats.dropped_events, shard.firing)
    assert outputs["incremental"] == outputs["index"] == outputs["naive"]


@settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=disordered(), specs=specs_of, split=st.integers(0, 8), behind=st.integers(0, 4))
def test_snapshots_and_replays_continue_exactly(batches, specs, split: int, behind: int) -> None:
    """A copy restored from a snapshot (the retained events of tuple windows included) and a stale copy
    replaying the deltas it missed evaluate the rest exactly as the original."""
    end = max(ts for b in batches for _, ts, *_ in b) + HORIZON + 3 * PANE
    batches = [*batches, []]
    catalog = Catalog(1, tuple(specs))
    split = min(split, len(batches) - 1)
    stale_at = max(split - behind, 0)
    original, cached, deltas = ShardEvaluator(BASE), ShardEvaluator(BASE), []
    for i in range(split):
        deltas.append(Delta.from_bytes(_step(original, batches[i], end, catalog)[1].to_bytes()))
        if i < stale_at:
            _step(cached, batches[i], end, catalog)
    restored = ShardEvaluator.from_snapshot(BASE, original.snapshot())
    for delta in deltas[stale_at:split]:
        cached.replay(delta)
    for i in range(split, len(batches)):
        expected, _ = _step(original, batches[i], end, catalog)
        assert _step(restored, batches[i], end, catalog)[0] == expected
        assert _step(cached, batches[i], end, catalog)[0] == expected
    assert restored.firing == cached.firing == original.firing


def test_key_churn_keeps_the_firing_sets_bounded() -> None:
    """COUNT(*) OVER 1s < 1 and NO DATA over keys that each report once: each key fires once it is silent and is
    resolved (forgotten) once silent for the horizon, so firing sets hold only keys of the horizon; a listed key
    keeps firing. Before issue 16 every key that ever left stayed firing."""
    specs = [SubscriptionSpec(1, Condition(Aggregate.COUNT, None, 1_000, high=1.0)),
             SubscriptionSpec(2, Condition(Aggregate.COUNT, None, 2_000, high=0.0, high_inclusive=True, no_data=True)),
             SubscriptionSpec(3, Condition(Aggregate.COUNT, None, 2_000, high=0.0, high_inclusive=True, no_data=True),
                              frozenset({"k0", "never"}))]
    catalog = Catalog(1, tuple(specs))
    events = [(f"k{i}", 10_000 + 250 * i, 1.0, 1.0) for i in range(400)]
    batches = [events[i : i + 8] for i in range(0, len(events), 8)]
    end = events[-1][1] + HORIZON + 3 * PANE
    for config in PLANS.values():
        shard, got, largest = ShardEvaluator(config), set(), 0
        for batch in [*batches, []]:
            got |= {(t.subscription_id, t.key, t.state, t.evaluated_at) for t in _step(shard, batch, end, catalog)[0]}
            largest = max(largest, *(len(shard.firing.get(sid, ())) for sid in (1, 2)))
        assert got == oracle(events, specs, (end - DELAY) // PANE * PANE, PANE, HORIZON)
        keys_per_horizon = HORIZON // 250 + 1
        assert largest <= keys_per_horizon, "firing sets follow the keys of the horizon, not every key seen"
        assert 1 not in shard.firing and 2 not in shard.firing
        assert shard.firing[3] == {"k0", "never"}, "listed keys are always watched"
        assert len(shard.running.keys.ids) <= 2, "ids of forgotten keys are released"
        assert (1, "k5", "resolved", 10_000 + 250 * 5 // PANE * PANE + HORIZON + PANE) in got


def test_a_late_event_enters_a_tuple_window_by_event_time() -> None:
    """LAST 3 EVENTS: a late event older than the three newest changes nothing; a late event among them pushes
    the oldest out, from the next evaluated boundary."""
    spec = SubscriptionSpec(1, Condition(Aggregate.AVG, "price", 0, low=10.0, events=3))
    catalog = Catalog(1, (spec,))
    shard = ShardEvaluator(replace(BASE, partitions=1, delay_ms=0))
    for ts, price in ((10_100, 6.0), (11_100, 6.0), (12_100, 6.0), (13_100, 6.0)):
        assert shard.step(pane_rows([("A", ts, price, 1.0)]), {0: ts}, catalog)[0] == []
    older, _ = shard.step(pane_rows([("A", 10_500, 100.0, 1.0)]), {0: 14_100}, catalog)  # not among the 3 newest
    assert older == []
    newer, _ = shard.step(pane_rows([("A", 12_500, 30.0, 1.0)]), {0: 15_100}, catalog)  # (6 + 30 + 6) / 3 = 14
    assert [(t.state, t.value, t.evaluated_at) for t in newer] == [("firing", 14.0, 15_000)]
