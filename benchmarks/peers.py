"""What a user would write instead of Tocsin, on the same topic, data and thresholds.

- *Spark's built-in windows*: our Kafka data source -> ``from_json`` ->
  ``groupBy(window(ts, W, '1 second'), key)`` with the five aggregates the
  subscriptions use -> a broadcast join with a static thresholds DataFrame ->
  alerts (counted in ``foreachBatch``). Append mode with a watermark of the
  same allowed delay, so each window is checked once, when it closes.
- *quixstreams*: one process, hopping windows of W stepping by 1 s over the
  same topic (event time from the record's ``ts``), the same five aggregates,
  each closed window checked against the thresholds with NumPy.

A peer has one window length W; every subscription's threshold is checked
against the W-window aggregates (its own window is replaced by W), so the
peers compare as many (window, key, subscription) triples per closed window as
there are subscriptions. The peers count every closed window over a threshold
(an answer set), Tocsin only transitions, so alert counts are printed for a
sanity check and not compared.
"""

from __future__ import annotations

import math
import uuid
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.progress import RowClock, Throughput, drain
from evaluator.spark.source import SOURCE_NAME
from evaluator.spec import SubscriptionSpec

MEASURES = ("count", "sum_volume", "avg_price", "max_price", "min_price")


@dataclass(frozen=True)
class Threshold:
    """One subscription's bounds on one measure, for every key (``key`` None) or one watched key."""

    subscription: int
    measure: str
    low: float | None
    high: float | None
    key: str | None


def thresholds(specs: Iterable[SubscriptionSpec]) -> list[Threshold]:
    rows = []
    for spec in specs:
        c = spec.condition
        measure = str(c.aggregate).lower() if c.attribute is None else f"{str(c.aggregate).lower()}_{c.attribute}"
        if measure not in MEASURES or c.ranges or c.low_inclusive or c.high_inclusive:
            raise ValueError(f"the peers check open single ranges of {MEASURES}, not {c}")
        for key in sorted(spec.keys) if spec.keys is not None else [None]:
            rows.append(Threshold(spec.id, measure, c.low, c.high, key))
    return rows


class ThresholdTable:
    """The thresholds as NumPy arrays per measure: one vectorised check per closed window."""

    def __init__(self, rows: list[Threshold]) -> None:
        grouped: dict[str | None, dict[str, list[Threshold]]] = defaultdict(lambda: defaultdict(list))
        for t in rows:
            grouped[t.key][t.measure].append(t)
        self._bounds = {
            key: {m: (np.array([-math.inf if t.low is None else t.low for t in ts]),
                      np.array([math.inf if t.high is None else t.high for t in ts])) for m, ts in by.items()}
            for key, by in grouped.items()
        }
        self._empty: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def breaches(self, key: str, values: dict[str, Any]) -> int:
        """How many thresholds the window's ``values`` lie strictly inside."""
        n = 0
        for scope in (self._bounds.get(None, self._empty), self._bounds.get(key, self._empty)):
            for measure, (low, high) in scope.items():
                v = values.get(measure)
                if v is not None:
                    n += int(np.count_nonzero((low < v) & (v < high)))
        return n


def spark_window_peer(spark: Any, *, bootstrap: str, topic: str, rows: list[Threshold], window_ms: int,
                      delay_ms: int, rows_per_batch: int, checkpoint: Path, total_rows: int,
                      warm_up_rows: int, budget_s: float) -> tuple[Throughput, int, list[dict]]:
    """Run the built-in ``window()`` peer over the topic as fast as it goes; (throughput, alerts, progress).

    Stopped between batches, as Tocsin's rows are (its source obeys a stop file): stopped inside one, its stream
    thread died of a StackOverflowError in a regex over the interrupted plan's text (2026-12-07)."""
    from pyspark.sql import functions as F  # noqa: N812 - pyspark's customary alias

    hold = checkpoint.with_name(f"{checkpoint.name}.stop")
    events = (
        spark.readStream.format(SOURCE_NAME).option("bootstrap", bootstrap).option("topic", topic)
        .option("maxRecordsPerTrigger", str(rows_per_batch)).option("stopFile", str(hold)).load()
        .select(F.from_json(F.col("value").cast("string"), "key string, ts long, price double, volume double")
                .alias("e"))
        .select("e.*")
        .where(F.col("key").isNotNull() & F.col("ts").isNotNull())  # heartbeats carry no key
        .withColumn("time", F.timestamp_millis("ts"))
        .withWatermark("time", f"{delay_ms} milliseconds")
    )
    windows = events.groupBy(F.window("time", f"{window_ms // 1000} seconds", "1 second"), "key").agg(
        F.count("*").cast("double").alias("count"), F.sum("volume").alias("sum_volume"),
        F.avg("price").alias("avg_price"), F.max("price").alias("max_price"), F.min("price").alias("min_price"),
    )
    stacked = ", ".join(f"'{m}', {m}" for m in MEASURES)
    values = windows.select("window", "key", F.expr(f"stack({len(MEASURES)}, {stacked}) as (measure, value)"))
    limits = spark.createDataFrame(
        [(t.subscription, t.measure, t.low, t.high, t.key) for t in rows],
        "subscription long, measure string, low double, high double, watched string",
    )
    alerts = values.join(
        F.broadcast(limits),
        (values.measure == limits.measure)
        & (limits.watched.isNull() | (limits.watched == values.key))
        & (limits.low.isNull() | (values.value > limits.low))
        & (limits.high.isNull() | (values.value < limits.high)),
    ).select("window", "key", "subscription")
    counted: list[int] = []

    def count_alerts(batch: Any, _batch_id: int) -> None:
        counted.append(batch.count())

    query = (
        alerts.writeStream.outputMode("append").foreachBatch(count_alerts)
        .option("checkpointLocation", str(checkpoint)).trigger(processingTime="0 seconds")
        .queryName(f"spark-window-{window_ms // 1000}s").start()
    )
    throughput, progress = drain(query, total_rows, warm_up_rows, budget_s, hold)
    return throughput, sum(counted), progress


def quixstreams_peer(*, bootstrap: str, topic: str, rows: list[Threshold], window_ms: int, state_dir: Path,
                     total_rows: int, warm_up_rows: int, budget_s: float) -> tuple[Throughput, int]:
    """Run a single-process quixstreams hopping-window job over the topic; (throughput, alerts)."""
    from quixstreams import Application
    from quixstreams.dataframe.windows import Count, Max, Mean, Min, Sum

    app = Application(
        broker_address=bootstrap, consumer_group=f"bench-quix-{uuid.uuid4().hex[:8]}",
        auto_offset_reset="earliest", state_dir=str(state_dir), loglevel="WARNING",
        # Tansu holds the first join until the session of the member id librdkafka's first JoinGroup was given
        # expires: ~23 s of start-up with the default 45 s session, ~3 s with this one.
        consumer_extra_config={"session.timeout.ms": 6_000},
    )
    source = app.topic(topic, value_deserializer="json", key_deserializer="string",
                       timestamp_extractor=lambda value, _headers, ts, _type: int(value.get("ts", ts)))
    table = ThresholdTable(rows)
    clock = RowClock(total_rows, warm_up_rows, budget_s)
    alerts = [0]

    def count_row(_value: Any) -> None:
        if not clock.tick():
            app.stop()

    def check(value: dict, key: str, _ts: int, _headers: Any) -> None:
        alerts[0] += table.breaches(key, value)

    sdf = app.dataframe(source)
    sdf.update(count_row)
    sdf = sdf.filter(lambda value: "key" in value)  # heartbeats
    sdf = sdf.hopping_window(duration_ms=window_ms, step_ms=1_000).agg(
        count=Count(), sum_volume=Sum("volume"), avg_price=Mean("price"), max_price=Max("price"),
        min_price=Min("price"),
    ).final()
    sdf.update(check, metadata=True)
    app.run(timeout=30)  # stops earlier, when the clock says the stream is done or the budget spent
    return clock.throughput(), alerts[0]
