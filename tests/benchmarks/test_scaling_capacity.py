"""The capacity model: its measurement still runs and prints both tables, and the model behaves as a model must."""

from __future__ import annotations

from dataclasses import replace

from benchmarks.capacity import LOADS, TODAY, Costs, batch_rate, predict
from tests.benchmarks.quick import run_quick
from tests.benchmarks.test_pipeline_benchmark import number, table_rows

COSTS = Costs(read_us=8, parse_us=3, spark_us=32, batch_s=0.9, row_us=10, change_us=1, transition_us=3,
              changes_per_row=1, sink_us=27, redis_us=10, delivery_ms=3, pane_bytes=100, event_bytes=20,
              subscription_shard_bytes=500, subscription_redis_bytes=50, alert_redis_bytes=1_000, event_wire_bytes=80)


def test_more_cores_drain_faster_but_never_more_than_linearly() -> None:
    one, two = (batch_rate(COSTS, n, 100_000, 0.2, 20, 0.01) for n in (1, 2))
    assert one < two < 2 * one  # the fixed cost and the driver's sink do not shrink with executors


def test_each_tier_grows_with_the_load() -> None:
    small, large = predict(COSTS, TODAY), predict(COSTS, LOADS[-1])
    for what in ("executor cores", "executor memory GB", "Kafka partitions", "Redis GB", "worker cores (delivery)"):
        assert large[what] > small[what], what
    more_alerts = predict(COSTS, replace(TODAY, alerts_per_event=0.5))
    assert more_alerts["worker cores (delivery)"] > small["worker cores (delivery)"]


def test_quick_run_prints_the_costs_and_the_prediction() -> None:
    stdout = run_quick("capacity.py")
    costs = {cells[0]: number(cells[1]) for cells in table_rows(stdout, "Per-core costs")}
    assert set(costs) == set(Costs.__dataclass_fields__)
    for name in ("read_us", "parse_us", "row_us", "sink_us", "redis_us", "pane_bytes", "subscription_shard_bytes",
                 "subscription_redis_bytes", "alert_redis_bytes"):
        assert costs[name] > 0, (name, costs[name])  # measured, not left at zero
    prediction = {cells[0]: cells[1:] for cells in table_rows(stdout, "Capacity model")}
    cores = [number(c) for c in prediction["executor cores"]]
    assert len(cores) == len(LOADS) and cores == sorted(cores) and cores[-1] > cores[0]
    assert {"Kafka partitions", "Redis shards", "executor memory GB"} <= set(prediction)
