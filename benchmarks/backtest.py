"""Backtest benchmark: a day of the default synthetic feed, one condition over every key.

    python benchmarks/backtest.py              # a day evaluated; 1,000,000 records read from Tansu
    python benchmarks/backtest.py --quick      # a quarter of an hour; 20,000 records

- *Evaluate*: ``evaluator.backtest.Backtest`` (the live query's judge, clock rule and shard) over
  the feed's raw records in the chunks a backtest reads (``backtest_chart_points`` of them), in
  process. The records are made as the feed makes them (``ingest.market``: ``feed_rate`` events a
  second on average with its intraday profile, ``feed_symbols`` Zipf-popular symbols, lognormal
  sizes, ``feed_max_disorder_ms`` of disorder), vectorised here so that a day can be made at all;
  making them is not timed.
- *Read*: ``ingest.history`` over a topic of the same records on the embedded Tansu broker: the
  range's offsets (binary search over record times) and the records in chunks.
- *A day end to end*: the day's evaluation as measured, plus reading its records at the measured
  rate (extrapolated from the records read: publishing a day to Tansu here would take longer
  than the benchmark).
- *Live beside a backtest* (``--live-seconds``, not in ``--quick``): the evaluator (``python -m
  evaluator.spark``, local[2]) on the default feed live with ``LIVE_SUBSCRIPTIONS`` subscriptions;
  its micro-batch durations alone, then beside a backtest process evaluating history non-stop at
  the lane's priority (``backtest_worker_nice``), then beside one at the same priority as the
  evaluator (what the lane's nice spares live evaluation).

Numbers are printed, never asserted.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.pipeline import install_catalog
from benchmarks.report import add_markdown_option, markdown_run, table
from core import cli
from core.cpu_priority import lower_cpu_priority
from core.redis_schema import RedisKeys
from core.settings import Settings
from core.streams import trades_schema
from devstack.services import free_port, python_module, spawn, start_redis, start_tansu, wait_for_port
from evaluator.backtest import Backtest
from evaluator.spec import SubscriptionSpec
from ingest.history import history_span, read_history
from ingest.kafka import ensure_topics
from ingest.market import TRADING_DAY_MS, intraday_activity, symbol_names
from notifier.backtests import chunk_ms
from subscriptions.language import parse_condition

CONDITION = "SUM(volume) OVER 5m > 200000"
LIVE_SUBSCRIPTIONS = 1_000
LIVE_WARM_UP_S = 90
START_MS = 1_790_000_000_000


def feed(settings: Settings, hours: float, chunk: int, seed: int = 7) -> Iterator[pd.DataFrame]:
    """The feed's raw records over ``hours``, in chunks of ``chunk`` ms of record time (each record stamped when it was
    emitted, its event time up to the disorder earlier)."""
    rng = np.random.default_rng(seed)
    names = np.array(symbol_names(settings.feed_symbols), dtype=object)
    weights = np.arange(1, len(names) + 1, dtype=float) ** -1.1
    weights /= weights.sum()
    prices = np.round(rng.lognormal(np.log(50), 1.0, len(names)), 2)
    partition_of = np.array([zlib.crc32(n.encode()) % settings.event_partitions for n in names])
    offsets = np.zeros(settings.event_partitions, dtype=np.int64)
    end = START_MS + int(hours * 3_600_000)
    for start in range(START_MS, end, chunk):
        stop = min(start + chunk, end)
        rate = settings.feed_rate * float(intraday_activity(start - START_MS, TRADING_DAY_MS))
        n = int(rng.poisson(rate * (stop - start) / 1000))
        emitted = np.sort(rng.integers(start, stop, n))
        ts = np.maximum(emitted - rng.integers(0, settings.feed_max_disorder_ms + 1, n), 0)
        which = rng.choice(len(names), n, p=weights)
        prices *= np.exp(rng.normal(0, 0.002, len(names)))
        price = np.round(prices[which] * np.exp(rng.normal(0, 0.0008, n)), 4)
        volume = np.maximum(np.round(rng.lognormal(np.log(200), 1.2, n)), 1)
        values = [f'{{"key":"{k}","ts":{t},"price":{p},"volume":{v}}}'.encode()
                  for k, t, p, v in zip(names[which], ts.tolist(), price.tolist(), volume.tolist(), strict=True)]
        partitions = partition_of[which]
        offset = np.empty(n, dtype=np.int64)
        for p in range(settings.event_partitions):
            mine = partitions == p
            offset[mine] = offsets[p] + np.arange(int(mine.sum()))
            offsets[p] += int(mine.sum())
        yield pd.DataFrame({"topic": settings.events_topic, "partition": partitions.astype(np.int32),
                            "offset": offset, "timestamp": emitted, "key": None, "value": values,
                            "value_bytes": [len(v) for v in values], "value_sha256": None, "now": stop})


def evaluate(settings: Settings, hours: float) -> tuple[list[object], float]:
    spec = SubscriptionSpec(1, parse_condition(CONDITION), None, CONDITION)
    chunk = chunk_ms(settings, START_MS, START_MS + int(hours * 3_600_000))
    backtest = Backtest.of(spec, settings, trades_schema(settings), settings.event_partitions, START_MS)
    busy = cpu = 0.0
    for frame in feed(settings, hours, chunk):
        wall, used = time.perf_counter(), time.process_time()
        backtest.feed(frame)
        busy += time.perf_counter() - wall
        cpu += time.process_time() - used
    events = backtest.tally.events
    return [f"{hours:g} h", f"{chunk / 1000:g} s", events, round(busy, 1), round(cpu, 1), round(events / busy),
            len(backtest.transitions), len(backtest.samples), peak_rss_mb()], busy


def read(settings: Settings, records: int) -> tuple[list[object], float]:
    """Publish ``records`` of the feed to Tansu (stamped with their times), then read them back as a backtest does."""
    from confluent_kafka import Producer

    hours = records / settings.feed_rate / 3600
    ensure_topics(settings)
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, "linger.ms": 50, "batch.num.messages": 10_000})
    published = 0
    for frame in feed(settings, hours * 1.05, 60_000):
        for partition, value, stamp in zip(frame["partition"].tolist(), frame["value"], frame["timestamp"].tolist(),
                                           strict=True):
            while True:
                try:
                    producer.produce(settings.events_topic, value=value, partition=partition, timestamp=stamp)
                    break
                except BufferError:
                    producer.poll(0.05)
            published += 1
        producer.poll(0)
        if published >= records:
            break
    assert producer.flush(120) == 0
    started, used = time.perf_counter(), time.process_time()
    span = history_span(settings, settings.events_topic, START_MS, START_MS + int(hours * 1.06 * 3_600_000))
    found = time.perf_counter() - started
    count = sum(len(chunk) for chunk in read_history(settings, span, chunk_ms(settings, START_MS, START_MS + int(
        hours * 3_600_000))))
    wall, cpu = time.perf_counter() - started, time.process_time() - used
    rate = count / wall
    return [count, round(found, 2), round(wall, 1), round(cpu, 1), round(rate)], rate


def beside_live(seconds: float, work: Path) -> list[list[object]]:
    """The live evaluator's batch durations alone and beside a backtest at each priority (see the module doc)."""
    redis_port, kafka_port = free_port(), free_port()
    redis_server = start_redis(redis_port, work / "redis", work / "redis.log")
    broker = start_tansu("127.0.0.1", kafka_port, work / "live-tansu.log")
    processes = [redis_server, broker]
    try:
        wait_for_port("127.0.0.1", kafka_port)
        settings = Settings(kafka_bootstrap=f"127.0.0.1:{kafka_port}", redis_url=f"redis://127.0.0.1:{redis_port}/0",
                            deployment_id="bench-backtest", data_dir=work / "live", database_url=f"sqlite:///{work}/db",
                            metrics_port_evaluator=0, metrics_port_feed=0)
        ensure_topics(settings)
        names = symbol_names(settings.feed_symbols)
        specs = tuple(SubscriptionSpec(i + 1, parse_condition(f"SUM(volume) OVER {1 + i % 10}m > {50_000 * (1 + i % 7)}"),
                                       frozenset(names[i % 50: i % 50 + 5]) if i % 3 == 0 else None)
                      for i in range(LIVE_SUBSCRIPTIONS))
        install_catalog(settings, specs)
        env = settings.to_env()
        processes.append(spawn("feed", python_module("ingest", "feed"), work / "feed.log", env=env))
        processes.append(spawn("evaluator", python_module("evaluator.spark"), work / "evaluator.log", env=env,
                               graceful=True, stop_timeout_s=60))
        stats = redis.Redis.from_url(settings.redis_url, decode_responses=True)
        key = RedisKeys(settings).evaluator_stats
        batch_times(stats, key, LIVE_WARM_UP_S)  # start-up and the first evaluations
        rows = [["alone", *summary(batch_times(stats, key, seconds))]]
        for label, nice in ((f"beside a backtest at nice {settings.backtest_worker_nice} (the lane's)",
                             settings.backtest_worker_nice), ("beside a backtest at nice 0", 0)):
            hog = spawn("backtest", [sys.executable, __file__, "--evaluate-only", "24", "--nice", str(nice)],
                        work / f"backtest-{nice}.log")
            try:
                rows.append([label, *summary(batch_times(stats, key, seconds))])
            finally:
                hog.stop()
        rows.append(["alone again", *summary(batch_times(stats, key, seconds))])
        return rows
    finally:
        for process in reversed(processes):
            process.stop()


def batch_times(stats: redis.Redis, key: str, seconds: float) -> list[float]:
    """The evaluator's micro-batch durations (s) over the next ``seconds``, as its driver reports each batch."""
    seen, times = None, []
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        batch, duration = stats.hmget(key, ["last_batch_id", "batch_seconds"])
        if batch is not None and batch != seen and duration is not None:
            if seen is not None:
                times.append(float(duration))
            seen = batch
        time.sleep(0.2)
    return times


def summary(times: list[float]) -> list[object]:
    if not times:
        return [0, "-", "-", "-"]
    p50, p99 = np.percentile(times, [50, 99])
    return [len(times), round(float(p50), 2), round(float(p99), 2), round(max(times), 2)]


def peak_rss_mb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


def main() -> None:
    parser = cli.parser(__doc__, "python -m benchmarks.backtest")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--live-seconds", type=float, default=90, help="each phase of the live measurement (0: none)")
    parser.add_argument("--evaluate-only", type=float, metavar="HOURS", help=argparse.SUPPRESS)  # the live run's load
    parser.add_argument("--nice", type=int, default=0, help=argparse.SUPPRESS)  # ... at the lane's priority
    parser.add_argument("--live-only", action="store_true", help="only the live measurement")
    add_markdown_option(parser)
    args = parser.parse_args()
    if args.evaluate_only:
        lower_cpu_priority(args.nice)  # as the backtests lane's worker does
        while True:
            evaluate(Settings(), args.evaluate_only)
    if args.live_only:
        live(args.live_seconds, Path(tempfile.mkdtemp(prefix="tocsin-bench-backtest-")))
        return
    hours, records = (0.25, 20_000) if args.quick else (24.0, 1_000_000)
    settings = Settings()
    row, busy_s = evaluate(settings, hours)
    table(f"Backtest, evaluate: `{CONDITION}` over every key of the default feed ({settings.feed_rate:g} events/s on "
          f"average, {settings.feed_symbols} symbols), in process, one core",
          ["history", "chunk", "events", "seconds", "CPU s", "events/s", "transitions", "keys charted",
           "peak RSS MB"], [row])
    work = Path(tempfile.mkdtemp(prefix="tocsin-bench-backtest-"))
    port = free_port()
    broker = start_tansu("127.0.0.1", port, work / "tansu.log")
    try:
        wait_for_port("127.0.0.1", port)
        topic = Settings(kafka_bootstrap=f"127.0.0.1:{port}", events_topic="bench.backtest")
        read_row, rate = read(topic, records)
    finally:
        broker.stop()
    table("Backtest, read: the records back from Tansu (the range found by binary search, then read in chunks)",
          ["records", "range found, s", "seconds", "CPU s", "records/s"], [read_row])
    day = settings.feed_rate * 86_400
    evaluated_s = busy_s * 24 / hours
    read_s = day / rate
    table("Backtest, a day of the default feed end to end (evaluation as measured for the first table's history, "
          "scaled to a day if shorter; reading at the measured rate)",
          ["records", "evaluate s", "read s (extrapolated)", "total s", "target s"],
          [[round(day), round(evaluated_s, 1), round(read_s, 1), round(evaluated_s + read_s, 1), 30]])
    if args.live_seconds and not args.quick:
        live(args.live_seconds, work)


def live(seconds: float, work: Path) -> None:
    table(f"Live evaluation beside a backtest: the evaluator's micro-batch seconds on the default feed "
          f"({LIVE_SUBSCRIPTIONS:,} subscriptions, local[2], 1 s trigger), {seconds:g} s a phase after a "
          f"{LIVE_WARM_UP_S} s warm-up", ["live evaluator", "batches", "p50 s", "p99 s", "max s"],
          beside_live(seconds, work))


if __name__ == "__main__":
    with markdown_run():
        main()
