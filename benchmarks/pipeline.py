"""The whole evaluator pipeline on this machine: Kafka -> Spark -> shard operator -> Redis.

    python benchmarks/pipeline.py            # 5,000 keys; 1k / 10k / 100k subscriptions; collective vs naive
    python benchmarks/pipeline.py --quick    # smoke run

Real components: a Tansu broker and a Redis server of its own, one local[2]
SparkSession running the production query (``evaluator.spark.job.build_query``).

- *Throughput*: a stream of ``--rate`` events per event-second over ``--keys`` keys
  (Zipf popularity) is published once, pre-serialised and in large producer
  batches (the publish rate is printed); each configuration runs its own query
  over it (own checkpoint and Redis prefix), one event-second per micro-batch, as
  fast as it can. events/s = rows processed after the warm-up (the first three
  event-seconds: start-up, and the first evaluations where every match fires at
  once) over the wall time of the batches that processed them, from Spark's
  progress (``benchmarks/progress.py``), never from the event clock, which the
  final heartbeat would jump to the end. ``--budget`` wall seconds after the
  warm-up, then the row says "budget".
- *Peers* (``benchmarks/peers.py``), on the same topic, data and thresholds
  (``--peer-subscriptions``): Spark's built-in ``window()`` + a threshold join at
  each ``--spark-windows`` length, and a single-process quixstreams hopping-window
  job at each ``--quix-windows`` length (run before Spark starts), measured the
  same way; one ratio table.
- *Latency*: events produced live at ``--live-rate`` per second (event time = now)
  with 10k subscriptions; for every alert, the time from the moment its window
  became complete in the log (window end + allowed delay) to its arrival in the
  Redis stream.
- *Where time goes*: Spark's per-trigger durations and the shard operator's own
  stages (restoring the shard, ingesting + evaluating, persisting the change log).

Collective and naive evaluation and the peers run in the same process on the same
data; the naive baseline evaluates every subscription on every key at every pane boundary.
Numbers are printed, never asserted.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import redis
from kafka.admin import KafkaAdminClient, NewTopic
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.peers import quixstreams_peer, spark_window_peer, thresholds
from benchmarks.progress import drain
from benchmarks.report import percentiles, table
from core.redis_replies import text_entries
from core.redis_schema import RedisKeys
from core.settings import Settings
from devstack.services import free_port, start_redis, start_tansu
from evaluator.catalog import Catalog
from evaluator.spark.job import build_query
from evaluator.spark.session import spark_session
from evaluator.spec import Aggregate, Condition, SubscriptionSpec
from ingest.kafka import ensure_topics
from ingest.model import Event, Heartbeat
from ingest.publisher import EventPublisher
from subscriptions.service import publish_catalog

SECOND = 1_000
WINDOWS = (60 * SECOND, 300 * SECOND, 900 * SECOND, 3_600 * SECOND)  # 1 min to 1 h


def key_names(n: int) -> list[str]:
    return [f"S{i:05d}" for i in range(n)]


def stream(keys: list[str], rate: int, seconds: int, start_ms: int, seed: int = 5):
    """(key, ts, price, volume), time ordered per key, ``rate`` per event-second, Zipf-popular keys."""
    rng = random.Random(seed)
    weights = [1 / (i + 1) ** 0.8 for i in range(len(keys))]
    cumulative, total = [], 0.0
    for w in weights:
        total += w
        cumulative.append(total)
    prices = price_levels(keys)
    for second in range(seconds):
        for n in range(rate):
            key = keys[bisect.bisect_left(cumulative, rng.random() * total)]
            prices[key] = max(1.0, prices[key] * (1 + rng.gauss(0, 0.0005)))
            yield key, start_ms + second * SECOND + n * SECOND // rate, round(prices[key] * 4) / 4, float(
                int(rng.lognormvariate(4, 1)) + 1)


def price_levels(keys: list[str]) -> dict[str, float]:
    """Each symbol trades around its own level, log-uniform between 5 and 1,000."""
    rng = random.Random(13)
    return {k: round(5 * 200 ** rng.random(), 2) for k in keys}


INDEXED = [Aggregate.COUNT, Aggregate.SUM, Aggregate.AVG, Aggregate.MAX, Aggregate.MIN]


def subscriptions(n: int, keys: list[str], rate: int, seed: int = 9) -> tuple[SubscriptionSpec, ...]:
    """A mix over the aggregates of the paper's indexes, four windows and thresholds most keys do not reach."""
    rng = random.Random(seed)
    per_key_per_s = rate / len(keys)
    specs = []
    for i in range(n):
        window = rng.choice(WINDOWS)
        aggregate = rng.choice(INDEXED)
        expected_count = per_key_per_s * window / SECOND
        if aggregate is Aggregate.COUNT:
            condition = Condition(aggregate, None, window, low=float(int(expected_count * rng.uniform(5, 40)) + 1))
        elif aggregate is Aggregate.SUM:
            condition = Condition(aggregate, "volume", window, low=expected_count * 90 * rng.uniform(8, 60))
        elif aggregate is Aggregate.AVG:
            condition = Condition(aggregate, "price", window, low=5 * 200 ** rng.uniform(0.97, 1.0))
        elif aggregate is Aggregate.MAX:
            condition = Condition(aggregate, "price", window, low=5 * 200 ** rng.uniform(0.97, 1.02))
        else:
            condition = Condition(aggregate, "price", window, high=5 * 200 ** rng.uniform(-0.02, 0.03))
        watched = frozenset(rng.sample(keys, rng.randint(1, 5))) if rng.random() < 0.2 else None
        specs.append(SubscriptionSpec(i + 1, condition, watched))
    return tuple(specs)


def event_value(key: str, ts: int, price: float, volume: float) -> bytes:
    """The JSON ``Event.to_json`` writes, without building a model per event (checked in :func:`publish`)."""
    return f'{{"key":"{key}","ts":{ts},"price":{price!r},"volume":{volume!r}}}'.encode()


def publish(settings: Settings, events: list[tuple], heartbeat_every_ms: int = 500) -> tuple[int, float]:
    """Publish pre-serialised events through librdkafka in large batches, partitioned as ``EventPublisher`` does.

    ``murmur2_random`` is the Java (and kafka-python) key hash, so a key lands on the partition the production
    publisher would choose. Heartbeats go to every partition every ``heartbeat_every_ms`` of event time, and a
    last one 30 s past the stream so every window closes. Returns (records written, wall seconds).
    """
    from confluent_kafka import Producer  # comes with quixstreams (the dev extra)

    key, ts, price, volume = events[0]
    assert event_value(key, ts, price, volume) == Event(key=key, ts=ts, price=price, volume=volume).to_json()
    producer = Producer({
        "bootstrap.servers": settings.kafka_bootstrap, "acks": 1, "linger.ms": 50, "batch.size": 1_000_000,
        "queue.buffering.max.messages": 1_000_000, "queue.buffering.max.kbytes": 1 << 20,
        "partitioner": "murmur2_random",
    })
    topic = settings.events_topic
    partitions = sorted(producer.list_topics(topic, timeout=10).topics[topic].partitions)

    def send(value: bytes, key: bytes | None = None, partition: int = -1) -> None:
        while True:
            try:
                producer.produce(topic, value, key, partition)
                return
            except BufferError:  # the local queue is full: let librdkafka send some
                producer.poll(0.05)

    def heartbeat(at: int) -> int:
        for partition in partitions:
            send(Heartbeat(partition=partition, ts=at).to_json(), partition=partition)
        return len(partitions)

    records = 0
    started = time.monotonic()
    next_beat = events[0][1] + heartbeat_every_ms
    for key, ts, price, volume in events:
        if ts >= next_beat:
            records += heartbeat(next_beat)
            next_beat += heartbeat_every_ms
        send(event_value(key, ts, price, volume), key.encode())
        records += 1
    records += heartbeat(events[-1][1] + 30 * SECOND)
    if producer.flush(60):
        raise RuntimeError("records left unsent after 60 s")
    return records, time.monotonic() - started


def create_event_topic(settings: Settings) -> None:
    """The event topic with an explicit retention: quixstreams derives its changelog topics' config from it.

    Tansu's DescribeConfigs reports no ``retention.ms`` for a topic created without one, and quixstreams
    3.28 then fails with ``KeyError: 'retention.ms'`` (``TopicManager.derive_topic_config``).
    """
    admin = KafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    try:
        admin.create_topics([NewTopic(settings.events_topic, settings.event_partitions, 1,
                                      topic_configs={"retention.ms": "-1", "retention.bytes": "-1"})])
    finally:
        admin.close()
    ensure_topics(settings)  # the dead-letter topic


def install_catalog(settings: Settings, specs: tuple[SubscriptionSpec, ...]) -> None:
    publish_catalog(redis.Redis.from_url(settings.redis_url), RedisKeys(settings), Catalog(1, specs))


def tree_rss_mb() -> float:
    me = psutil.Process()
    total = 0
    for p in [me, *me.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):  # a child that just exited
            total += p.memory_info().rss
    return total / 2**20


def throughput_run(spark, base: Settings, tag: str, specs, rate: int, total_rows: int, warm_up_rows: int,
                   budget_s: float, mode: str) -> dict:
    settings = base.model_copy(update={
        "redis_prefix": f"bench-{tag}", "checkpoint_dir": base.data_dir / f"checkpoint-{tag}", "evaluator_mode": mode,
        "source_max_records_per_trigger": rate, "trigger_interval": "0 seconds",
    })
    install_catalog(settings, specs)
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    stats_key = RedisKeys(settings).evaluator_stats
    print(f"{mode} {len(specs):,} subscriptions ...", file=sys.stderr, flush=True)
    throughput, progress = drain(build_query(spark, settings), total_rows, warm_up_rows, budget_s)
    stats = client.hgetall(stats_key)
    boundaries = max(float(stats.get("boundaries", 0)), 1.0)
    shard_batches = max(float(stats.get("shard_batches", 0)), 1.0)
    batches = max(len(progress), 1)
    return {
        "rate": throughput.rate,
        "events": throughput.rows,
        "finished": throughput.finished,
        "batches": len(progress),
        "batch_ms": sum(p["durationMs"].get("triggerExecution", 0) for p in progress) / batches,
        "add_batch_ms": sum(p["durationMs"].get("addBatch", 0) for p in progress) / batches,
        "restore_ms": float(stats.get("restore_ms_total", 0)) / shard_batches,
        "evaluate_ms": float(stats.get("evaluate_ms_total", 0)) / shard_batches,
        "persist_ms": float(stats.get("persist_ms_total", 0)) / shard_batches,
        "sink_ms": float(stats.get("sink_ms_total", 0)) / batches,
        "transitions": float(stats.get("transitions", 0)) / batches,
        "candidates": float(stats.get("candidates", 0)) / boundaries,
        "matches": float(stats.get("matches", 0)) / boundaries,
        "rss_mb": tree_rss_mb(),
    }


def latency_run(spark, base: Settings, specs, keys: list[str], live_rate: int, seconds: int,
                trigger_s: int) -> list[float]:
    settings = base.model_copy(update={
        "redis_prefix": f"bench-live-{trigger_s}", "checkpoint_dir": base.data_dir / f"checkpoint-live-{trigger_s}",
        "events_topic": f"bench-live-{trigger_s}", "dead_letter_topic": f"bench-live-dead-{trigger_s}",
        "watermark_delay_ms": 500, "trigger_interval": f"{trigger_s} seconds",
    })
    ensure_topics(settings)
    install_catalog(settings, specs)
    query = build_query(spark, settings)
    stop = threading.Event()

    def produce() -> None:
        rng = random.Random(1)
        prices = price_levels(keys)
        with EventPublisher(settings) as publisher:
            next_beat = time.time()
            while not stop.is_set():
                tick = time.time()
                for _ in range(max(1, live_rate // 10)):
                    key = keys[min(int(rng.paretovariate(1.2)) - 1, len(keys) - 1)]
                    prices[key] = max(1.0, prices[key] * (1 + rng.gauss(0, 0.0005)))
                    publisher.publish(Event(key=key, ts=int(time.time() * 1000), price=round(prices[key] * 4) / 4,
                                            volume=float(int(rng.lognormvariate(4, 1)) + 1)))
                if time.time() >= next_beat:
                    publisher.heartbeat(int(time.time() * 1000))
                    next_beat += 0.2
                time.sleep(max(0.0, 0.1 - (time.time() - tick)))

    producer = threading.Thread(target=produce, daemon=True)
    begin = time.time()
    producer.start()
    try:
        for _ in tqdm(range(seconds), desc="live", unit="s", leave=False):
            time.sleep(1)
            if (failed := query.exception()) is not None:
                raise failed
    finally:
        stop.set()
        producer.join()
        query.stop()
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    latencies = []
    warm = begin + min(15, seconds / 2)  # leave out the first seconds: JIT, first batches
    for entry_id, fields in text_entries(client.xrange(RedisKeys(settings).alerts_stream)):
        written = int(entry_id.split("-")[0]) / 1000
        alert = json.loads(fields["alert"])
        decidable = (alert["window_end"] + settings.watermark_delay_ms) / 1000
        if decidable >= warm:
            latencies.append(written - decidable)
    return latencies


def peer_rows(spark, base: Settings, specs, args, total_rows: int, warm_up_rows: int) -> list[tuple[str, float, float]]:
    """(name, events/s, RSS MB) of the Spark ``window()`` peer at each window length."""
    limits = thresholds(specs)
    rows = []
    for seconds in [int(x) for x in args.spark_windows.split(",") if x]:
        print(f"Spark window() {seconds} s ...", file=sys.stderr, flush=True)
        throughput, alerts, progress = spark_window_peer(
            spark, bootstrap=base.kafka_bootstrap, topic=base.events_topic, rows=limits,
            window_ms=seconds * SECOND, delay_ms=base.watermark_delay_ms, rows_per_batch=args.rate,
            checkpoint=base.data_dir / f"checkpoint-spark-window-{seconds}", total_rows=total_rows,
            warm_up_rows=warm_up_rows, budget_s=args.budget,
        )
        batch_ms = sum(p["durationMs"].get("triggerExecution", 0) for p in progress) / max(len(progress), 1)
        print(f"  {throughput} alerts={alerts} batch_ms={batch_ms:.0f}", file=sys.stderr, flush=True)
        rows.append((f"Spark window() {window_label(seconds)}", throughput.rate, tree_rss_mb()))
    return rows


def quix_rows(base: Settings, specs, args, total_rows: int, warm_up_rows: int) -> list[tuple[str, float, float]]:
    """(name, events/s, RSS MB) of the quixstreams peer at each window length; run before Spark starts."""
    limits = thresholds(specs)
    rows = []
    for seconds in [int(x) for x in args.quix_windows.split(",") if x]:
        print(f"quixstreams {seconds} s ...", file=sys.stderr, flush=True)
        throughput, alerts = quixstreams_peer(
            bootstrap=base.kafka_bootstrap, topic=base.events_topic, rows=limits, window_ms=seconds * SECOND,
            state_dir=base.data_dir / f"quix-{seconds}", total_rows=total_rows, warm_up_rows=warm_up_rows,
            budget_s=args.budget,
        )
        print(f"  {throughput} alerts={alerts}", file=sys.stderr, flush=True)
        rows.append((f"quixstreams {window_label(seconds)}", throughput.rate, tree_rss_mb()))
    return rows


def window_label(seconds: int) -> str:
    return f"{seconds // 60} min" if seconds % 60 == 0 else f"{seconds} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes and budgets (a smoke run)")
    parser.add_argument("--keys", type=int, default=5_000)
    parser.add_argument("--rate", type=int, default=5_000, help="events per event-second (and per micro-batch)")
    parser.add_argument("--seconds", type=int, default=40, help="event-seconds in the stream")
    parser.add_argument("--subscriptions", default="1000,10000,100000")
    parser.add_argument("--naive-up-to", type=int, default=10_000, help="largest subscription count run naively")
    parser.add_argument("--peer-subscriptions", type=int, default=10_000,
                        help="the subscription count the peers check (one of --subscriptions)")
    parser.add_argument("--spark-windows", default="60,300", help="window lengths (s) of the Spark window() peer")
    parser.add_argument("--quix-windows", default="60", help="window lengths (s) of the quixstreams peer")
    parser.add_argument("--budget", type=float, default=150.0, help="wall seconds per configuration after warm-up")
    parser.add_argument("--live-rate", type=int, default=1_000)
    parser.add_argument("--live-seconds", type=int, default=60)
    parser.add_argument("--triggers", default="1,2", help="trigger intervals (s) of the live runs")
    args = parser.parse_args()
    if args.quick:
        args.keys, args.rate, args.seconds, args.subscriptions = 200, 200, 4, "300"
        args.budget, args.live_rate, args.live_seconds, args.triggers = 30.0, 100, 20, "1"
        args.peer_subscriptions, args.spark_windows = 300, "60"

    work = Path(tempfile.mkdtemp(prefix="tocsin-bench-pipeline-"))
    kafka_port, redis_port = free_port(), free_port()
    broker = start_tansu("127.0.0.1", kafka_port, work / "tansu.log")
    redis_server = start_redis(redis_port, work / "redis", work / "redis.log")
    base = Settings(
        kafka_bootstrap=f"127.0.0.1:{kafka_port}", redis_url=f"redis://127.0.0.1:{redis_port}/0",
        events_topic="bench-events", dead_letter_topic="bench-dead", event_partitions=4,
        data_dir=work, spark_shuffle_partitions=2, metrics_port_evaluator=0, max_window_ms=max(WINDOWS),
    )
    keys = key_names(args.keys)
    start_ms = (int(time.time() * 1000) // 3_600_000 - 24) * 3_600_000  # in the past: never ahead of the clock
    events = list(stream(keys, args.rate, args.seconds, start_ms))
    create_event_topic(base)
    total_rows, publish_s = publish(base, events)
    print(f"published {total_rows:,} records in {publish_s:.1f} s: {total_rows / publish_s:,.0f} records/s",
          flush=True)
    warm_up_rows = min(3 * args.rate, total_rows // 2)  # start-up, and the first evaluations where every match fires
    peer_specs = subscriptions(args.peer_subscriptions, keys, args.rate)
    peers: list[tuple[str, float, float]] = []
    spark = None
    rows, naive_rates, tocsin = [], {}, []
    try:
        peers += quix_rows(base, peer_specs, args, total_rows, warm_up_rows)
        spark = spark_session(base, "tocsin-benchmark")
        for n in [int(x) for x in args.subscriptions.split(",")]:
            specs = subscriptions(n, keys, args.rate)
            modes = ["naive", "collective"] if n <= args.naive_up_to else ["collective"]
            for mode in modes:
                r = throughput_run(spark, base, f"{mode}-{n}", specs, args.rate, total_rows, warm_up_rows,
                                   args.budget, mode)
                if mode == "naive":
                    naive_rates[n] = r["rate"]
                if n == args.peer_subscriptions:
                    tocsin.append((f"Tocsin {mode}", r["rate"], r["rss_mb"]))
                ratio = r["rate"] / naive_rates[n] if n in naive_rates else float("nan")
                rows.append([f"{n:,}", mode, r["rate"], r["events"], "yes" if r["finished"] else "budget",
                             r["batch_ms"], r["add_batch_ms"], r["restore_ms"], r["evaluate_ms"], r["persist_ms"],
                             r["sink_ms"], r["transitions"], r["candidates"], r["matches"], r["rss_mb"], ratio])
        peers = peer_rows(spark, base, peer_specs, args, total_rows, warm_up_rows) + peers
        live_specs = subscriptions(10_000 if not args.quick else 300, keys, args.live_rate)
        latencies = {t: latency_run(spark, base, live_specs, keys, args.live_rate, args.live_seconds, t)
                     for t in [int(x) for x in args.triggers.split(",")]}
    finally:
        if spark is not None:
            spark.stop()
        broker.stop()
        redis_server.stop()

    print(f"\nPublished {total_rows:,} records (events and heartbeats) in {publish_s:.1f} s: "
          f"{total_rows / publish_s:,.0f} records/s (pre-serialised, librdkafka batches)")
    table(
        f"Sustained throughput, {args.keys:,} keys, {args.rate:,} events per event-second, one event-second per "
        "micro-batch, local[2]; events/s = rows processed after the warm-up / wall time of their batches "
        "(per-batch and per-shard-batch means, ms)",
        ["subscriptions", "evaluation", "events/s", "events done", "finished", "batch ms", "addBatch ms",
         "restore ms", "evaluate ms", "persist ms", "sink ms", "transitions/batch", "candidates/boundary",
         "matches/boundary", "RSS MB", "vs naive"],
        rows,
    )
    table(
        f"Peers: {args.peer_subscriptions:,} subscriptions' thresholds, the same topic and data, rows processed "
        "per wall second (RSS: the process tree when the row ended; Spark rows include the JVM)",
        ["pipeline", "events/s", "RSS MB", *(f"x {name}" for name, *_ in peers)],
        [[name, rate, rss, *(rate / other if other > 0 else float("nan") for _, other, _ in peers)]
         for name, rate, rss in tocsin + peers],
    )
    table(
        f"Alert latency, live stream at {args.live_rate:,} events/s, {len(live_specs):,} subscriptions, "
        "allowed delay 0.5 s (window complete in the log -> alert in Redis)",
        ["trigger s", "alerts", "p50 s", "p95 s", "p99 s", "max s", "p99 / trigger"],
        [[t, len(lat), *(percentiles(lat, (50, 95, 99, 100), 1.0) if lat else [float("nan")] * 4),
          percentiles(lat, (99,), 1.0)[0] / t if lat else float("nan")] for t, lat in latencies.items()],
    )


if __name__ == "__main__":
    main()
