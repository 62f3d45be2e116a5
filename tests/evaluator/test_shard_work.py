"""The incremental plan's work per boundary follows what changed, counted (never timed); key ids stay bounded."""

from __future__ import annotations

from evaluator.catalog import Catalog
from evaluator.incremental import PlanCosts
from evaluator.shard import BatchStats, ShardConfig, ShardEvaluator
from evaluator.spec import Aggregate, Condition, SubscriptionSpec
from tests.evaluator.test_shard import ATTRS, PANE, pane_rows

CONFIG = ShardConfig(ATTRS, PANE, 120_000, 0, 1)
ACTIVE = ("a1", "a2", "a3")


def _subscriptions(n: int, extra_matching: int) -> Catalog:
    """``n`` thresholds spread over COUNT and SUM, plus ``extra_matching`` that every key with data matches."""
    specs = []
    for i in range(n):
        specs.append(SubscriptionSpec(len(specs) + 1, Condition(Aggregate.COUNT, None, 60_000, low=float(i % 40))))
        specs.append(SubscriptionSpec(len(specs) + 1, Condition(Aggregate.SUM, "volume", 60_000, high=float(i))))
    for i in range(extra_matching):
        specs.append(SubscriptionSpec(len(specs) + 1, Condition(Aggregate.COUNT, None, 60_000, low=0.5 + i / 1e6)))
    return Catalog(1, tuple(specs))


def _work(idle: int, catalog: Catalog) -> list[tuple[int, int, int, int]]:
    """Idle keys get one event at 10 s; three keys get one each second. Per measured boundary (25 s..40 s):
    (changed keys, candidates, explicit keys, transitions)."""
    shard = ShardEvaluator(CONFIG)
    shard.costs.force = "per_key"  # the output-sensitive way (the adaptive choice may scan when it measures cheaper)
    shard.step(pane_rows([(f"idle{i}", 10_000, 1.0, 1.0) for i in range(idle)]), {0: 10_000}, catalog)
    per_boundary = []
    for second in range(11, 41):
        stats = BatchStats()
        events = [(k, second * 1_000 - 500, 1.0, float(j + 1)) for j, k in enumerate(ACTIVE)]
        shard.step(pane_rows(events), {0: second * 1_000}, catalog, stats)
        if second >= 25:
            assert stats.boundaries == 1
            per_boundary.append((stats.changed_keys, stats.candidates, stats.explicit_keys, stats.transitions))
    assert all(f"idle{i}" in shard.firing[len(catalog.subscriptions)] for i in range(idle)) or not idle
    return per_boundary


def test_work_follows_changed_keys_not_idle_keys_nor_matching_pairs() -> None:
    base = _work(100, _subscriptions(40, 1))
    assert _work(200, _subscriptions(40, 1)) == base, "idle known keys cost nothing"
    assert _work(100, _subscriptions(40, 50)) == base, "more matching (subscription, key) pairs cost nothing"
    groups = 2 + 1  # COUNT, SUM, and the extra COUNT(...) share COUNT's group: at most 3 values per key
    assert all(changed <= groups * len(ACTIVE) for changed, *_ in base)
    assert all(explicit == 0 for _, _, explicit, _ in base)
    # candidates: members with a threshold between a key's old and new value (one step of COUNT, of SUM)
    assert all(candidates <= 2 * len(ACTIVE) + transitions for _, candidates, _, transitions in base)


def test_key_churn_keeps_key_ids_bounded_by_the_active_keys() -> None:
    """Each second two new keys, each seen once: 600 keys over 10 minutes, ~2 * horizon_s known at a time."""
    config = ShardConfig(ATTRS, PANE, 10_000, 0, 1)
    catalog = Catalog(1, (SubscriptionSpec(1, Condition(Aggregate.COUNT, None, 5_000, low=1.0)),
                          SubscriptionSpec(2, Condition(Aggregate.COUNT, None, 5_000, high=1.0), frozenset({"k7"}))))
    shard = ShardEvaluator(config)
    capacities = []
    for second in range(1, 301):
        events = [(f"k{2 * second + j}", second * 1_000 - 500, 1.0, 1.0) for j in range(2)]
        shard.step(pane_rows(events), {0: second * 1_000}, catalog)
        capacities.append(shard.running.keys.capacity)
    assert max(capacities) <= 2 * 12 + 2, "ids are reused once a key is neither known nor firing"
    assert max(capacities[100:]) == max(capacities[:100])
    # k7 fires COUNT < 1 for subscription 2 forever after its data left: it is listed, so always watched
    assert shard.firing.get(2) == {"k7"} and shard.running.keys.get("k7") is not None
    assert len(shard.running.keys) <= 2 * 12 + 1
    assert set(shard._firing_by_key) == {"k7"}


class _RecordingCosts(PlanCosts):
    """PlanCosts that records the units each choice was made on and each measurement was taken in."""

    def __init__(self) -> None:
        super().__init__()
        self.chosen: list[float] = []
        self.measured_units: list[float] = []

    def choose(self, per_key_units: float, scan_units: float) -> str:
        self.chosen.append(per_key_units)
        return "per_key"

    def measured(self, plan: str, seconds: float, units: float) -> None:
        if plan == "per_key":
            self.measured_units.append(units)
        super().measured(plan, seconds, units)


def test_the_per_key_plan_is_measured_in_the_units_it_is_chosen_on() -> None:
    """The adaptive choice multiplies a cost per unit by the units of work it expects; a cost measured per
    candidate (a handful per boundary) but applied per changed key (thousands) made the per-key plan look ~1,000x
    dearer than it is, and shards scanned every member instead: 6x slower on the pipeline benchmark's mix."""
    costs = _RecordingCosts()
    shard = ShardEvaluator(CONFIG)
    shard.costs = costs
    catalog = _subscriptions(40, 1)
    for second in range(1, 30):
        events = [(f"k{i}", second * 1_000 - 500, 1.0, float(i % 7)) for i in range(200)]
        shard.step(pane_rows(events), {0: second * 1_000}, catalog)
    assert costs.measured_units and costs.measured_units == costs.chosen
    assert max(costs.measured_units) >= 200, "every changed key is a unit of the per-key plan's work"


def test_small_groups_fixed_cost_does_not_make_big_groups_scan() -> None:
    """Each per-key call has a fixed part: a group with 17 changed keys took 0.25 ms (15 us a key), one with 2,000
    took 0.3 ms (0.15 us a key). Averaging each call's ratio priced the big group at ~7 us a key, 14 ms, above a
    5 ms scan that in fact costs 15x the per-key plan; the ratio of the moving sums prices it at its own rate."""
    costs = PlanCosts()
    for _ in range(50):
        costs.measured("scan", 5e-3, 1_000_000)
        costs.measured("per_key", 0.25e-3, 17)
        costs.measured("per_key", 0.3e-3, 2_000)
    assert costs.choose(2_000, 1_000_000) == "per_key"
    assert costs.choose(2_000, 10_000) == "scan", "a scan of few cells is still taken when it is cheaper"
