"""Spark's own floor on this machine: what a micro-batch of the evaluator's shape costs with no work of ours in it.

    flock /tmp/tocsin-spark.lock python benchmarks/floor.py              # about 7 minutes on two cores
    flock /tmp/tocsin-spark.lock python benchmarks/floor.py --markdown docs/benchmarks.md   # ... and the run into its section there
    python benchmarks/floor.py --quick                                   # smoke run

Issue 14's latency and throughput targets are bounded below by what Spark charges for the query's
*shape*, whatever our stages do. This measures that shape with trivial Python in it, one local[2]
SparkSession, the same session settings as the evaluator (``evaluator.spark.session``: RocksDB
state store, Arrow, reused Python workers), Spark's built-in ``rate`` sources (rows made in the
JVM, each carrying a ~70-byte JSON string like a Kafka event's value), so no broker and no Redis:

- *JVM only*: source -> ``noop`` sink (scheduling, the offset and commit logs);
- *+ Python stage*: source -> ``mapInArrow`` that pre-aggregates per (key, pane) with pyarrow, as
  the parser does after parsing -> ``noop`` (one Python worker round trip and its Arrow transfers);
- *+ shuffle and Python state*: the same -> ``groupBy(shard).transformWithStateInPandas`` with a
  processor that keeps one counter per shard in RocksDB and emits one row per shard -> ``noop``
  (the shuffle, the state store and its commit, the second Python stage);
- *evaluator's shape*: the same with the sink's ``foreachBatch`` that collects the batch with
  ``toPandas``: everything the evaluator's query does except read Kafka, parse and evaluate.

Two measurements per pipeline:

- *live*: ``rate`` at ``--rate`` rows/s, the production 1 s trigger; after ``--warm-up`` s (and a
  first batch with rows), the batches of ``--seconds`` s (and at least one with rows): duration
  (``triggerExecution``) p50/p90/max, and the whole process tree's CPU seconds per batch. An alert
  waits for up to two such batches (docs/benchmarks.md, *the latency model*), so p99 <= 1 trigger + 1 s needs
  batches <= ~0.9 s;
- *drain*: ``rate-micro-batch`` at each of ``--rows-per-batch`` rows per batch (by default the pipeline
  benchmark's peer sizes, 20,000 and the production admission cap), no trigger interval, for
  ``--drain-seconds`` s: rows per wall second and CPU µs per row. 100,000 events/s on two cores is a
  budget of 20 CPU µs per event for everything. No pipeline of this shape, ours included, drains faster
  than its row here at the same batch size: that bounds what any work of ours can reach (issue 33).

Numbers are printed, never asserted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.pipeline import Resources
from benchmarks.report import add_markdown_option, markdown_run, print_tables
from core import cli
from core.settings import Settings
from evaluator.spark.session import spark_session, stop_session

KEYS = 5_000
PANE_MS = 1_000
#: A Kafka event's value as the feed writes it, made in the JVM from the rate source's row.
PAYLOAD = ("concat('{\"key\":\"SYM', cast(value % {keys} as string), '\",\"ts\":', cast(unix_millis(timestamp) as "
           "string), ',\"price\":101.25,\"volume\":300}')").replace("{keys}", str(KEYS))
#: Batches a query's progress keeps (Spark's default, 100, is fewer than a JVM-only drain of 20,000-row batches runs).
PROGRESS_KEPT = 10_000
PANES_SCHEMA = "shard int, key string, pane_start long, count long, sum_volume double"


class PreAggregate:
    """mapInArrow: the parser's output shape from its input shape, one row per (key, pane), a shard per key.

    Arrow in and out, as the parser (``evaluator.spark.parse``) runs since it moved to ``mapInArrow``."""

    def __init__(self, shards: int) -> None:
        self.shards = shards

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            key = pc.remainder(batch.column("value"), KEYS)
            pane = pc.multiply(pc.divide(batch.column("ts"), PANE_MS), PANE_MS)
            table = pa.table({"key": key, "pane": pane, "payload_bytes": pc.utf8_length(batch.column("payload"))})
            counts = table.group_by(["key", "pane"], use_threads=False).aggregate(
                [("key", "count"), ("payload_bytes", "sum")])
            keys = counts.column("key")
            yield from pa.table({
                "shard": pc.cast(pc.remainder(keys, self.shards), pa.int32()),
                "key": pc.binary_join_element_wise("SYM", pc.cast(keys, pa.string()), ""),
                "pane_start": pc.cast(counts.column("pane"), pa.int64()),
                "count": pc.cast(counts.column("key_count"), pa.int64()),
                "sum_volume": pc.cast(counts.column("payload_bytes_sum"), pa.float64())}).to_batches()


def counter_processor() -> Any:
    """A StatefulProcessor that keeps one count per shard (RocksDB) and emits it: the operator's state traffic
    without its evaluation."""
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle

    class Counter(StatefulProcessor):
        def init(self, handle: StatefulProcessorHandle) -> None:
            self.total = handle.getValueState("total", "total long")

        def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any  # noqa: N802, N803, ARG002
                            ) -> Iterator[pd.DataFrame]:
            seen = sum(int(frame["count"].sum()) for frame in rows)
            held = self.total.get() if self.total.exists() else None
            total = (held[0] if held else 0) + seen
            self.total.update((total,))
            yield pd.DataFrame({"shard": [int(key[0])], "total": [total]})

        def close(self) -> None:
            pass

    return Counter()


def collect(batch: Any, _batch_id: int) -> None:
    batch.toPandas()  # runs the batch, as the Redis sink does


Pipeline = Callable[[Any, int], Any]  # (a streaming DataFrame, shards) -> a DataStreamWriter


def jvm_only(frame: Any, _shards: int) -> Any:
    return frame.writeStream.format("noop")


def python_stage(frame: Any, shards: int) -> Any:
    return frame.mapInArrow(PreAggregate(shards), PANES_SCHEMA).writeStream.format("noop")


def _stateful(frame: Any, shards: int) -> Any:
    panes = frame.mapInArrow(PreAggregate(shards), PANES_SCHEMA)
    return panes.groupBy("shard").transformWithStateInPandas(counter_processor(), "shard int, total long", "append",
                                                              "None")


def stateful(frame: Any, shards: int) -> Any:
    return _stateful(frame, shards).writeStream.format("noop")


def evaluator_shape(frame: Any, shards: int) -> Any:
    return _stateful(frame, shards).writeStream.foreachBatch(collect)


PIPELINES: dict[str, Pipeline] = {"JVM only": jvm_only, "+ Python stage": python_stage,
                                  "+ shuffle and Python state": stateful, "evaluator's shape": evaluator_shape}


def source(spark: Any, live: bool, args: argparse.Namespace, rows_per_batch: int) -> Any:
    if live:
        frame = (spark.readStream.format("rate").option("rowsPerSecond", args.rate)
                 .option("numPartitions", args.partitions).load())
    else:
        frame = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", rows_per_batch)
                 .option("numPartitions", args.partitions).option("advanceMillisPerBatch", 1000).load())
    return frame.selectExpr("value", "unix_millis(timestamp) as ts", f"{PAYLOAD} as payload")


def wait_for_rows(query: Any, seen: set[int], timeout_s: float) -> None:
    """Until a batch not in ``seen`` with input rows has finished (or ``timeout_s``)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline and not any(
            p["batchId"] not in seen and p["numInputRows"] > 0 for p in query.recentProgress):
        time.sleep(0.2)


def run(spark: Any, name: str, pipeline: Pipeline, *, live: bool, args: argparse.Namespace, checkpoints: Path,
        rows_per_batch: int = 0) -> list[Any]:
    """One pipeline, live or draining ``rows_per_batch`` at a time: its measured batches' durations, rows, and
    CPU."""
    writer = pipeline(source(spark, live, args, rows_per_batch), args.shards)
    mode = "live" if live else f"drain-{rows_per_batch}"
    query = (writer.option("checkpointLocation", str(checkpoints / f"{name}-{mode}".replace(" ", "_")))
             .trigger(processingTime="1 second" if live else "0 seconds").queryName(f"floor-{mode}").start())
    try:
        time.sleep(args.warm_up)
        # A loaded machine can still be in the first (empty) batches after the warm-up's seconds: warm up until a
        # batch with rows is done, and measure until one is, so no phase reports only Spark's start.
        wait_for_rows(query, set(), args.warm_up * 10)
        seen = {p["batchId"] for p in query.recentProgress}
        seconds = args.seconds if live else args.drain_seconds
        started = time.time()
        with Resources() as used:
            time.sleep(seconds)
            wait_for_rows(query, seen, seconds * 10)
        wall = time.time() - started
        batches = [p for p in query.recentProgress if p["batchId"] not in seen]
    finally:
        query.stop()
    durations = [p["durationMs"].get("triggerExecution", 0) / 1000 for p in batches]
    rows = sum(p["numInputRows"] for p in batches)
    if not durations:
        return [name, 0, *([float("nan")] * 6)]
    if live:
        q = statistics.quantiles(durations, n=10, method="inclusive") if len(durations) > 1 else [durations[0]] * 9
        return [name, len(batches), round(rows / len(batches)), statistics.median(durations), q[8], max(durations),
                used.cpu_s / len(batches), used.rss_mb]
    return [name, f"{rows_per_batch:,}", len(batches), round(rows / len(batches)), statistics.median(durations), rows / wall,
            used.cpu_s * 1e6 / max(rows, 1), used.cpu_s / wall, used.rss_mb]


def main() -> None:
    defaults = Settings()
    parser = cli.parser(__doc__, "python -m benchmarks.floor", summary=True)
    parser.add_argument("--rate", type=int, default=1_000, help="live rows per second")
    parser.add_argument("--rows-per-batch", default=f"20000,{defaults.source_max_records_per_trigger}",
                        help="rows per batch when draining, comma-separated: a drain row at each")
    parser.add_argument("--live", action=argparse.BooleanOptionalAction, default=True,
                        help="the live rows (--no-live: drain rows only)")
    parser.add_argument("--warm-up", type=float, default=15.0)
    parser.add_argument("--seconds", type=float, default=30.0, help="measured seconds, live")
    parser.add_argument("--drain-seconds", type=float, default=30.0, help="measured seconds, draining")
    parser.add_argument("--partitions", type=int, default=defaults.event_partitions,
                        help="source partitions (default: the events topic's, TOCSIN_EVENT_PARTITIONS)")
    parser.add_argument("--shards", type=int, default=defaults.spark_shuffle_partitions,
                        help="shuffle partitions, one shard each (default TOCSIN_SPARK_SHUFFLE_PARTITIONS)")
    add_markdown_option(parser)
    parser.add_argument("--quick", action="store_true", help="smoke run: short phases, small batches")
    args = parser.parse_args()
    if args.quick:
        args.warm_up, args.seconds, args.drain_seconds, args.rows_per_batch = 6.0, 5.0, 5.0, "10000"
    sizes = [int(n) for n in args.rows_per_batch.replace("_", "").split(",") if n.strip()]
    if any(n <= 0 for n in sizes):
        parser.error("--rows-per-batch: each size must be a positive number of rows")
    settings = Settings(spark_master="local[2]", spark_shuffle_partitions=args.shards)
    spark = spark_session(settings, "tocsin-floor")
    # A drain of small batches runs more than Spark's default 100 batches in its measured seconds: keep them all
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", str(PROGRESS_KEPT))
    live_rows, drain_rows = [], []
    # ignore_cleanup_errors: a query stopped inside a batch may leave RocksDB writing its files while they go
    with tempfile.TemporaryDirectory(prefix="tocsin-floor-", ignore_cleanup_errors=True) as checkpoints:
        for name, pipeline in PIPELINES.items():
            if args.live:
                live_rows.append(run(spark, name, pipeline, live=True, args=args, checkpoints=Path(checkpoints)))
            drain_rows += [run(spark, name, pipeline, live=False, args=args, checkpoints=Path(checkpoints),
                               rows_per_batch=n) for n in sizes]
    stop_session(spark)
    tables = []
    if args.live:
        tables.append((
            f"Live: rate source at {args.rate:,} rows/s in {args.partitions} partitions, {args.shards} shards, trigger "
            f"1 s, local[2]; batches after a {args.warm_up:g} s warm-up (batch s = triggerExecution; CPU = the whole "
            "process tree)",
            ["pipeline", "batches", "rows/batch", "batch s p50", "batch s p90", "batch s max", "tree CPU s per batch",
             "peak RSS MB"], live_rows))
    drain_rows.sort(key=lambda row: int(row[1].replace(",", "")))  # by batch size, the pipelines in order
    tables.append((
        f"Drain: rows per batch as named, {args.partitions} partitions, {args.shards} shards, no trigger interval, "
        "local[2]",
        ["pipeline", "rows per batch", "batches", "rows/batch", "batch s p50", "rows per wall s",
         "tree CPU µs per row", "tree CPU s per wall s", "peak RSS MB"], drain_rows))
    print_tables(tables)


if __name__ == "__main__":
    with markdown_run():
        main()
