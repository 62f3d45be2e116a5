"""The capacity model: per-core costs measured on this machine, and what a load needs from each tier.

    python benchmarks/capacity.py              # measure (about 2 minutes), print the costs and the prediction
    python benchmarks/capacity.py --markdown docs/benchmarks.md   # ... and the run into its section there
    python benchmarks/capacity.py --quick      # smoke run

Measured here, one core each (one process, one Arrow thread, as one Spark task), in CPU time where the
work is this process's own (parse, shard, sink), so other jobs on the machine do not inflate it:

- *read*: CPU µs per record of the source's ``KafkaStreamReader.read`` over a Tansu topic in slices
  (``benchmarks/ingest.py``'s reader, the C CRC32C and pooled consumer of production; the broker's
  CPU not counted);
- *parse*: µs per record of ``PaneParser`` with pane pre-aggregation (``benchmarks/ingest.py``);
- the shard (``benchmarks/shard.py``'s feed and catalog, incremental plan): µs per (key, pane) row
  taken in (panes, running windows; an empty catalog), and per boundary µs per changed
  (subscription group, key) value and per transition, solved from two catalog sizes whose
  transitions differ; how many (group, key) values change per row and group;
- *sink*: µs per transition of ``RedisAlertSink`` on the driver, and the Redis server's own CPU
  µs per transition (``benchmarks/sink.py``'s frames);
- *state*: bytes per (key, pane) the shard holds in its horizon, per event value retained for
  QUANTILE, per subscription in every shard (its groups) and in the Redis catalog, per alert in
  Redis (stream entry, history, firing hash), traced with ``tracemalloc`` and Redis ``used_memory``.

Taken from other benchmarks (named where printed, not re-run here: they need Spark or Celery):
Spark's own work per record (the pipeline benchmark's tree CPU less its stages), the fixed cost of a
micro-batch (its heartbeats-only batch), and the CPU of one delivery (``benchmarks/notifier.py``).

The prediction (``predict``) turns a load (events/s, subscriptions, keys, alerts per event) into
evaluator cores, driver cores, executor memory, Kafka partitions, Redis shards and delivery
workers; ``batch_rate`` predicts a backlog drain's events/s on N executor cores, which
``benchmarks/scaling.py`` compares with the measured cluster. Numbers are printed, never asserted.
"""

from __future__ import annotations

import gc
import math
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar, cast

import pyarrow as pa
import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.ingest import panes_per_second, produce, raw_frame, read_all, records
from benchmarks.report import add_markdown_option, markdown_run, print_tables
from benchmarks.shard import ATTRS, MINUTE, PANE, SHARDS, Feed, catalog_for, run_boundaries
from benchmarks.sink import Frame, batch_frame
from core import cli
from core.redis_schema import RedisKeys
from core.settings import Settings
from devstack.services import free_port, start_redis, start_tansu
from evaluator.catalog import Catalog
from evaluator.shard import BatchStats, ShardConfig, ShardEvaluator, group_subscriptions
from evaluator.spark.parse import PaneParser
from evaluator.spark.sink import RedisAlertSink

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

T = TypeVar("T")
GB = 2**30
# From other benchmarks (docs/benchmarks.md, "pipeline" and "notifier"); see the module docstring.
SPARK_US = 96.1 - (9.57 + 3.85 + 2.76 + 25.5 + 1.01 + 21.4)  # collective 10k, 17:47 run: tree CPU less the stages
BATCH_S = 0.913  # the heartbeats-only micro-batch on idle cores (21:05 run): Spark's fixed cost per batch
DELIVERY_MS = 3.0  # CPU of one webhook delivery: claim, mark and log in Redis, the HTTP post (notifier benchmark)
EXECUTOR_BASE_GB = 1.5  # an executor's JVM and its Python workers before any state (pipeline: ~3 GB for local[2])
UTILISATION = 0.6  # cores sized to run at 60 %: room for bursts, catch-up after a restart, and GC
REDIS_SHARD_GB = 16  # memory per Redis shard before another is added
REDIS_UTILISATION = 0.5  # a Redis shard's one core at 50 %


@dataclass(frozen=True)
class Costs:
    """Per-core costs (µs of one core) and state sizes (bytes); the model's only inputs besides the load."""

    read_us: float  # per record, Kafka read in a source task
    parse_us: float  # per record, parse + pane pre-aggregation
    spark_us: float  # per record, Spark's own work: shuffle, Arrow hops, scheduling, state commit (pipeline)
    batch_s: float  # fixed per micro-batch, on the driver (pipeline)
    row_us: float  # per (key, pane) row taken in by a shard
    change_us: float  # per changed (group, key) value at a boundary: the value, the members that flip
    transition_us: float  # per transition, in the shard (building it, firing sets)
    changes_per_row: float  # changed (group, key) values per (key, pane) row and group
    sink_us: float  # per transition, the driver's sink (payloads, the script's round trip)
    redis_us: float  # per transition, the Redis server's CPU
    delivery_ms: float  # per notification, dispatcher + Celery worker CPU (notifier benchmark)
    pane_bytes: float  # per (key, pane) held in a shard's horizon
    event_bytes: float  # per event value retained for QUANTILE
    subscription_shard_bytes: float  # per subscription, in every shard (groups, sorted endpoints, its spec)
    subscription_redis_bytes: float  # per subscription, in the Redis catalog
    alert_redis_bytes: float  # per alert kept in Redis (stream entry, history entry, firing hash)
    event_wire_bytes: float  # per event in Kafka (its JSON value and key)

    @property
    def event_us(self) -> float:
        """Per record, before the shard: read, parse and Spark's own work."""
        return self.read_us + self.parse_us + self.spark_us


@dataclass(frozen=True)
class Load:
    name: str
    events_per_s: float
    subscriptions: int
    keys: int
    alerts_per_event: float = 0.001  # transitions per event: per-symbol alerts make ~0.0004 (pipeline, live rows)
    groups: int = 40  # distinct (aggregate, attribute, window) asked: 5 aggregates x 2 attributes x 4 windows
    horizon_s: float = 3 * 3600  # TOCSIN_MAX_WINDOW_MS
    quantile_s: float = 3600  # TOCSIN_QUANTILE_MAX_WINDOW_MS
    alerts_kept: int = 1_000_000  # alert stream and history entries Redis keeps

    @property
    def rows_per_s(self) -> float:
        """(key, pane) rows per second: at most one per key and 1 s pane, at most one per event."""
        return min(self.events_per_s, self.keys)


TODAY = Load("today (live benchmark)", 1_000, 10_000, 1_000)
LOADS = (TODAY, replace(TODAY, name="10x", events_per_s=10_000, subscriptions=100_000, keys=10_000),
         replace(TODAY, name="1000x", events_per_s=1_000_000, subscriptions=10_000_000, keys=1_000_000),
         replace(TODAY, name="1000x, noisy catalog (1 alert per 20 events)", events_per_s=1_000_000,
                 subscriptions=10_000_000, keys=1_000_000, alerts_per_event=0.05))


def shard_work_us(costs: Costs, rows: float, groups: int, transitions: float) -> float:
    """Core-µs in the shards for ``rows`` (key, pane) rows and ``transitions``."""
    return rows * (costs.row_us + groups * costs.changes_per_row * costs.change_us) + transitions * costs.transition_us


def executor_us_per_event(costs: Costs, rows_per_event: float, groups: int, alerts_per_event: float) -> float:
    return costs.event_us + shard_work_us(costs, rows_per_event, groups, alerts_per_event)


def batch_rate(costs: Costs, cores: int, batch_rows: int, rows_per_event: float, groups: int,
               alerts_per_event: float) -> float:
    """Events/s draining a backlog in batches of ``batch_rows`` on ``cores`` executor cores with a driver of its own.

    A batch takes the fixed cost, then the executors' work spread evenly over the cores, then the sink's
    ``foreachBatch`` on the driver: batch_rows / (F + batch_rows * executor cost / cores + batch_rows * sink cost).
    """
    executor_s = batch_rows * executor_us_per_event(costs, rows_per_event, groups, alerts_per_event) / 1e6
    sink_s = batch_rows * alerts_per_event * costs.sink_us / 1e6
    return batch_rows / (costs.batch_s + executor_s / cores + sink_s)


def predict(costs: Costs, load: Load) -> dict[str, float]:
    """What ``load`` needs, each tier sized from the costs (cores at ``UTILISATION``)."""
    transitions = load.events_per_s * load.alerts_per_event
    executor_core_s = (load.events_per_s * costs.event_us
                       + shard_work_us(costs, load.rows_per_s, load.groups, transitions)) / 1e6
    cores = max(1, math.ceil(executor_core_s / UTILISATION))
    shards = cores  # one shard per core: TOCSIN_SPARK_SHUFFLE_PARTITIONS
    window_state = load.rows_per_s * load.horizon_s * costs.pane_bytes + \
        load.events_per_s * load.quantile_s * costs.event_bytes
    catalog_state = shards * load.subscriptions * costs.subscription_shard_bytes
    executor_gb = (window_state + catalog_state) / GB + cores * EXECUTOR_BASE_GB
    redis_gb = (load.subscriptions * costs.subscription_redis_bytes + load.alerts_kept * costs.alert_redis_bytes) / GB
    redis_cores = transitions * costs.redis_us / 1e6 / REDIS_UTILISATION
    return {
        "executor cores": cores,
        "driver cores (planning + sink)": 1 + transitions * costs.sink_us / 1e6 / UTILISATION,
        "executor memory GB": executor_gb,
        "of which windows GB": window_state / GB,
        "of which catalog copies GB": catalog_state / GB,
        "Kafka partitions": cores,  # each executor core reads one partition at a time, and keys spread over them
        "Kafka ingress MB/s": load.events_per_s * costs.event_wire_bytes / 2**20,
        "Redis shards": max(1, math.ceil(redis_gb / REDIS_SHARD_GB), math.ceil(redis_cores)),
        "Redis GB": redis_gb,
        "worker cores (delivery)": max(1, math.ceil(transitions * costs.delivery_ms / 1e3 / UTILISATION)),
    }


# -- measurements --------------------------------------------------------------------------------------------


def measure_parse(n: int) -> tuple[float, float]:
    """µs per record parsed, and bytes per record (value and key)."""
    values = records(n)
    raw = raw_frame(values)
    parser = PaneParser(Settings(), (0, 1))
    panes_per_second(parser, raw.head(1_000))  # imports, regex compilation
    cpu = time.process_time  # CPU time: what other jobs on the machine do not inflate
    wire = sum(len(v) for v in values) / n + len("S00000")
    return 1e6 / max(panes_per_second(parser, raw, cpu) for _ in range(2)), wire


def measure_read(work: Path, n: int) -> float:
    port = free_port()
    broker = start_tansu("127.0.0.1", port, work / "tansu.log")
    try:
        settings = Settings(kafka_bootstrap=f"127.0.0.1:{port}", events_topic="capacity-read", event_partitions=2,
                            data_dir=work)
        produce(settings, n)
        read_all(settings.kafka_bootstrap, settings.events_topic, 10_000, True)  # the pooled consumers' start-up
        started = time.process_time()  # this process's CPU: the broker's is Kafka's cost, not the executor's
        got = read_all(settings.kafka_bootstrap, settings.events_topic, 10_000, True)
        assert got["rows"] == n, got
        return (time.process_time() - started) * 1e6 / got["rows"]
    finally:
        broker.stop()


@dataclass(frozen=True)
class ShardCosts:
    row_us: float
    change_us: float
    transition_us: float
    changes_per_row: float
    pane_bytes: float
    event_bytes: float
    subscription_bytes: float
    subscription_redis_bytes: float
    groups: int


def traced_bytes(build: Callable[[], T]) -> tuple[T, int]:
    """What ``build()`` returns, and the bytes it holds once built (numpy reports its buffers to tracemalloc)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        built = build()
        gc.collect()
        return built, tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def measure_shard(sizes: tuple[int, int], warm_s: int, measured: int, per_second: int) -> ShardCosts:
    config = ShardConfig(ATTRS, PANE, 5 * MINUTE, 0, 1)
    feed = Feed(5_000, per_second, seed=7, shards=SHARDS)
    fed = [feed.second(1_000_000 + s * PANE) for s in range(warm_s)]
    rows_per_boundary = sum(len(rows) for rows in fed) / warm_s
    events_fed = sum(int(rows.counts.sum()) for rows in fed)
    del fed

    def warmed(shard_config: ShardConfig) -> tuple[ShardEvaluator, int]:
        shard = ShardEvaluator(shard_config)
        _, _, after = run_boundaries(shard, feed, 1_000_000, warm_s, Catalog.empty(), "state")
        return shard, after

    # state: what a shard holds after the horizon's panes, with and without every event's values kept
    (shard, t), plain = traced_bytes(lambda: warmed(config))
    pane_bytes = plain / max(len(shard.running.store), 1)
    (retaining, _), with_values = traced_bytes(lambda: warmed(replace(config, value_retention_ms=5 * MINUTE)))
    event_bytes = max(0.0, with_values - plain) / max(events_fed, 1)  # the horizon covers every event fed
    del retaining
    # a catalog of the same groups whose thresholds no key reaches: the subscriptions' own state, no firing sets
    quiet = Catalog(1, tuple(replace(spec, condition=replace(spec.condition, low=1e18, high=None, ranges=()))
                             for spec in catalog_for(sizes[1], shard, seed=11).subscriptions))
    blob = shard.snapshot()
    restored = ShardEvaluator.from_snapshot(config, blob)
    _, with_catalog = traced_bytes(lambda: run_boundaries(restored, feed, t, 1, quiet, "catalog state"))
    subscription_bytes = with_catalog / sizes[1]  # its spec, groups, sorted endpoints after the first boundary
    # time: an empty catalog (rows only), then two catalog sizes, each on a copy of the warmed shard that has
    # evaluated one boundary already (a restored copy's first step and new members' full tests are not steady state)

    def steady(catalog: Catalog, label: str) -> tuple[float, BatchStats]:
        copy = ShardEvaluator.from_snapshot(config, blob)
        _, _, after = run_boundaries(copy, feed, t, 1, catalog, f"first {label}")
        gc.collect()
        ms, stats, _ = run_boundaries(copy, feed, after, measured, catalog, f"measured {label}", time.process_time)
        return ms, stats

    empty_ms, _ = steady(Catalog.empty(), "rows only")
    row_us = empty_ms * 1000 / rows_per_boundary
    points = []
    for n in sizes:
        catalog = catalog_for(n, shard, seed=11)
        ms, stats = steady(catalog, f"{n:,}")
        b = max(stats.boundaries, 1)
        points.append((ms * 1000 - empty_ms * 1000, stats.changed_keys / b, stats.transitions / b,
                       len(group_subscriptions(catalog))))
    (t1, c1, x1, _), (t2, c2, x2, g2) = points
    # t = changes * change_us + transitions * transition_us, at both sizes (the same changed keys, more transitions)
    det = c1 * x2 - c2 * x1
    transition_us = max(0.0, (c1 * t2 - c2 * t1) / det) if det else 0.0
    change_us = max(0.0, (t1 - x1 * transition_us) / c1) if c1 else 0.0
    redis_bytes = len(catalog.encode()) / n
    return ShardCosts(row_us, change_us, transition_us, c2 / (rows_per_boundary * g2), pane_bytes, event_bytes,
                      subscription_bytes, redis_bytes, g2)


def measure_sink(work: Path, transitions: int, batches: int) -> tuple[float, float, float]:
    """µs per transition on the driver and in Redis, and Redis bytes per alert kept."""
    port = free_port()
    server = start_redis(port, work / "redis", work / "redis.log")
    try:
        settings = Settings(redis_url=f"redis://127.0.0.1:{port}/0", redis_prefix="capacity-sink",
                            sink_batch_transitions=None)  # every transition stored by its batch: no handoff
        sink = RedisAlertSink(settings)
        client = redis.Redis.from_url(settings.redis_url)
        frames = [batch_frame(transitions, 10_000, 5_000, b) for b in range(batches + 1)]
        sink(cast("DataFrame", Frame(frames[0])), 0)  # the script loaded, connections open
        alerts = RedisKeys(settings).alerts_stream
        stored, memory, server_cpu = client.xlen(alerts), client.info("memory")["used_memory"], _server_cpu(client)
        started = time.process_time()
        for b, frame in enumerate(frames[1:], start=1):
            sink(cast("DataFrame", Frame(frame)), b)
        driver_s = time.process_time() - started
        n = client.xlen(alerts) - stored  # distinct alerts (random draws may repeat a pair)
        assert 0.95 * transitions * batches <= n <= transitions * batches, n
        return driver_s * 1e6 / n, (_server_cpu(client) - server_cpu) * 1e6 / n, \
            (client.info("memory")["used_memory"] - memory) / n
    finally:
        server.stop()


def _server_cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def measure(quick: bool = False) -> Costs:
    threads = pa.cpu_count()
    pa.set_cpu_count(1)  # like one Spark task
    try:
        return _measure(quick)
    finally:
        pa.set_cpu_count(threads)


def _measure(quick: bool) -> Costs:
    work = Path(tempfile.mkdtemp(prefix="tocsin-bench-capacity-"))
    print("parse ...", file=sys.stderr, flush=True)
    parse_us, wire_bytes = measure_parse(10_000 if quick else 100_000)
    print("read ...", file=sys.stderr, flush=True)
    read_us = measure_read(work, 20_000 if quick else 200_000)
    print("shard ...", file=sys.stderr, flush=True)
    shard = measure_shard((100, 1_000), 30, 3, 1_000) if quick else measure_shard((1_000, 10_000), 300, 10, 5_000)
    print("sink ...", file=sys.stderr, flush=True)
    sink_us, redis_us, alert_bytes = measure_sink(work, 200 if quick else 20_000, 2 if quick else 3)
    return Costs(read_us, parse_us, SPARK_US, BATCH_S, shard.row_us, shard.change_us, shard.transition_us,
                 shard.changes_per_row, sink_us, redis_us, DELIVERY_MS, shard.pane_bytes, shard.event_bytes,
                 shard.subscription_bytes, shard.subscription_redis_bytes, alert_bytes, wire_bytes)


SOURCES = {
    "spark_us": "pipeline benchmark (docs/benchmarks.md), not re-measured here",
    "batch_s": "pipeline benchmark (docs/benchmarks.md), not re-measured here",
    "delivery_ms": "notifier benchmark (docs/benchmarks.md), not re-measured here",
}


def cost_rows(costs: Costs) -> list[list[object]]:
    return [[name, value, SOURCES.get(name, "measured in this run")] for name, value in asdict(costs).items()]


def prediction_rows(costs: Costs, loads: tuple[Load, ...] = LOADS) -> tuple[list[str], list[list[object]]]:
    predictions = [predict(costs, load) for load in loads]
    header = ["", *(load.name for load in loads)]
    rows: list[list[object]] = [
        ["events/s", *(f"{load.events_per_s:,.0f}" for load in loads)],
        ["subscriptions", *(f"{load.subscriptions:,}" for load in loads)],
        ["keys", *(f"{load.keys:,}" for load in loads)],
        ["alerts/s", *(f"{load.events_per_s * load.alerts_per_event:,.0f}" for load in loads)],
    ]
    rows += [[what, *(p[what] for p in predictions)] for what in predictions[0]]
    return header, rows


def tables(costs: Costs) -> list[tuple[str, list[str], list[list[object]]]]:
    """The costs and the prediction, as (title, header, rows) for ``benchmarks.report``."""
    header, rows = prediction_rows(costs)
    return [("Per-core costs (µs of one core; bytes)", ["cost", "value", "source"], cost_rows(costs)),
            (f"Capacity model: what each load needs (cores at {UTILISATION:.0%}, one shard and one Kafka partition "
             "per executor core)", header, rows)]


def main() -> None:
    parser = cli.parser(__doc__, "python -m benchmarks.capacity")
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    add_markdown_option(parser)
    args = parser.parse_args()
    print_tables(tables(measure(args.quick)))


if __name__ == "__main__":
    with markdown_run():
        main()
