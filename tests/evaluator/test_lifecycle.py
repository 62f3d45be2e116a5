"""Alert lifecycles (pending, keep-firing, hysteresis, damping, crossings) in the shard, against the oracle.

Every plan (incremental, index, naive) equals the brute-force lifecycle oracle; the plans agree step by step
through catalog edits that add, change and drop lifecycle clauses; a copy restored from a snapshot or brought
up to date by replaying deltas continues exactly; and a value flapping around its threshold every pane is
damped by the clauses.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evaluator.catalog import Catalog, CatalogChange
from evaluator.comparators import Range
from evaluator.lifecycle import Lifecycle
from evaluator.panerows import PaneRows
from evaluator.shard import ShardEvaluator
from evaluator.spec import Aggregate, Condition, SubscriptionSpec
from evaluator.transition import Transition
from tests.evaluator.oracle import lifecycle_oracle
from tests.evaluator.test_shard import (
    ATTRS,
    DELAY,
    HORIZON,
    KEYS,
    PANE,
    PARTITIONS,
    conditions,
    pane_rows,
    progress_of,
    streams,
)
from tests.evaluator.test_shard_plans import PLANS, _batches, _step, continue_copies
from tests.evaluator.test_shard_time import disordered
from tests.examples import examples

DURATIONS = st.sampled_from([0, 0, 500, 1_000, 2_000, 3_000])


@st.composite
def lifecycle_conditions(draw) -> Condition:
    """A condition with random lifecycle clauses: a state lifecycle (FOR, KEEP FIRING FOR, RESOLVE, DAMPEN) or a
    crossing (with DAMPEN)."""
    if draw(st.integers(0, 3)) == 0:  # a crossing
        direction = draw(st.sampled_from(["above", "below", "either"]))
        t = float(draw(st.integers(0, 40)))
        aggregate = draw(st.sampled_from([Aggregate.SUM, Aggregate.LAST, Aggregate.COUNT, Aggregate.MAX]))
        side = {"high": t} if direction == "below" else {"low": t}
        return Condition(aggregate, None if aggregate is Aggregate.COUNT else draw(st.sampled_from(ATTRS)),
                         draw(st.sampled_from([1_000, 2_000, 5_000])), **side,
                         lifecycle=Lifecycle(dampen_ms=draw(DURATIONS), crossing=direction))
    c = draw(conditions)
    resolve = None
    if draw(st.booleans()):
        slack = float(draw(st.integers(0, 10)))
        if c.low is not None:
            resolve = Range(low=c.low - slack, low_inclusive=True)
        elif c.high is not None:
            resolve = Range(high=c.high + slack, high_inclusive=True)
    return replace(c, lifecycle=Lifecycle(draw(DURATIONS), draw(DURATIONS), draw(DURATIONS), resolve))

any_condition = st.one_of(conditions, lifecycle_conditions(), lifecycle_conditions())
key_filters = st.one_of(st.none(), st.frozensets(st.sampled_from(KEYS), min_size=1))


def _beat(shard: ShardEvaluator, batch, end: int, catalog: Catalog):
    """A batch with a heartbeat on every partition at its newest event (safe: later events are at most the allowed
    delay older than the clock), so every partition moves and edits land mid-stream."""
    if not batch:
        return _step(shard, batch, end, catalog)
    newest = max(ts for _, ts, *_ in batch)
    return shard.step(pane_rows(batch), dict.fromkeys(range(PARTITIONS), newest), catalog)


def _seen(transitions: list[Transition]) -> set[tuple]:
    return {(t.subscription_id, t.key, t.state, t.evaluated_at, t.kind) for t in transitions}


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=streams(), specs=st.lists(st.tuples(any_condition, key_filters), min_size=1, max_size=6))
def test_every_plan_equals_the_lifecycle_oracle(stream, specs) -> None:
    events, batches = stream
    specs = [SubscriptionSpec(i + 1, c, keys) for i, (c, keys) in enumerate(specs)]
    end = max(ts for _, ts, *_ in events) + HORIZON + 3 * PANE
    catalog = Catalog(1, tuple(specs))
    expected = lifecycle_oracle(events, specs, (end - DELAY) // PANE * PANE, PANE, HORIZON)
    for plan, config in PLANS.items():
        shard, got = ShardEvaluator(config), set()
        for batch in [*batches, []]:
            transitions, _ = _beat(shard, batch, end, catalog)
            got |= _seen(transitions)
        assert got == expected, plan


@st.composite
def catalogs(draw):
    """A first catalog, then diffs that add subscriptions, change their conditions and lifecycle clauses (to,
    from and between clauses), and remove them."""
    n = draw(st.integers(1, 6))
    first = [SubscriptionSpec(i + 1, draw(any_condition), draw(key_filters)) for i in range(n)]
    current = {s.id: s for s in first}
    diffs, next_id = {}, n + 1
    for at in sorted(set(draw(st.lists(st.integers(0, 8), max_size=3)))):
        upserts = []
        for _ in range(draw(st.integers(0, 3))):
            if draw(st.booleans()):
                sid, next_id = next_id, next_id + 1
            else:
                sid = draw(st.integers(1, next_id - 1))
            if sid in current and draw(st.booleans()):  # the same condition, other clauses (or none)
                spec = replace(current[sid], condition=draw(_other_clauses(current[sid].condition)))
            else:
                spec = SubscriptionSpec(sid, draw(any_condition), draw(key_filters))
            upserts.append(spec)
            current[sid] = spec
        removals = tuple(draw(st.lists(st.integers(1, next_id - 1), max_size=2)))
        diffs[at] = (tuple({s.id: s for s in upserts}.values()), removals)
    return first, diffs


@st.composite
def _other_clauses(draw, c: Condition) -> Condition:
    """``c`` with other lifecycle clauses: none, a state lifecycle, or a crossing where its range allows one."""
    choice = draw(st.integers(0, 2))
    if choice == 0:
        return replace(c, lifecycle=None)
    half_line = not c.ranges and (c.low is None) != (c.high is None) and not (c.low_inclusive or c.high_inclusive)
    if choice == 1 and half_line:
        direction = "below" if c.high is not None else draw(st.sampled_from(["above", "either"]))
        return replace(c, lifecycle=Lifecycle(dampen_ms=draw(DURATIONS), crossing=direction))
    resolve = None
    if draw(st.booleans()) and not c.ranges:
        if c.low is not None:
            resolve = Range(low=c.low - draw(st.integers(0, 10)), low_inclusive=True)
        elif c.high is not None:
            resolve = Range(high=c.high + draw(st.integers(0, 10)), high_inclusive=True)
    return replace(c, lifecycle=Lifecycle(draw(DURATIONS), draw(DURATIONS), draw(DURATIONS), resolve))


def _catalogs(first, diffs, n: int) -> list[Catalog]:
    catalog, out = Catalog(1, tuple(first)), []
    for i in range(n):
        if i in diffs:
            upserts, removals = diffs[i]
            catalog = catalog.applied(CatalogChange(catalog.version + 1, upserts, removals))
        out.append(catalog)
    return out


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=streams(), catalog=catalogs())
def test_every_plan_equals_the_lifecycle_oracle_through_edits(stream, catalog) -> None:
    """Catalog edits mid-stream (clauses added, changed, removed; subscriptions turned into crossings and back):
    each catalog applies from the first boundary the shard evaluates after it, as in the oracle."""
    events, batches = stream
    batches = [*batches, []]
    end = max(ts for _, ts, *_ in events) + HORIZON + 3 * PANE
    seen = _catalogs(catalog[0], catalog[1], len(batches))
    last = (end - DELAY) // PANE * PANE
    for plan, config in PLANS.items():
        shard, got, steps = ShardEvaluator(config), set(), []
        for batch, cat in zip(batches, seen, strict=True):
            transitions, _ = _beat(shard, batch, end, cat)
            got |= _seen(transitions)
            steps.append((list(cat.subscriptions), shard.evaluated_at))
        assert got == lifecycle_oracle(events, steps, last, PANE, HORIZON), plan


@pytest.mark.slow  # a heavy property/Spark check: CI runs it (infra/test with CI set), a developer's default run not
@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=disordered(), catalog=catalogs())
def test_plans_agree_through_lifecycle_edits(batches, catalog) -> None:
    batches, end = _batches(batches)
    seen = _catalogs(catalog[0], catalog[1], len(batches))
    shards = {plan: ShardEvaluator(config) for plan, config in PLANS.items()}
    for batch, cat in zip(batches, seen, strict=True):
        outputs = {plan: _step(shard, batch, end, cat)[0] for plan, shard in shards.items()}
        for plan in shards:
            assert outputs[plan] == outputs["naive"], plan
    assert all(s.lifecycle.records == shards["naive"].lifecycle.records for s in shards.values())


@pytest.mark.slow  # a heavy property/Spark check: CI runs it (infra/test with CI set), a developer's default run not
@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=disordered(), catalog=catalogs(), split=st.integers(0, 8), behind=st.integers(0, 4))
def test_snapshots_and_replayed_deltas_continue_lifecycles_exactly(batches, catalog, split: int, behind: int) -> None:
    """Pending periods, keep-firing, damping and crossings continue exactly in a copy restored from a snapshot
    and in a stale copy that replays the deltas it missed, through catalog edits."""
    batches, end = _batches(batches)
    original, restored, cached = continue_copies(batches, end, _catalogs(catalog[0], catalog[1], len(batches)),
                                                 split, behind)
    assert restored.lifecycle.records == cached.lifecycle.records == original.lifecycle.records


# -- flapping ----------------------------------------------------------------------------------------------


def _flapping(panes: int) -> list[tuple[str, int, float, float]]:
    """One key whose price alternates 10, 30, 10, 30... every pane: LAST(price) crosses 20 at every boundary."""
    return [("A", 10_000 + i * PANE + 100, 30.0 if i % 2 else 10.0, 1.0) for i in range(panes)]


def _notifications(condition: Condition, events) -> list[Transition]:
    shard = ShardEvaluator(PLANS["incremental"])
    catalog = Catalog(1, (SubscriptionSpec(1, condition),))
    out: list[Transition] = []
    for i in range(0, len(events), 5):
        batch = events[i : i + 5]
        out += shard.step(pane_rows(batch), progress_of(batch), catalog)[0]
    end = events[-1][1] + HORIZON + 10 * PANE
    out += shard.step(PaneRows.empty(len(ATTRS)), dict.fromkeys(range(PARTITIONS), end), catalog)[0]
    return out


def test_a_flapping_value_notifies_at_most_once_per_damping_period() -> None:
    """A value oscillating around its threshold every pane: one firing per oscillation plain, at most one firing
    per damping period with DAMPEN, and one firing in all with KEEP FIRING FOR (or a pending period: none)."""
    events = _flapping(60)  # 60 panes: 30 oscillations
    base = Condition(Aggregate.LAST, "price", 1_000, low=20.0)
    plain = _notifications(base, events)
    firing = [t for t in plain if t.state == "firing"]
    assert len(firing) == 30 and len(plain) >= 59  # one firing and one resolved per oscillation

    damped = _notifications(replace(base, lifecycle=Lifecycle(dampen_ms=10_000)), events)
    fired = [t.evaluated_at for t in damped if t.state == "firing"]
    assert 1 <= len(fired) <= 7  # 60 s of flapping, one per 10 s at most
    for a, b in itertools.pairwise(fired):
        assert b - a >= 10_000
    for window_start in range(10_000, 71_000, 10_000):  # at most one notification of each state per period
        in_period = [t for t in damped if window_start <= t.evaluated_at < window_start + 10_000]
        assert sum(t.state == "firing" for t in in_period) <= 1

    kept = _notifications(replace(base, lifecycle=Lifecycle(keep_firing_ms=2_000)), events)
    assert [t.state for t in kept] == ["firing", "resolved"]  # fired once, resolved after the flapping ended

    pending = _notifications(replace(base, lifecycle=Lifecycle(for_ms=2_000)), events)
    assert pending == []  # never held two panes in a row

    crossing = _notifications(replace(base, lifecycle=Lifecycle(crossing="above", dampen_ms=10_000)), events)
    assert all(t.kind == "crossing" and t.state == "firing" for t in crossing)
    assert 1 <= len(crossing) <= 7
    assert len(_notifications(replace(base, lifecycle=Lifecycle(crossing="above")), events)) == 30


def test_pending_fires_after_the_period_even_when_no_data_moves() -> None:
    """A timer makes the shard evaluate the boundary its pending period ends at, though no pane changes there."""
    events = [("A", 10_000 + i * 200, 50.0, 1.0) for i in range(5)]  # one pane of data, then silence
    c = Condition(Aggregate.MAX, "price", 8_000, low=20.0, lifecycle=Lifecycle(for_ms=3_000, keep_firing_ms=1_500))
    out = _notifications(c, events)
    assert [(t.state, t.evaluated_at) for t in out] == [("firing", 14_000), ("resolved", 21_000)]
    assert out[0].value == 50.0 and out[1].value is None  # the window's value then (empty: MAX has none)


def test_transitions_written_before_kinds_still_load() -> None:
    t = Transition("a" * 32, 1, "A", "firing", 1.0, 0, 1_000, 1_000)
    assert "kind" not in t.to_dict() and '"kind"' not in t.to_json()  # a state transition's payload is unchanged
    assert Transition.from_dict(t.to_dict()) == t
    crossing = t._replace(kind="crossing")
    assert Transition.from_json(crossing.to_json()) == crossing


def test_conditions_without_lifecycle_keep_their_wire_form() -> None:
    c = Condition(Aggregate.SUM, "volume", 5_000, low=3.0)
    assert "lifecycle" not in c.to_dict()
    assert Condition.from_dict(c.to_dict()) == c
    life = replace(c, lifecycle=Lifecycle(for_ms=2_000, resolve=Range(low=1.0, low_inclusive=True)))
    assert Condition.from_dict(life.to_dict()) == life
    assert replace(c, lifecycle=Lifecycle()).lifecycle is None  # no clause: plain


def test_a_boundary_examines_only_the_flips_and_the_timers_due(monkeypatch) -> None:
    """Output-sensitive: with 5,000 keys firing under KEEP FIRING FOR, one raw flip costs one pair's work."""
    from evaluator.lifecycle import Raw, Tracker

    life = Lifecycle(keep_firing_ms=5_000)
    tracker = Tracker(PANE)
    tracker.follow(1, life)
    keys = {f"K{i}" for i in range(5_000)}
    out = tracker.step(1_000, Raw({1: set(keys)}, {(1, k) for k in keys}), lambda sid: life)
    assert len(out) == 5_000 and not tracker.reconcile
    examined: list[tuple] = []
    pair = Tracker._pair
    monkeypatch.setattr(Tracker, "_pair", lambda self, *args: examined.append(args[1:3]) or pair(self, *args))
    assert tracker.step(2_000, Raw({1: keys - {"K7"}}, {(1, "K7")}), lambda sid: life) == []
    assert examined == [(1, "K7")]
    assert tracker.next_due() == 7_000
    examined.clear()
    assert tracker.step(7_000, Raw({1: keys - {"K7"}}, set()), lambda sid: life) == [(1, "K7", "resolved", "state")]
    assert examined == [(1, "K7")]


def _edited(events, conditions_by_batch, batches) -> tuple[dict[str, list], set]:
    """Run every plan over ``batches``, subscription 1's condition replaced by the next one at each batch."""
    catalog, seen = Catalog(1, (SubscriptionSpec(1, conditions_by_batch[0]),)), []
    for c in conditions_by_batch:
        if c != catalog.subscriptions[0].condition:
            catalog = catalog.applied(CatalogChange(catalog.version + 1, (SubscriptionSpec(1, c),), ()))
        seen.append(catalog)
    end = events[-1][1] + HORIZON + 3 * PANE
    got: dict[str, list] = {}
    for plan, config in PLANS.items():
        shard, steps, out = ShardEvaluator(config), [], []
        for batch, cat in zip(batches, seen, strict=True):
            out += [(t.state, t.evaluated_at, t.kind) for t in _step(shard, batch, end, cat)[0]]
            steps.append((list(cat.subscriptions), shard.evaluated_at))
        got[plan] = out
    oracle = lifecycle_oracle(events, steps, (end - DELAY) // PANE * PANE, PANE, HORIZON)
    return got, {(state, b, kind) for sid, key, state, b, kind in oracle if key == "A"}


def test_an_edit_keeps_what_users_saw() -> None:
    """A firing key stays firing silently when a pending period is added, resolves when the subscription becomes a
    crossing, and fires again when it turns plain while its condition holds."""
    events = sorted([("A", 10_000 + i * 500, 50.0, 1.0) for i in range(40)]  # A: two events a pane, 10 s to 30 s
                    + [("D", 10_000 + i * 2_000, 50.0, 1.0) for i in range(10)],  # D: the other partition's clock
                    key=lambda e: e[1])
    batches = [events[:12], events[12:24], events[24:36], events[36:], []]
    c = Condition(Aggregate.COUNT, None, 2_000, low=1.0)
    held = replace(c, lifecycle=Lifecycle(for_ms=3_000))
    crossing = replace(c, lifecycle=Lifecycle(crossing="above"))
    got, oracle = _edited(events, [c, c, held, crossing, c], batches)
    assert all(out == got["naive"] for out in got.values())
    # plain: fires at 11 s; FOR added (batch 2): nothing; a crossing (batch 3): resolved; plain again: fires
    assert got["naive"] == [("firing", 11_000, "state"), ("resolved", 21_000, "state"),
                            ("firing", 27_000, "state"), ("resolved", 32_000, "state")]
    assert set(got["naive"]) == oracle
