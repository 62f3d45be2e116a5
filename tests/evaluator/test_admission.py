"""Admission (evaluator/admission.py): a burst of new subscriptions spread over batches, checked against the same
shard run without a limit. A subscription admitted at a boundary fires there for exactly what the unlimited shard
holds firing after it, and from then on makes the unlimited shard's transitions; before, it makes none. Every batch
admits one at least; a batch's budget is overshot by one subscription's first transitions at most; a restored or
replaying copy admits the same subscriptions at the same boundaries."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evaluator.admission import Admission
from evaluator.catalog import Catalog, CatalogChange
from evaluator.shard import BatchStats, Delta, ShardConfig, ShardEvaluator
from evaluator.spec import Aggregate, Condition, SubscriptionSpec
from evaluator.substreams import SubstreamShard
from evaluator.transition import Transition
from tests.evaluator.test_shard import ATTRS, PANE, pane_rows

KEYS = tuple(f"k{i}" for i in range(8))
CONFIG = ShardConfig(ATTRS, PANE, 8_000, 0, 1)


def _condition(kind: int, threshold: int) -> Condition:
    if kind == 0:
        return Condition(Aggregate.COUNT, None, 3_000, low=float(threshold))
    if kind == 1:
        return Condition(Aggregate.SUM, "volume", 5_000, high=float(threshold * 4))
    return Condition(Aggregate.MAX, "price", 2_000, low=float(threshold))


subscriptions = st.lists(
    st.tuples(st.integers(0, 6),  # the second it is created
              st.integers(0, 2), st.integers(0, 4),  # its condition
              st.none() | st.frozensets(st.sampled_from(KEYS), min_size=1, max_size=3),  # listed keys
              st.none() | st.integers(1, 8)),  # deleted this many seconds after it was created
    min_size=1, max_size=24)
seconds = st.lists(st.lists(st.tuples(st.sampled_from(KEYS), st.integers(0, 4), st.integers(1, 4)), max_size=6),
                   min_size=10, max_size=16)


def _catalogs(subs: list[tuple], steps: int, rebuild_at: int | None) -> list[Catalog]:
    """Per second, the catalog: changes applied one version at a time (or, at ``rebuild_at``, a catalog without
    its change log, which a shard reads whole)."""
    catalog, out = Catalog.empty(), []
    for second in range(steps):
        specs = tuple(SubscriptionSpec(i + 1, _condition(kind, threshold), keys)
                      for i, (at, kind, threshold, keys, _) in enumerate(subs) if at == second)
        removals = tuple(i + 1 for i, (at, *_, after) in enumerate(subs) if after is not None and at + after == second)
        if specs or removals:
            catalog = catalog.applied(CatalogChange(catalog.version + 1, upserts=specs, removals=removals))
        if second == rebuild_at:
            catalog = Catalog(catalog.version, catalog.subscriptions)
        out.append(catalog)
    return out


def _events(second: int, events: list[tuple[str, int, int]]) -> list[tuple[str, int, float, float]]:
    """The second's events, and one of the last key's: a shard without data evaluates nothing (and admits nobody)."""
    return [(key, second * 1_000 - 900 + 100 * j, float(price), float(volume))
            for j, (key, price, volume) in enumerate([*events, (KEYS[-1], 0, 1)])]


def _run(shard: ShardEvaluator, catalogs: list[Catalog], events: list, start: int = 0,
         ) -> tuple[list[list[Transition]], list[Delta]]:
    out, deltas = [], []
    for second in range(start, len(catalogs)):
        rows = _events(second + 1, events[second] if second < len(events) else [])
        transitions, delta = shard.step(pane_rows(rows), {0: (second + 1) * 1_000}, catalogs[second], BatchStats())
        out.append(transitions)
        deltas.append(delta)
    return out, deltas


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(subscriptions, seconds, st.integers(1, 12), st.none() | st.integers(0, 9), st.integers(2, 12))
def test_admitted_subscriptions_follow_the_unlimited_shard(subs: list, events: list, limit: int,
                                                           rebuild_at: int | None, restore_at: int) -> None:
    steps = len(events) + len(subs) + 2  # quiet seconds at the end: one subscription admitted per batch at least
    catalogs = _catalogs(subs, steps, rebuild_at)
    unlimited, _ = _run(ShardEvaluator(CONFIG), catalogs, events)
    limited_shard = ShardEvaluator(replace(CONFIG, admission_transitions=limit))
    limited, deltas = _run(limited_shard, catalogs, events)

    firing: dict[int, set[str]] = defaultdict(set)  # the unlimited shard's, after each second
    admitted_at: dict[int, int] = {}
    for second, (reference, ours, delta) in enumerate(zip(unlimited, limited, deltas, strict=True)):
        for i, (at, *_, after) in enumerate(subs):
            if after is not None and at + after == second:
                firing.pop(i + 1, None)  # deleted: forgotten without a transition, by both
        for t in reference:
            (firing[t.subscription_id].add if t.state == "firing" else firing[t.subscription_id].discard)(t.key)
        first = dict.fromkeys(delta.admitted, 0)
        for sid in delta.admitted:
            assert sid not in admitted_at, "admitted once"
            admitted_at[sid] = second
        by_sid: dict[int, list[Transition]] = defaultdict(list)
        for t in ours:
            by_sid[t.subscription_id].append(t)
        for sid, made in by_sid.items():
            assert sid in admitted_at, f"subscription {sid} made transitions before it was admitted"
            if sid in first:  # admitted now: fires for what the unlimited shard holds firing
                assert all(t.state == "firing" for t in made)
                assert {t.key for t in made} == firing[sid]
                first[sid] = len(made)
            else:
                assert made == [t for t in reference if t.subscription_id == sid]
        for sid in admitted_at.keys() - by_sid.keys():  # quiet here: admitted now matching nothing, or quiet too
            if sid in first:
                assert not firing[sid]
            else:
                assert not [t for t in reference if t.subscription_id == sid]
        if len(first) > 1:  # each admitted while budget was left; the last may overshoot by its own
            assert sum(first.values()) <= limit + max(first.values())
        if delta.admitted:
            assert sorted(delta.admitted) == sorted(set(delta.admitted))
    kept = {i + 1 for i, (*_, after) in enumerate(subs) if after is None}
    assert kept <= admitted_at.keys() <= {i + 1 for i in range(len(subs))}, "every one kept is admitted in the end"
    assert not limited_shard.admission.waiting

    # A copy restored from a snapshot, and one replaying the deltas after it, admit the same at the same boundaries
    restore_at = min(restore_at, len(events) - 1)
    original = ShardEvaluator(replace(CONFIG, admission_transitions=limit))
    before, before_deltas = _run(original, catalogs[:restore_at], events)
    snapshot = original.snapshot()
    restored = ShardEvaluator.from_snapshot(original.config, snapshot)
    after, _ = _run(restored, catalogs, events, start=restore_at)
    assert before + after == limited
    replaying = ShardEvaluator.from_snapshot(original.config, ShardEvaluator(original.config).snapshot())
    for delta in before_deltas:
        replaying.replay(Delta.from_bytes(delta.to_bytes()))
    assert replaying.admission.admitted == original.admission.admitted


def test_a_burst_is_spread_over_batches_and_the_admitted_are_never_held_back() -> None:
    """200 subscriptions, each matching all 50 keys: 10,000 first transitions, 1,000 a batch (20 subscriptions). One
    admitted before keeps making its transitions while the others wait."""
    config = replace(CONFIG, admission_transitions=1_000)
    shard = ShardEvaluator(config)
    keys = [f"s{i}" for i in range(50)]
    early = Catalog(1, (SubscriptionSpec(1, Condition(Aggregate.COUNT, None, 2_000, low=3.0)),))
    burst = Catalog(2, early.subscriptions + tuple(
        SubscriptionSpec(i, Condition(Aggregate.COUNT, None, 2_000, low=1.0)) for i in range(2, 202)))
    shard.step(pane_rows([(k, 500, 1.0, 1.0) for k in keys]), {0: 1_000}, early)
    per_batch = []
    for second in range(2, 40):
        stats = BatchStats()
        events = [(k, second * 1_000 - 500, 1.0, 1.0) for k in keys] + [("s0", second * 1_000 - 400, 1.0, 1.0)]
        transitions, delta = shard.step(pane_rows(events), {0: second * 1_000}, burst, stats)
        per_batch.append((len(delta.admitted), stats.waiting, len(transitions)))
        if second == 3:  # subscription 1 (COUNT > 3), admitted before the burst, fires for s0 while 160 wait
            assert [t.key for t in transitions if t.subscription_id == 1] == ["s0"] and stats.waiting == 160
    admitted = [n for n, _, _ in per_batch]
    assert sum(admitted) == 200 and max(admitted) <= 1_000 // 50 + 1
    assert admitted[:10] == [20] * 10 and not any(admitted[10:])
    assert [w for _, w, _ in per_batch[:11]] == [200 - 20 * i for i in range(1, 11)] + [0]
    assert max(n for _, _, n in per_batch) <= 1_000 + 50
    assert all(shard.firing[sid] == set(keys) for sid in range(2, 202))


def test_a_substream_shard_lists_what_waits_in_every_view() -> None:
    """``SubstreamShard.waiting`` (what a subscription's page is told): every subscription a batch has not admitted
    yet, in the whole stream's evaluator and in a key prefix's view, and nothing once all are."""
    shard = SubstreamShard(replace(CONFIG, admission_transitions=100))
    keys = [f"s{i}" for i in range(50)]
    catalog = Catalog(1, tuple(SubscriptionSpec(i, Condition(Aggregate.COUNT, None, 2_000, low=0.0,
                                                             key_prefix="s" if i % 2 else None))
                               for i in range(1, 21)))
    admitted: set[int] = set()
    for second in range(1, 20):
        _, delta = shard.step(pane_rows([(k, second * 1_000 - 500, 1.0, 1.0) for k in keys]),
                              {0: second * 1_000}, catalog)
        admitted |= {*delta.base.admitted, *(sid for view in delta.views.values() for sid in view.admitted)}
        assert shard.waiting() == frozenset(range(1, 21)) - admitted, second
        if second == 1:
            assert shard.views and {5, 6, 7, 8} <= shard.waiting()  # the view (odd ids) and the base (even) wait
    assert admitted == set(range(1, 21)) and not shard.waiting()


def test_an_unlimited_shard_admits_at_once_and_a_limit_set_later_holds_back_only_what_is_new() -> None:
    admission = Admission(None)
    admission.follow(1)
    assert admission.admitted == {1} and not admission.waiting and admission.take([10**9, 5]) == 2
    admission.limit = 10
    admission.start_batch()
    admission.follow(2)
    assert admission.waits(2) and not admission.waits(1) and not admission.waits(-1)
    assert admission.take([4, 5, 3, 1]) == 3 and admission.take([12, 1]) == 1
    admission.admit([-2], 12)
    assert not admission.open and admission.admitted == {1, 2} and admission.admitted_now == [2]
    restored = Admission(10)
    restored.restore(None)  # a snapshot from before admission: what it knew was evaluated already
    restored.follow(7)
    restored.rebuilt([7])
    restored.follow(8)
    assert restored.admitted == {7} and restored.waiting == {8}
