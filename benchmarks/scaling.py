"""The production pipeline on a Spark standalone cluster, 1 worker against 2, beside the capacity model.

    flock /tmp/tocsin-spark.lock python benchmarks/scaling.py              # about 8 minutes on two cores
    flock /tmp/tocsin-spark.lock python benchmarks/scaling.py --markdown docs/benchmarks.md   # ... and the run into its section there
    python benchmarks/scaling.py --quick                                   # smoke run

Real components: a Tansu broker and a Redis server of its own, and for each row a fresh standalone
cluster (``devstack.spark_cluster.SparkCluster``: a master and ``--workers`` workers of one core
each, separate JVMs whose executors run their own Python workers) that one driver submits the
production query to (``evaluator.spark.job.build_query``, ``TOCSIN_SPARK_MASTER`` = the cluster).

The stream and the measurement are the pipeline benchmark's (``benchmarks/pipeline.py``): a backlog
of ``--rate`` events per event-second over ``--keys`` Zipf-popular keys, published once; each row
drains it from the start with the production admission cap and its own checkpoint and Redis
prefix; events/s = rows processed after the first batch over the wall time of their batches, from
Spark's progress (never the event clock).

The prediction is the capacity model's (``benchmarks/capacity.py``): per-core costs measured in this
run before Spark starts (one process, one core), and this stream's own shape (its (key, pane) rows
per event, the catalog's groups, the transitions per event the row made), as
``batch_rate``: batch_rows / (fixed cost + batch_rows x executor cost / cores + the driver's sink).
The model assumes each executor core is a core of its own. This machine has two cores for the
driver, the executors, Tansu, Redis and the benchmark, so two one-core workers contend with the
rest; the second table sets the model's executor cost per event beside the executors' task time
per record by stage and the CPU time of the whole process tree, to show where a gap comes from.
Numbers are printed, never asserted.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.capacity import Costs, batch_rate, executor_us_per_event, measure, tables
from benchmarks.pipeline import (
    SECOND,
    Row,
    publish_feed,
    start_stack,
    stream,
    subscriptions,
    throughput_run,
)
from benchmarks.report import add_markdown_option, markdown_run, print_tables
from core import cli
from core.settings import Settings
from devstack.spark_cluster import SparkCluster
from evaluator.catalog import Catalog
from evaluator.shard import group_subscriptions
from evaluator.spark.session import spark_session, stop_session

WORKER_TIMEOUT_S = 60


def rows_per_event(n_keys: int, rate: int, seconds: int, start_ms: int) -> float:
    """(key, 1 s pane) rows per event of the stream: what the shards take in per record read."""
    seen, events = set(), 0
    for key, ts, *_ in stream(n_keys, rate, seconds, start_ms):
        seen.add((key, ts // SECOND))
        events += 1
    return len(seen) / max(events, 1)


def run_row(base: Settings, work: Path, workers: int, memory: str, row: Row, total_rows: int,
            budget_s: float) -> dict:
    """One cluster of ``workers`` one-core workers, the production query draining the backlog on it."""
    # Spark's own worker timeout (60 s), not the fault tests' short one: on two loaded cores a busy worker's
    # heartbeat can be late by seconds, and a worker declared lost costs its executor and a recomputed batch.
    with SparkCluster(workers=workers, cores_per_worker=1, memory=memory, work_dir=work / f"cluster-{workers}",
                      worker_timeout_s=WORKER_TIMEOUT_S) as cluster:
        settings = base.model_copy(update={"spark_master": cluster.master_url})
        spark = spark_session(settings, f"tocsin-scaling-{workers}")
        try:
            result = throughput_run(spark, settings, row, total_rows, budget_s)
        finally:
            stop_session(spark)
        result["alive"] = cluster.alive_workers()
    return result


def main() -> None:
    default_cap = Settings.model_fields["source_max_records_per_trigger"].default
    parser = cli.parser(__doc__, "python -m benchmarks.scaling")
    parser.add_argument("--quick", action="store_true", help="small sizes and budgets (a smoke run)")
    add_markdown_option(parser)
    parser.add_argument("--workers", default="1,2", help="workers (one core each) of each row's cluster")
    parser.add_argument("--memory", default="2g", help="memory each worker offers its executor")
    parser.add_argument("--keys", type=int, default=5_000)
    parser.add_argument("--rate", type=int, default=20_000, help="events per event-second")
    parser.add_argument("--seconds", type=int, default=30, help="event-seconds in the stream")
    parser.add_argument("--subscriptions", type=int, default=10_000)
    parser.add_argument("--cap", type=int, default=default_cap, help="records per micro-batch (admission cap)")
    parser.add_argument("--budget", type=float, default=90.0, help="wall seconds per row after the first batch")
    args = parser.parse_args()
    if args.quick:  # a row stops once drained: the budget is only waited out on a machine too busy to drain 800 rows
        args.keys, args.rate, args.seconds, args.subscriptions, args.cap, args.budget = 200, 200, 4, 300, 200, 120.0
        args.memory = "1g"

    begun = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = psutil.getloadavg()
    costs = measure(args.quick)  # before any JVM starts: one core, nothing else of ours running
    work, base, stop_stack = start_stack("scaling")
    results: dict[int, dict] = {}
    try:
        keys, start_ms, total_rows, _ = publish_feed(base, args.keys, args.rate, args.seconds)
        specs = subscriptions(args.subscriptions, keys, args.rate)
        for workers in [int(w) for w in args.workers.split(",") if w]:
            row = Row(f"{workers} worker{'s' if workers > 1 else ''}", specs, base.events_topic, "collective",
                      args.cap, args.keys)
            results[workers] = run_row(base, work, workers, args.memory, row, total_rows, args.budget)
    finally:
        stop_stack()
    shape = (rows_per_event(args.keys, args.rate, args.seconds, start_ms), len(group_subscriptions(Catalog(1, specs))))
    report(args, costs, shape, results, begun, load_before, psutil.getloadavg())


EXECUTOR_STAGES = ("read", "parse", "restore", "evaluate", "persist")  # in the executors' tasks; the sink: driver


def report(args, costs: Costs, shape: tuple[float, int], results: dict[int, dict], begun: str, load_before,
           load_after) -> None:
    rows_per_event_, groups = shape
    cores = psutil.cpu_count()
    base = min(results) if results else 1

    def model(workers: int) -> tuple[float, float]:
        """(events/s, executor µs per event) the model predicts for that row's batches and transitions."""
        x = results[workers]
        alerts_per_event = x["transitions"] / max(x["batch_rows"], 1)
        return (batch_rate(costs, workers, int(x["batch_rows"]), rows_per_event_, groups, alerts_per_event),
                executor_us_per_event(costs, rows_per_event_, groups, alerts_per_event))

    throughput, where = [], []
    for workers, x in sorted(results.items()):
        predicted, executor_us = model(workers)
        name = f"{workers} x 1 core"
        throughput.append([name, x["alive"], x["rate"], predicted, x["rate"] / predicted,
                           x["rate"] / results[base]["rate"], predicted / model(base)[0], x["batches"],
                           x["batch_rows"], x["batch_ms"], x["transitions"], "yes" if x["finished"] else "budget"])
        where.append([name, executor_us, *(x["us"][s] for s in EXECUTOR_STAGES),
                      sum(x["us"][s] for s in EXECUTOR_STAGES), x["us"]["sink"], x["cpu_us"],
                      "/".join(map(str, x["restores"])), x["rss_mb"]])
    title = (f"Scaling on a standalone cluster: {args.subscriptions:,} subscriptions, {args.keys:,} keys, "
             f"{args.rate:,} events per event-second, cap {args.cap:,}; events/s = rows processed after the first "
             f"batch / wall time of their batches; model = benchmarks/capacity.py's batch_rate ({groups} groups, "
             f"{rows_per_event_:.3f} (key, pane) rows per event); {cores} cores shared by the driver, the workers, "
             "Tansu and Redis")
    header = ["workers", "alive at end", "events/s measured", "events/s model", "measured / model",
              "speed-up measured", "speed-up model", "batches", "events/batch", "batch ms", "transitions/batch",
              "finished"]
    where_title = ("Where the time goes on the cluster, µs per record: the model's executor cost per event beside "
                   "the executors' task time by stage (stats:evaluator, every batch) and the driver's sink; tree CPU = "
                   "CPU time of the whole process tree (driver, master, workers, executors, Python workers, Tansu, "
                   "Redis) over every batch, the first (start-up, every match firing at once) included")
    where_header = ["workers", "model executor", *EXECUTOR_STAGES, "executor stages", "sink (driver)",
                    "tree CPU", "shard restores cached/caught up/rebuilt",
                    "peak RSS MB"]
    load = f"load average {load_before[0]:.1f} at the start, {load_after[0]:.1f} at the end"
    # the costs the prediction used, what they predict, and the measurement beside it
    printed = [*tables(costs), (title, header, throughput), (where_title, where_header, where)]
    print(f"\nRun of {begun}, {cores} cores, {load}")
    print_tables(printed)


if __name__ == "__main__":
    with markdown_run():
        main()
