"""The fixed cost of a query per stream (docs/evaluator-streams.md, "Cost of a query per stream").

    flock /tmp/tocsin-spark.lock python benchmarks/stream_cost.py              # about 5 minutes on two cores
    flock /tmp/tocsin-spark.lock python benchmarks/stream_cost.py --markdown docs/benchmarks.md   # ... and the run into its section there
    python benchmarks/stream_cost.py --quick                                   # smoke run

Real components, as in ``benchmarks/pipeline.py``: a Tansu broker and a Redis server of its own, one
local[2] SparkSession. The trades query (``evaluator.spark.job.build_query``) runs at the production
trigger (``--trigger``, 1 s) over a live feed (``--rate`` events/s, event time = now, heartbeats every
200 ms; the per-symbol alert mix of ``--subscriptions``). Beside it, ``--streams`` idle declared streams
(one attribute, no subscriptions, the trades topic's partitions) whose topics get only heartbeats, every
200 ms per partition, from the start: the feed's work is the same in every phase. The idle streams are
declared in the stream registry (``subscriptions.streams.publish_registry``) and their queries started
and stopped by the evaluator's stream supervisor, as in production.

Three phases, each ``--warm-up`` seconds then ``--seconds`` measured: the trades query alone, with the
idle streams' queries beside it, alone again (the idle queries stopped: the drift between the two
"alone" phases is the measurement's noise). Measured: CPU seconds of the whole process tree (driver,
JVM, Python workers, Tansu, Redis, the feed processes) per wall second, split by process, and each
query's batches per second from Spark's progress. The cost of an idle query = (CPU/s with them - the
mean CPU/s alone) / streams, per trigger = that / the idle queries' batches per second. Numbers are
printed, never asserted.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from pathlib import Path

import psutil
import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.pipeline import (
    HEARTBEAT_MS,
    Resources,
    Sender,
    alert_subscriptions,
    create_event_topic,
    install_catalog,
    key_names,
    live_feed,
    start_stack,
)
from benchmarks.progress import batch_end_s
from benchmarks.report import add_markdown_option, markdown_run, print_tables
from core import cli
from core.redis_schema import RedisKeys
from core.streams import Attribute, StreamSchema, topic_name
from evaluator.spark.job import build_query
from evaluator.spark.registry import RegistryReader
from evaluator.spark.session import spark_session, stop_session
from evaluator.spark.supervisor import StreamSupervisor
from ingest.kafka import ensure_topics
from subscriptions.streams import publish_registry

ROLES = ("JVM", "Python workers", "driver", "Tansu + Redis", "feed", "exited")
START_TIMEOUT_S = 180
SETTLE_SLACK_S = 30  # beyond the stop timeout: a start, and the poll that finds a stopping query between batches
SETTLE_POLL_S = 0.2


def heartbeat_feed(bootstrap: str, topics: list[str], stop) -> None:
    """Heartbeats with event time = now on every partition of ``topics`` every ``HEARTBEAT_MS`` (own process)."""
    senders = [Sender(bootstrap, topic) for topic in topics]
    next_beat = time.time()
    while not stop.is_set():
        now = time.time()
        if now >= next_beat:
            for sender in senders:
                sender.heartbeat(int(now * 1000))
                sender.producer.poll(0)
            next_beat += HEARTBEAT_MS / 1000
        time.sleep(max(0.0, min(next_beat - time.time(), 0.05)))
    for sender in senders:
        sender.flush()


def role(process: psutil.Process) -> str:
    """Which part of the tree a process is."""
    if process.pid == os.getpid():
        return "driver"
    name, command = process.name(), " ".join(process.cmdline())
    if name == "java":
        return "JVM"
    if "tansu" in command or "redis-server" in name:
        return "Tansu + Redis"
    if "pyspark" in command or any(p.name() == "java" for p in process.parents()):
        return "Python workers"
    return "feed"


def idle_schema(i: int, partitions: int) -> StreamSchema:
    return StreamSchema(name=f"idle{i}", attributes=(Attribute(name="x"),), retention_ms=86_400_000,
                        partitions=partitions)


def wait_started(queries: dict) -> None:
    """Until every query has completed its first batch (start-up is not what is measured)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while any(q.lastProgress is None for q in queries.values()):
        for name, q in queries.items():
            if (failed := q.exception()) is not None:
                raise RuntimeError(f"query {name} failed") from failed
        if time.monotonic() > deadline:
            raise RuntimeError(f"no first batch within {START_TIMEOUT_S} s: {sorted(queries)}")
        time.sleep(0.5)


def phase(name: str, queries: dict, warm_up_s: float, seconds: float) -> dict:
    """Warm up, then measure the tree's CPU and each query's batches for ``seconds``."""
    print(f"{name}: {len(queries) - 1} idle stream queries ...", file=sys.stderr, flush=True)
    wait_started(queries)
    time.sleep(warm_up_s)
    seen: dict[str, dict[int, dict]] = {q: {} for q in queries}
    begin = time.time()

    def within(p: dict, end: float) -> bool:
        started = batch_end_s(p) - p["durationMs"].get("triggerExecution", 0) / 1000
        return begin <= started and batch_end_s(p) <= end

    def every_query_measured() -> bool:
        now = time.time()
        return all(any(within(p, now) for p in by_id.values()) for by_id in seen.values())

    # ``seconds``, and on a slow machine longer (up to 10x) until a whole batch of every query lies within them:
    # a phase that measured none would report no batch cost at all
    with Resources() as used:
        while (elapsed := time.time() - begin) < seconds or (elapsed < seconds * 10 and not every_query_measured()):
            time.sleep(min(5.0, max(0.5, seconds - elapsed)))
            for q, query in queries.items():
                if (failed := query.exception()) is not None:
                    raise RuntimeError(f"query {q} failed") from failed
                seen[q] |= {p["batchId"]: p for p in query.recentProgress}
    end = time.time()
    for q, query in queries.items():
        seen[q] |= {p["batchId"]: p for p in query.recentProgress}

    batches = {q: [p for p in by_id.values() if within(p, end)] for q, by_id in seen.items()}
    wall = end - begin
    idle = [b for q, b in batches.items() if q != "trades"]
    idle_batches = sum(len(b) for b in idle)
    trades = batches["trades"]
    return {
        "name": name, "streams": len(queries) - 1, "wall_s": wall, "cpu_per_s": used.cpu_s / wall,
        "by_role": {r: s / wall for r, s in used.cpu_s_by(role).items()},
        "trades_batches_per_s": len(trades) / wall,
        "trades_batch_ms": _mean_ms(trades), "trades_records_per_s": sum(p["numInputRows"] for p in trades) / wall,
        "idle_batches_per_s": idle_batches / wall, "idle_batch_ms": _mean_ms([p for b in idle for p in b]),
    }


def settle(supervisor: StreamSupervisor, declared: set[str], timeout_s: float) -> None:
    """Poll the supervisor until exactly the ``declared`` streams have queries: it starts them at once, but stops
    an undeclared stream's query only between two of its batches, at a later poll."""
    deadline = time.monotonic() + timeout_s
    while True:
        supervisor.poll()
        running = set(supervisor.queries())
        if running == declared:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"stream queries {sorted(running)} after {timeout_s:g} s, declared {sorted(declared)}: "
                               "see stream_query_not_started and stream_query_stopped in the log")
        time.sleep(SETTLE_POLL_S)


def _mean_ms(progress: list[dict]) -> float:
    if not progress:
        return float("nan")
    return sum(p["durationMs"].get("triggerExecution", 0) for p in progress) / len(progress)


def main() -> None:
    parser = cli.parser(__doc__, "python -m benchmarks.stream_cost")
    parser.add_argument("--quick", action="store_true", help="small sizes, short phases (a smoke run)")
    add_markdown_option(parser)
    parser.add_argument("--streams", type=int, default=3, help="idle stream queries beside trades (k)")
    parser.add_argument("--trigger", type=float, default=1.0, help="trigger (s) of every query")
    parser.add_argument("--rate", type=int, default=1_000, help="trades events per second (live feed)")
    parser.add_argument("--keys", type=int, default=5_000)
    parser.add_argument("--subscriptions", type=int, default=1_000, help="per-symbol alerts on trades")
    parser.add_argument("--warm-up", type=float, default=20.0, help="seconds before each phase is measured")
    parser.add_argument("--seconds", type=float, default=60.0, help="seconds measured per phase")
    args = parser.parse_args()
    if args.quick:
        args.streams, args.rate, args.keys, args.subscriptions, args.warm_up, args.seconds = 1, 100, 200, 100, 5, 10

    load_before = psutil.getloadavg()
    begun = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    _, base, stop_stack = start_stack("cost")
    settings = base.model_copy(update={
        "trigger_interval": f"{args.trigger:g} seconds", "watermark_delay_ms": 500,
        "stream_topic_prefix": "cost-stream-", "redis_prefix": "cost",
    })
    create_event_topic(settings, settings.events_topic)
    schemas = [idle_schema(i, settings.event_partitions) for i in range(args.streams)]
    ensure_topics(settings, {topic_name(s.name, settings): s.partitions for s in schemas})
    keys = key_names(args.keys)
    install_catalog(settings, alert_subscriptions(args.subscriptions, keys, args.rate or 1_000))
    client = redis.Redis.from_url(settings.redis_url)
    registry = RedisKeys(settings)
    publish_registry(client, registry, [])

    context = multiprocessing.get_context("spawn")  # not forks of a process holding a JVM gateway
    stop = context.Event()
    feeds = [context.Process(target=live_feed, args=(settings.kafka_bootstrap, settings.events_topic, args.keys,
                                                     args.rate, stop), daemon=True),
             context.Process(target=heartbeat_feed, args=(settings.kafka_bootstrap,
                                                         [topic_name(s.name, settings) for s in schemas], stop),
                             daemon=True)]
    spark = supervisor = None
    phases = []
    try:
        spark = spark_session(settings, "tocsin-stream-cost")
        trades = build_query(spark, settings)
        supervisor = StreamSupervisor(spark, settings, RegistryReader(client, registry, settings), build_query)
        for feed in feeds:
            feed.start()
        for name, declared in (("trades alone", []), (f"with {args.streams} idle streams", schemas),
                               ("trades alone again", [])):
            publish_registry(client, registry, declared)
            settle(supervisor, {s.name for s in declared}, settings.evaluator_stop_timeout_s + SETTLE_SLACK_S)
            phases.append(phase(name, {"trades": trades, **supervisor.queries()}, args.warm_up, args.seconds))
    finally:
        stop.set()
        for feed in feeds:
            feed.join(30)
        if supervisor is not None:
            supervisor.stop_all()
        if spark is not None:
            stop_session(spark)
        stop_stack()
    load_after = psutil.getloadavg()
    report(args, phases, begun, load_before, load_after)


def report(args, phases: list[dict], begun: str, load_before, load_after) -> None:
    alone = [p for p in phases if p["streams"] == 0]
    beside = [p for p in phases if p["streams"]]
    tables = [(
        f"CPU of the process tree per wall second (cores busy), trigger {args.trigger:g} s, trades fed "
        f"{args.rate:,} events/s with {args.subscriptions:,} per-symbol alerts, idle streams fed heartbeats only "
        f"(every {HEARTBEAT_MS} ms per partition), {args.seconds:g} s measured after {args.warm_up:g} s; "
        "tree CPU ms per batch = tree CPU / every query's batches (the feed, Tansu and Redis included)",
        ["phase", "idle stream queries", "tree CPU s/s", *(f"{r} s/s" for r in ROLES), "trades batches/s",
         "trades batch ms", "trades records/s", "idle batches/s (all)", "idle batch ms", "tree CPU ms per batch"],
        [[p["name"], p["streams"], p["cpu_per_s"], *(p["by_role"].get(r, 0.0) for r in ROLES),
          p["trades_batches_per_s"], p["trades_batch_ms"], p["trades_records_per_s"], p["idle_batches_per_s"],
          p["idle_batch_ms"], 1000 * p["cpu_per_s"] / (p["trades_batches_per_s"] + p["idle_batches_per_s"])
          if p["trades_batches_per_s"] + p["idle_batches_per_s"] else float("nan")] for p in phases],
    )]
    base = _mean(alone, "cpu_per_s")
    drift = max(p["cpu_per_s"] for p in alone) - min(p["cpu_per_s"] for p in alone)
    rows = []
    for p in beside:
        k = p["streams"]
        extra = p["cpu_per_s"] - base
        per_trigger = extra / p["idle_batches_per_s"] if p["idle_batches_per_s"] else float("nan")
        more_batches = p["idle_batches_per_s"] + p["trades_batches_per_s"] - _mean(alone, "trades_batches_per_s")
        rows.append([f"{k} idle streams", k, 100 * extra / k, 100 * drift / k, p["idle_batches_per_s"] / k,
                     1000 * per_trigger, *([1000 * extra / more_batches, 1000 * drift / abs(more_batches)]
                                           if more_batches else [float("nan")] * 2),
                     *(100 * (p["by_role"].get(r, 0.0) - _mean(alone, r)) / k for r in ROLES[:3])])
    tables.append((
        "Cost of one idle stream query: extra = tree CPU/s with the idle queries - the mean of the two 'alone' phases; "
        "per query = extra / k; noise = the 'alone' phases' difference / k; per trigger = extra / the idle queries' "
        "batches; per extra batch = extra / (the idle queries' batches + the change in trades' batches: when the "
        "cores cannot hold the trigger, trades runs fewer, larger batches beside the idle queries, and this is the "
        "marginal CPU of a batch of any query; its noise = the 'alone' phases' difference / that change in batches)",
        ["beside trades", "k", "CPU % of a core per query", "noise ± % per query", "batches/s per query",
         "CPU ms per query per trigger", "CPU ms per extra batch", "noise ± ms", *(f"of which {r} %" for r in ROLES[:3])],
        rows,
    ))
    load = f"load average {load_before[0]:.1f} at the start, {load_after[0]:.1f} at the end"
    print(f"\nRun of {begun}, {psutil.cpu_count()} cores, {load}")
    print_tables(tables)


def _mean(phases: list[dict], field: str) -> float:
    """The mean of a phase's number, or of a role's CPU/s, over ``phases``."""
    return sum(p[field] if field in p else p["by_role"].get(field, 0.0) for p in phases) / len(phases)


if __name__ == "__main__":
    with markdown_run():
        main()
