"""The whole evaluator pipeline on this machine: Kafka -> Spark -> shard operator -> Redis, beside its peers.

    python benchmarks/pipeline.py              # the full run (about half an hour on two cores)
    python benchmarks/pipeline.py --markdown docs/benchmarks.md   # ... and the run into its section there
    python benchmarks/pipeline.py --quick      # smoke run

Real components: a Tansu broker and a Redis server of its own, one local[2]
SparkSession running the production query (``evaluator.spark.job.build_query``).

- *Throughput* (backlog drain): a stream of ``--rate`` events per event-second
  over ``--keys`` keys (Zipf popularity) is published once, pre-serialised and in
  large librdkafka batches; each row runs its own query over it from the start
  (own checkpoint and Redis prefix) with the production admission cap
  (``TOCSIN_SOURCE_MAX_RECORDS_PER_TRIGGER``, ``--cap``), so the backlog drains
  in batches of the cap. events/s = rows processed after the first batch
  (start-up, and the first evaluations where every match fires at once) over the
  wall time of the batches that processed them, from Spark's progress
  (``benchmarks/progress.py``); *first batch s* times that first evaluation
  apart, *handed over* counts the transitions the sink's handoff stored after their batch
  (``evaluator.spark.handoff``: a burst beyond ``TOCSIN_SINK_BATCH_TRANSITIONS``), and *handoff
  left s* how long it still stored after the stream's last batch (the next row waits for it).
  ``--budget`` wall seconds after the warm-up, then
  the row says "budget". Rows: collective at each ``--subscriptions``, naive at
  ``--naive``, collective at other caps (``--sweep-caps``: the batch-size
  trade-off), a high-selectivity mix (``--high-selectivity``: thresholds at the
  per-key quantiles, ~8 % of keys over each) and a key-churn stream (``--churn``:
  ``--churn-turnover`` new keys per event-second, ``--keys`` active at a time, its
  own topic).
- *Two streams* (issue 15: a query per declared stream, ``--two-streams``): the trades query with the
  collective mix beside a ``hosts`` stream's query (declared in the stream registry and started by the
  evaluator's stream supervisor, as in production), both draining their backlog at once with the same
  cap. ``hosts`` (attributes cpu and mem) carries the same feed relabelled (cpu = price, mem = volume)
  and the mix's first ``--hosts-subscriptions`` subscriptions over cpu and mem, so both streams' alerts
  have a known answer: the transitions of the same subscriptions in the single-stream collective row
  over the same feed. Rows processed per wall second per stream and in total (every counted row over the
  wall time from the first stream's warm-up to the last batch), tree CPU per record, peak RSS.
- *Where the time goes*, per row, in µs of task time per record read (both
  cores summed): read (the source's slices), parse (``PaneParser``), the shard
  operator's restore / evaluate / persist, the sink's Redis writes, all kept in
  the ``stats:evaluator`` hash; *rest* is 2 cores x the batches' wall time less
  those: Spark's shuffle, Arrow transfers to and from the Python workers,
  scheduling, the state store commit -- and idle cores.
- *Peers* (``benchmarks/peers.py``), on the same topic, data and thresholds
  (``--peer-subscriptions``): Spark's built-in ``window()`` + a threshold join at
  each ``--spark-windows`` length and each ``--peer-batches`` size, beside Tocsin's
  row at the same size (like with like: both gain from larger batches, Spark more),
  and a single-process quixstreams hopping-window job at each ``--quix-windows``
  length (run before Spark starts; it reads record by record, so it is set beside
  Tocsin at the smallest size), measured the same way; then each at its best size.
- *Latency*: events produced live at each ``--live-rates`` (event time = now, a
  producer process of its own) with ``--live-subscriptions`` at a ``--trigger``
  and the production cap, over a *per-symbol alert* mix (one key per subscription,
  about ``--live-share`` of them over their threshold, the rest comfortably not, and
  ``--live-edge-share`` watching a key's 10-second high or low against its starting price;
  rate 0 is a heartbeats-only feed: the near-empty batch, the latency floor) and the
  throughput rows' *heavy* mix (``--live-heavy-rates``); the alert mix at each pane
  width of ``--live-panes`` and allowed delay of ``--live-delays``. Measured in steady state,
  after ``--live-warm-up`` seconds whose first evaluations fire every match at
  once: for every alert whose window became complete in the log (window end +
  allowed delay) after the warm-up, the time to its arrival in the Redis stream;
  with the batches' size, duration and gaps, and where a batch's time goes
  (Spark's ``durationMs`` stages and our stages' task time): the latency side of
  the trade-off. Beside each row, its tick floor: what waiting for Spark's trigger
  alone costs an alert (:mod:`benchmarks.latency_floor`) plus the row's batch.

RSS is the peak of the whole process tree (driver, JVM, Python workers) during a
row. Numbers are printed, never asserted.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import importlib.util
import json
import multiprocessing
import random
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
import psutil
import redis
from kafka.admin import KafkaAdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.latency_floor import tick_wait_s
from benchmarks.peers import quixstreams_peer, spark_window_peer, thresholds
from benchmarks.progress import batch_end_s, combined, drain, drain_all
from benchmarks.report import add_markdown_option, markdown_run, percentiles, print_tables
from core import cli
from core.redis_replies import text_entries, text_hash
from core.redis_schema import RedisKeys, admission_waiting_by_shard
from core.settings import Settings
from core.stream_names import TRADES
from core.streams import Attribute, RecordLimits, StreamSchema, StreamValidator, topic_name
from devstack.services import free_port, start_redis, start_tansu
from evaluator.catalog import Catalog
from evaluator.spark.graceful import stop_between_batches
from evaluator.spark.job import build_query
from evaluator.spark.registry import RegistryReader
from evaluator.spark.session import spark_session, stop_session
from evaluator.spark.source import stop_file
from evaluator.spark.supervisor import StreamSupervisor
from evaluator.spec import Aggregate, Condition, SubscriptionSpec
from ingest.kafka import ensure_topics
from ingest.model import Event, Heartbeat
from subscriptions.language import format_condition, parse_condition
from subscriptions.service import publish_catalog
from subscriptions.streams import publish_registry

SECOND = 1_000
WINDOWS = (60 * SECOND, 300 * SECOND, 900 * SECOND, 3_600 * SECOND)  # 1 min to 1 h
ZIPF_S = 0.8
MEAN_VOLUME = 90.0  # int(lognormvariate(4, 1)) + 1
HEARTBEAT_MS = 200  # live feed heartbeats
LIVE_DELAY_MS = 500  # the live rows' allowed delay unless --live-delays names others
EDGE_WINDOW = 10 * SECOND  # the live breakout alerts' window: short, so they resolve and fire again within a run
CORES = 2  # local[2]


def key_name(i: int) -> str:
    return f"S{i:05d}"


def churn_key_name(i: int) -> str:
    return f"C{i:07d}"


def key_names(n: int) -> list[str]:
    return [key_name(i) for i in range(n)]


def level(i: int) -> float:
    """Key ``i`` trades around its own price level, log-uniform between 5 and 1,000."""
    return round(5 * 200 ** random.Random(i * 7919 + 13).random(), 2)


def zipf_weights(n: int) -> np.ndarray:
    w = 1 / (np.arange(n) + 1.0) ** ZIPF_S
    return w / w.sum()


def stream(n_keys: int, rate: int, seconds: int, start_ms: int, *, seed: int = 5, turnover: int = 0,
           name: Callable[[int], str] = key_name) -> Iterator[tuple[str, int, float, float]]:
    """(key, ts, price, volume), ``rate`` per event-second, Zipf-popular among ``n_keys`` active keys.

    With ``turnover`` the active keys slide: at event-second t they are ``t * turnover`` onwards, so
    ``n_keys + seconds * turnover`` distinct keys pass through the stream.
    """
    rng = random.Random(seed)
    cumulative = np.cumsum(zipf_weights(n_keys)).tolist()
    prices: dict[int, float] = {}
    for second in range(seconds):
        base = second * turnover
        for n in range(rate):
            i = base + bisect.bisect_left(cumulative, rng.random() * cumulative[-1])
            price = prices[i] = max(1.0, prices.get(i) or level(i)) * (1 + rng.gauss(0, 0.0005))
            yield name(i), start_ms + second * SECOND + n * SECOND // rate, round(price * 4) / 4, float(
                int(rng.lognormvariate(4, 1)) + 1)
        if turnover:
            for i in range(base, base + turnover):
                prices.pop(i, None)  # gone for good: memory stays with the active keys


INDEXED = [Aggregate.COUNT, Aggregate.SUM, Aggregate.AVG, Aggregate.MAX, Aggregate.MIN]


def _watched(rng: random.Random, keys: list[str]) -> frozenset[str] | None:
    return frozenset(rng.sample(keys, rng.randint(1, 5))) if rng.random() < 0.2 else None


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
            condition = Condition(aggregate, "volume", window, low=expected_count * MEAN_VOLUME * rng.uniform(8, 60))
        elif aggregate is Aggregate.AVG:
            condition = Condition(aggregate, "price", window, low=5 * 200 ** rng.uniform(0.97, 1.0))
        elif aggregate is Aggregate.MAX:
            condition = Condition(aggregate, "price", window, low=5 * 200 ** rng.uniform(0.97, 1.02))
        else:
            condition = Condition(aggregate, "price", window, high=5 * 200 ** rng.uniform(-0.02, 0.03))
        specs.append(SubscriptionSpec(i + 1, condition, _watched(rng, keys)))
    return tuple(specs)


def semantics_subscriptions(n: int, keys: list[str], rate: int, seed: int = 13) -> tuple[SubscriptionSpec, ...]:
    """The mix of :func:`subscriptions` with issue 16's constructs in it, as users write them (parsed from text).

    Of every 20 subscriptions: 8 plain thresholds; with a lifecycle, 3 ``FOR 1m``, 2 ``KEEP FIRING FOR 2m``,
    1 ``RESOLVE BELOW`` (hysteresis) and 1 ``DAMPEN 5m``; 2 price alerts on one symbol 1-3 % from its level
    (``LAST(price) OVER 1m CROSSES ABOVE|BELOW``); 1 ``CHANGE(price) OVER 5m`` beyond 4-8 % either way; 1 tuple
    window on one symbol (``AVG(price) OVER LAST n EVENTS`` 1-3 % above its level); 1 ``NO DATA FOR 5m`` on
    listed keys. Thresholds sit outside the feed's random walk, as users set them: most do not fire.
    """
    rng = random.Random(seed)
    plain = subscriptions(n, keys, rate, seed)
    specs = []
    for spec in plain:
        slot = (spec.id - 1) % 20
        text = format_condition(spec.condition)
        watched = spec.keys
        if slot < 8:
            pass  # a plain threshold
        elif slot < 11:
            text += " FOR 1m"
        elif slot < 13:
            text += " KEEP FIRING FOR 2m"
        elif slot == 13 and spec.condition.low is not None and spec.condition.low > 0:
            text += f" RESOLVE BELOW {spec.condition.low * 0.9:.6g}"
        elif slot == 14:
            text += " DAMPEN 5m"
        elif slot in (15, 16):  # a price alert on one symbol, ~2 % from where it trades (a 1-min walk: ~0.8 %)
            i = rng.randrange(len(keys))
            direction = "ABOVE" if slot == 15 else "BELOW"
            away = rng.uniform(1.01, 1.03) if slot == 15 else rng.uniform(0.97, 0.99)
            text = f"LAST(price) OVER 1m CROSSES {direction} {level(i) * away:.2f}"
            watched = frozenset({keys[i]})
        elif slot == 17:  # moving up or down by more than the walk's 5-min spread (~1.7 %) makes it news
            sign, op = rng.choice([("", ">"), ("-", "<")])
            text = f"CHANGE(price) OVER 5m {op} {sign}{rng.uniform(4, 8):.2f}%"
        elif slot == 18:
            i = rng.randrange(len(keys))
            text = f"AVG(price) OVER LAST {rng.choice([10, 50, 100])} EVENTS > {level(i) * rng.uniform(1.01, 1.03):.2f}"
            watched = frozenset({keys[i]})
        elif slot == 19:
            text = "NO DATA FOR 5m"
            watched = frozenset(rng.sample(keys, 3))
        specs.append(SubscriptionSpec(spec.id, parse_condition(text), watched, text=text))
    return tuple(specs)


def selective_subscriptions(n: int, keys: list[str], rate: int, seconds: int, share: float = 0.08,
                            seed: int = 11) -> tuple[SubscriptionSpec, ...]:
    """The same shapes with each threshold at a per-key quantile: about ``share`` of the keys are over it.

    A key's expected window value is its Zipf share of ``rate`` over the part of the window the stream
    covers (counts, volume sums) or its price level (AVG, MAX, MIN); each subscription takes the
    ``1 - q`` quantile of those, q drawn around ``share``, so thresholds spread and groups mix.
    """
    rng = random.Random(seed)
    counts = zipf_weights(len(keys)) * rate
    levels = np.array([level(i) for i in range(len(keys))])
    specs = []
    for i in range(n):
        window = rng.choice(WINDOWS)
        aggregate = rng.choice(INDEXED)
        q = share * rng.uniform(0.5, 1.5)
        horizon_s = min(window / SECOND, seconds)
        if aggregate is Aggregate.COUNT:
            condition = Condition(aggregate, None, window, low=float(np.quantile(counts * horizon_s, 1 - q)))
        elif aggregate is Aggregate.SUM:
            low = float(np.quantile(counts * horizon_s * MEAN_VOLUME, 1 - q))
            condition = Condition(aggregate, "volume", window, low=low)
        elif aggregate in (Aggregate.AVG, Aggregate.MAX):
            condition = Condition(aggregate, "price", window, low=float(np.quantile(levels, 1 - q)))
        else:
            condition = Condition(aggregate, "price", window, high=float(np.quantile(levels, q)))
        specs.append(SubscriptionSpec(i + 1, condition, _watched(rng, keys)))
    return tuple(specs)


def alert_subscriptions(n: int, keys: list[str], rate: int, firing_share: float = 0.005,
                        seed: int = 13, edge_share: float = 0.0) -> tuple[SubscriptionSpec, ...]:
    """Per-symbol alerts: each subscription watches one key, its threshold set from that key's own level.

    About ``firing_share`` of them are set to be over their threshold (the key's expected window value
    x 0.8, or its price level x 0.95 / 1.05), the rest comfortably not (x 1.5-4 counts and volumes,
    plus four standard deviations for thin keys; price levels x 1.05-1.3 or 0.75-0.95), so few pairs sit at
    their threshold and flap. Counts and volumes are expected values over the whole window at ``rate``.

    About ``edge_share`` of them instead watch a key drawn by its trading weight for its 10-second high
    above (or low below) the price it starts at: "tell me when it breaks out" alerts, which fire and
    resolve as the key's price walks, so a live run has alerts to time after its warm-up (with only the
    above, a minute's run had ~5; with 1-minute windows, 9: few resolved within the run). Drawn from their
    own generator: the other subscriptions stay as they were.
    """
    rng = random.Random(seed)
    edges = random.Random(seed + 1)
    weights = zipf_weights(len(keys))
    cumulative = np.cumsum(weights).tolist()
    specs = []
    for i in range(n):
        k = rng.randrange(len(keys))
        window = rng.choice(WINDOWS)
        aggregate = rng.choice(INDEXED)
        over = rng.random() < firing_share
        expected = rate * float(weights[k]) * window / SECOND  # events of the key in a full window
        if aggregate in (Aggregate.COUNT, Aggregate.SUM):
            scale = 1.0 if aggregate is Aggregate.COUNT else MEAN_VOLUME
            quiet = max(expected * rng.uniform(1.5, 4), expected + 4 * expected ** 0.5 + 3)
            low = scale * (0.8 * expected if over else quiet)
            condition = Condition(aggregate, None if aggregate is Aggregate.COUNT else "volume", window, low=low)
        elif aggregate is Aggregate.MIN:
            condition = Condition(aggregate, "price", window,
                                  high=level(k) * (1.05 if over else rng.uniform(0.75, 0.95)))
        else:
            condition = Condition(aggregate, "price", window, low=level(k) * (0.95 if over else rng.uniform(1.05, 1.3)))
        if edges.random() < edge_share:
            k = min(bisect.bisect_left(cumulative, edges.random() * cumulative[-1]), len(keys) - 1)
            condition = (Condition(Aggregate.MAX, "price", EDGE_WINDOW, low=level(k)) if edges.random() < 0.5
                         else Condition(Aggregate.MIN, "price", EDGE_WINDOW, high=level(k)))
        specs.append(SubscriptionSpec(i + 1, condition, frozenset([keys[k]])))
    return tuple(specs)


def event_value(key: str, ts: int, price: float, volume: float) -> bytes:
    """The JSON ``Event.to_json`` writes, without building a model per event (checked in :func:`publish`)."""
    return f'{{"key":"{key}","ts":{ts},"price":{price!r},"volume":{volume!r}}}'.encode()


def event_reference(key: str, ts: int, price: float, volume: float) -> bytes:
    return Event(key=key, ts=ts, price=price, volume=volume).to_json()


#: The two-stream row's second stream: the feed relabelled (cpu = price, mem = volume), ids past HOSTS_IDS.
HOSTS = StreamSchema(name="hosts", attributes=(Attribute(name="cpu", unit="%", min=0), Attribute(name="mem", min=0)),
                     retention_ms=7 * 86_400_000, partitions=4)
HOSTS_IDS = 1_000_000
HOSTS_ATTRIBUTES = {"price": "cpu", "volume": "mem"}


def host_value(key: str, ts: int, cpu: float, mem: float) -> bytes:
    """A ``hosts`` record as its producers write it (checked against the stream's validator in :func:`publish`)."""
    return f'{{"key":"{key}","ts":{ts},"cpu":{cpu!r},"mem":{mem!r}}}'.encode()


def host_reference(key: str, ts: int, cpu: float, mem: float) -> bytes:
    [wire] = StreamValidator(HOSTS, RecordLimits.of(Settings())).validate([host_value(key, ts, cpu, mem)]).records
    return wire.encode()


def on_hosts(specs: tuple[SubscriptionSpec, ...]) -> tuple[SubscriptionSpec, ...]:
    """The same subscriptions over ``hosts`` (price -> cpu, volume -> mem), their ids ``HOSTS_IDS`` further."""
    return tuple(SubscriptionSpec(HOSTS_IDS + s.id, dataclasses.replace(
        s.condition, attribute=HOSTS_ATTRIBUTES.get(s.condition.attribute or "", s.condition.attribute),
        stream=HOSTS.name), s.keys) for s in specs)


def new_producer(bootstrap: str):
    from confluent_kafka import Producer  # a runtime dependency (the web app's publishing producer)

    return Producer({
        "bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 20, "batch.size": 1_000_000,
        "queue.buffering.max.messages": 1_000_000, "queue.buffering.max.kbytes": 1 << 20,
        "partitioner": "murmur2_random",  # the Java (and kafka-python) key hash: EventPublisher's partitions
    })


class Sender:
    """Pre-serialised records through librdkafka, waiting whenever its local queue is full."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.producer = new_producer(bootstrap)
        self.topic = topic
        self.partitions = sorted(self.producer.list_topics(topic, timeout=10).topics[topic].partitions)
        self.records = 0

    def send(self, value: bytes, key: bytes | None = None, partition: int = -1) -> None:
        while True:
            try:
                self.producer.produce(self.topic, value, key, partition)
                self.records += 1
                return
            except BufferError:  # the local queue is full: let librdkafka send some
                self.producer.poll(0.05)

    def event(self, key: str, ts: int, price: float, volume: float) -> None:
        self.send(event_value(key, ts, price, volume), key.encode())

    def heartbeat(self, at: int) -> None:
        for partition in self.partitions:
            self.send(Heartbeat(partition=partition, ts=at).to_json(), partition=partition)

    def flush(self) -> None:
        if self.producer.flush(60):
            raise RuntimeError("records left unsent after 60 s")


Encoder = Callable[[str, int, float, float], bytes]


def publish(settings: Settings, topic: str, events: Iterable[tuple], heartbeat_every_ms: int = 500,
            encode: Encoder = event_value, reference: Encoder = event_reference) -> tuple[int, float]:
    """Publish a stream as it is generated; heartbeats every ``heartbeat_every_ms`` of event time and one
    30 s past the end so every window closes. ``encode`` writes a record (trades' by default; its first
    record is checked against ``reference``, the model's own serialisation). Returns (records written,
    wall seconds)."""
    sender = Sender(settings.kafka_bootstrap, topic)
    started = time.monotonic()
    next_beat, last_ts = None, 0
    for key, ts, price, volume in events:
        if next_beat is None:
            assert encode(key, ts, price, volume) == reference(key, ts, price, volume)
            next_beat = ts + heartbeat_every_ms
        if ts >= next_beat:
            sender.heartbeat(next_beat)
            next_beat += heartbeat_every_ms
        sender.send(encode(key, ts, price, volume), key.encode())
        last_ts = ts
    sender.heartbeat(last_ts + 30 * SECOND)
    sender.flush()
    return sender.records, time.monotonic() - started


def create_event_topic(settings: Settings, topic: str) -> None:
    """An event topic with an explicit retention: quixstreams derives its changelog topics' config from it.

    Tansu's DescribeConfigs reports no ``retention.ms`` for a topic created without one, and quixstreams
    3.28 then fails with ``KeyError: 'retention.ms'`` (``TopicManager.derive_topic_config``).
    """
    admin = KafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    try:
        admin.create_topics([NewTopic(topic, settings.event_partitions, 1,
                                      topic_configs={"retention.ms": "-1", "retention.bytes": "-1"})])
    finally:
        admin.close()
    ensure_topics(settings)  # the dead-letter topic


def install_catalog(settings: Settings, specs: tuple[SubscriptionSpec, ...]) -> None:
    publish_catalog(redis.Redis.from_url(settings.redis_url), RedisKeys(settings), Catalog(1, specs))


def _tree() -> list[psutil.Process]:
    me = psutil.Process()
    return [me, *me.children(recursive=True)]


def tree_rss_mb() -> float:
    total = 0
    for p in _tree():
        with contextlib.suppress(psutil.Error):  # a child that just exited
            total += p.memory_info().rss
    return total / 2**20


class Resources:
    """The process tree's peak RSS (MB) and the CPU seconds it used while a block runs, sampled twice a second.

    CPU time does not depend on what else the machine runs, unlike wall time: CPU µs per record is the
    cost a row would have on idle cores. A process that exits loses at most its last half second.
    """

    def __init__(self) -> None:
        self.rss_mb = tree_rss_mb()
        self._start: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._processes: dict[int, psutil.Process] = {}
        self._stop = threading.Event()
        self._sample(first=True)

    def _sample(self, first: bool = False) -> None:
        for p in _tree():
            with contextlib.suppress(psutil.Error):
                times = p.cpu_times()
                used = times.user + times.system
                self._last[p.pid] = used
                self._start.setdefault(p.pid, used if first else 0.0)
                self._processes.setdefault(p.pid, p)
        self.rss_mb = max(self.rss_mb, tree_rss_mb())

    @property
    def cpu_s(self) -> float:
        return sum(used - self._start[pid] for pid, used in self._last.items())

    def cpu_s_by(self, role: Callable[[psutil.Process], str]) -> dict[str, float]:
        """:attr:`cpu_s` split by each process's ``role`` (asked while the process still runs, else "exited")."""
        split: dict[str, float] = {}
        for pid, used in self._last.items():
            try:
                name = role(self._processes[pid])
            except psutil.Error:
                name = "exited"
            split[name] = split.get(name, 0.0) + used - self._start[pid]
        return split

    def __enter__(self) -> Resources:
        def run() -> None:
            while not self._stop.wait(0.5):
                self._sample()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


@dataclass(frozen=True)
class Row:
    """One throughput row: a catalog over a topic, evaluated one way, at one admission cap."""

    name: str
    specs: tuple[SubscriptionSpec, ...]
    topic: str
    mode: str
    cap: int
    keys: int  # distinct keys in the stream


STAGES = ("read", "parse", "restore", "evaluate", "persist", "sink")
RESTORES = ("cached", "caught_up", "rebuilt")


def row_settings(base: Settings, name: str, mode: str, topic: str, cap: int) -> Settings:
    """A throughput row's own Redis prefix and checkpoint, its mode, topic and cap, a 0 s trigger."""
    tag = name.replace(" ", "-").replace(",", "").replace("+", "")
    return base.model_copy(update={
        "redis_prefix": f"bench-{tag}", "checkpoint_dir": str(base.data_dir / f"checkpoint-{tag}"),
        "evaluator_mode": mode, "events_topic": topic,
        "source_max_records_per_trigger": cap, "trigger_interval": "0 seconds",
    })


def handoff_left(settings: Settings, timeout_s: float = 900.0, stream: str = TRADES) -> float:
    """Seconds until the sink's handoff (``evaluator.spark.handoff``) is empty: what of a burst it still stores
    after the stream's last batch."""
    client, key, started = redis.Redis.from_url(settings.redis_url), RedisKeys(settings).handoff(stream), time.monotonic()
    while client.llen(key) and time.monotonic() - started < timeout_s:
        time.sleep(0.2)
    return time.monotonic() - started


class AdmissionWatch:
    """When a row's shards had admitted every new subscription (``evaluator.admission``): ``stats:evaluator`` read
    four times a second while the row drains; ``done_at`` is the first reading with every shard reported and none
    waiting (epoch seconds)."""

    def __init__(self, settings: Settings, shards: int, stream: str = TRADES) -> None:
        self.client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
        self.key, self.stream, self.shards = RedisKeys(settings).evaluator_stats, stream, shards
        self.done_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.25):
            waiting = admission_waiting_by_shard(self.client.hgetall(self.key)).get(self.stream, {})
            if len(waiting) >= self.shards and not sum(waiting.values()):
                self.done_at = time.time()
                return

    def close(self) -> None:
        self._stop.set()
        self._thread.join()

    def after(self, progress: list[dict]) -> float:
        """Seconds from the row's first batch's start to every subscription admitted."""
        if not progress or self.done_at is None:
            return float("nan")
        started = datetime.fromisoformat(progress[0]["timestamp"].replace("Z", "+00:00")).timestamp()
        return self.done_at - started


def throughput_run(spark, base: Settings, row: Row, total_rows: int, budget_s: float) -> dict:
    settings = row_settings(base, row.name, row.mode, row.topic, row.cap)
    install_catalog(settings, row.specs)
    print(f"{row.name} ...", file=sys.stderr, flush=True)
    with Resources() as rss:
        admission = AdmissionWatch(settings, base.spark_shuffle_partitions)
        throughput, progress = drain(build_query(spark, settings), total_rows, min(row.cap, total_rows // 2), budget_s,
                                     stop_file(settings, TRADES))
        handoff_s = handoff_left(settings)  # stored before the next row runs, and counted in this one's stats
        admission.close()
    stats = {k: float(v) for k, v in text_hash(redis.Redis.from_url(settings.redis_url, decode_responses=True).hgetall(
        RedisKeys(settings).evaluator_stats)).items() if _is_number(v)}
    boundaries = max(stats.get("boundaries", 0), 1.0)
    batches = max(len(progress), 1)
    read = max(stats.get("read_rows", 0), 1.0)
    wall_ms = sum(p["durationMs"].get("triggerExecution", 0) for p in progress)
    done = max(sum(p["numInputRows"] for p in progress), 1)
    us = {stage: stats.get(f"{stage}_ms_total", 0) * 1000 / read for stage in STAGES}
    operator = us["restore"] + us["evaluate"] + us["persist"]
    rebuilt_us = stats.get("restore_rebuilt_ms_total", 0) * 1000 / read
    shards = base.spark_shuffle_partitions
    return {
        "rate": throughput.rate, "events": throughput.rows, "finished": throughput.finished,
        "batches": len(progress), "batch_rows": done / batches, "batch_ms": wall_ms / batches,
        # the first evaluation over the backlog: every match fires at once, the stream waits behind it
        "first_s": progress[0]["durationMs"].get("triggerExecution", 0) / 1000 if progress else float("nan"),
        "longest_s": max((p["durationMs"].get("triggerExecution", 0) / 1000 for p in progress), default=float("nan")),
        "admitted_s": admission.after(progress),
        "handed_over": stats.get("handed_over", 0), "handoff_s": handoff_s,
        "transitions": stats.get("transitions", 0) / batches,
        "candidates": stats.get("candidates", 0) / boundaries, "matches": stats.get("matches", 0) / boundaries,
        "selectivity": stats.get("matches", 0) / boundaries * shards / (len(row.specs) * row.keys),
        "rss_mb": rss.rss_mb, "us": us, "cores_us": CORES * wall_ms * 1000 / done,
        "cpu_us": rss.cpu_s * 1e6 / read, "evaluate_ms": stats.get("evaluate_ms_total", 0) / boundaries,
        # the part of evaluate that is the task's round trip to its shard host (rows there, output and delta back)
        "transfer_us": stats.get("shard_host_transfer_ms_total", 0) * 1000 / read,
        "restore_share": us["restore"] / operator if operator else float("nan"),
        "restores": [int(stats.get(f"shard_restore_{how}", 0)) for how in RESTORES],
        # Without the rebuilds (a worker's first batch of a shard, or a copy older than the last snapshot):
        # the steady state a long run tends to.
        "steady_restore_share": (us["restore"] - rebuilt_us) / (operator - rebuilt_us)
        if operator > rebuilt_us else float("nan"),
        "restore_ms": [stats.get(f"restore_{how}_ms_total", 0) / max(stats.get(f"shard_restore_{how}", 0), 1)
                       for how in RESTORES],
    }


@dataclass(frozen=True)
class TwoStreamRow:
    """The two-stream row: trades' catalog (a collective row's mix) and hosts' (the first of it, on cpu and mem)."""

    name: str
    trades: tuple[SubscriptionSpec, ...]
    hosts: tuple[SubscriptionSpec, ...]
    reference: str  # the single-stream collective row over the same feed and mix ("": none ran)
    cap: int


Digest = tuple[int, int]  # (transitions, sum of their hashes mod 2^64): a multiset, compared in this process


def alert_digests(settings: Settings, groups: dict[str, Callable[[int], int | None]]) -> dict[str, Digest]:
    """Each group's transitions as (subscription, key, state, evaluated_at) in the row's alert streams, digested;
    a group maps a subscription id to the id it is compared as (None: not in the group)."""
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    digests = dict.fromkeys(groups, (0, 0))
    for stream_key in RedisKeys(settings).alerts_streams:
        after = "-"
        while entries := text_entries(client.xrange(stream_key, after, "+", count=10_000)):
            for _, fields in entries:
                alert = json.loads(fields["alert"])
                for name, as_id in groups.items():
                    if (sid := as_id(alert["subscription_id"])) is not None:
                        n, total = digests[name]
                        seen = hash((sid, alert["key"], alert["state"], alert["evaluated_at"]))
                        digests[name] = (n + 1, (total + seen) % 2**64)
            after = "(" + entries[-1][0]
    return digests


def two_stream_run(spark, base: Settings, row: TwoStreamRow, total_rows: int, hosts_rows: int,
                   budget_s: float, reference: dict | None) -> dict:
    """Trades and hosts drained at once; hosts declared in the registry and started by the stream supervisor."""
    settings = row_settings(base, row.name, "collective", base.events_topic, row.cap)
    install_catalog(settings, row.trades + row.hosts)
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    keys = RedisKeys(settings)
    publish_registry(client, keys, [HOSTS])
    print(f"{row.name} ...", file=sys.stderr, flush=True)
    warm_up = min(row.cap, total_rows // 2)
    with Resources() as used:
        trades = build_query(spark, settings)
        supervisor = StreamSupervisor(spark, settings, RegistryReader(client, keys, settings), build_query)
        supervisor.poll()
        if "hosts" not in supervisor.queries():
            trades.stop()
            raise RuntimeError("the hosts query did not start: see stream_query_not_started in the log")
        drained = drain_all({"trades": (trades, total_rows, warm_up),
                             "hosts": (supervisor.queries()["hosts"], hosts_rows, min(row.cap, hosts_rows // 2))},
                            budget_s, {name: stop_file(settings, name) for name in (TRADES, "hosts")})
        handoff_left(settings)
        handoff_left(settings, stream="hosts")
    (trades_rate, trades_progress), (hosts_rate, hosts_progress) = drained["trades"], drained["hosts"]
    stats = _numbers(client.hgetall(keys.evaluator_stats))
    both = combined([trades_rate, hosts_rate])
    got = alert_digests(settings, {"trades": lambda i: i if i < HOSTS_IDS else None,
                                   "hosts": lambda i: i - HOSTS_IDS if i > HOSTS_IDS else None})
    return {
        "trades": trades_rate, "hosts": hosts_rate, "total": both,
        "batches": (len(trades_progress), len(hosts_progress)), "rss_mb": used.rss_mb,
        "cpu_us": used.cpu_s * 1e6 / max(stats.get("read_rows", 0), 1.0),
        "alerts": {name: _verdict(got[name], reference, name, both.finished) for name in got},
    }


def _verdict(got: Digest, reference: dict | None, name: str, finished: bool) -> str:
    """The two-stream row's transitions of one stream against the single-stream row's of the same subscriptions."""
    if reference is None:
        return f"{got[0]:,} (no single-stream row)"
    expected: Digest = reference["digests"][name]
    if not (finished and reference["finished"]):
        return f"{got[0]:,} (n/a: budget)"
    if got == expected:
        return f"exact ({got[0]:,})"
    return f"DIFFERS ({got[0]:,} vs {expected[0]:,})"


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def live_feed(bootstrap: str, topic: str, keys: int, rate: int, stop) -> None:
    """Produce ``rate`` events per second with event time = now until ``stop`` (runs in its own process)."""
    sender = Sender(bootstrap, topic)
    rng = random.Random(1)
    cumulative = np.cumsum(zipf_weights(keys)).tolist()
    prices = [level(i) for i in range(keys)]
    tick_s = 0.01
    next_tick = next_beat = time.time()
    carried = 0.0
    while not stop.is_set():
        now = time.time()
        now_ms = int(now * 1000)
        carried += rate * tick_s
        for _ in range(int(carried)):
            i = bisect.bisect_left(cumulative, rng.random() * cumulative[-1])
            prices[i] = max(1.0, prices[i] * (1 + rng.gauss(0, 0.0005)))
            sender.event(key_name(i), now_ms, round(prices[i] * 4) / 4, float(int(rng.lognormvariate(4, 1)) + 1))
        carried -= int(carried)
        if now >= next_beat:
            sender.heartbeat(now_ms)
            next_beat += HEARTBEAT_MS / 1000
        sender.producer.poll(0)
        next_tick += tick_s
        time.sleep(max(0.0, next_tick - time.time()))
    sender.flush()


@dataclass(frozen=True)
class LiveRow:
    """One live-latency row: a catalog at a feed rate (0: heartbeats only, the near-empty batch)."""

    name: str
    specs: tuple[SubscriptionSpec, ...]
    rate: int
    pane_ms: int = 1_000
    delay_ms: int = LIVE_DELAY_MS


SPARK_STAGES = ("latestOffset", "queryPlanning", "walCommit", "addBatch", "commitOffsets")  # in durationMs


def latency_run(spark, base: Settings, row: LiveRow, keys: int, warm_up_s: int, seconds: int,
                trigger_s: float) -> dict:
    """Feed ``row.rate`` events/s live for ``warm_up_s`` + ``seconds``; measure only after the warm-up.

    The warm-up holds the first evaluations, where every (subscription, key) already in its condition
    fires at once; alerts count only if their window became complete after it, and the per-batch
    profile covers only the batches that started after it.
    """
    tag = re.sub(r"[^A-Za-z0-9.]+", "-", f"{row.name} {trigger_s:g}").strip("-")  # a legal topic name
    settings = base.model_copy(update={
        "redis_prefix": f"bench-live-{tag}", "checkpoint_dir": str(base.data_dir / f"checkpoint-live-{tag}"),
        "events_topic": f"bench-live-{tag}", "dead_letter_topic": f"bench-live-dead-{tag}",
        "watermark_delay_ms": row.delay_ms, "trigger_interval": f"{trigger_s:g} seconds", "pane_ms": row.pane_ms,
    })
    ensure_topics(settings)
    install_catalog(settings, row.specs)
    print(f"live {row.name}, trigger {trigger_s:g} s ...", file=sys.stderr, flush=True)
    query = build_query(spark, settings)
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    stats_key = RedisKeys(settings).evaluator_stats
    context = multiprocessing.get_context("spawn")  # not a fork of a process holding a JVM gateway
    stop = context.Event()
    producer = context.Process(target=live_feed, args=(settings.kafka_bootstrap, settings.events_topic, keys,
                                                       row.rate, stop), daemon=True)
    seen: dict[int, dict] = {}
    deadline = time.monotonic() + 300
    while query.lastProgress is None and time.monotonic() < deadline:  # start-up (an empty first batch) is not
        if (failed := query.exception()) is not None:                  # what is measured
            raise failed
        time.sleep(0.2)
    begin = time.time()
    producer.start()
    warm = begin + warm_up_s
    at_warm: dict[str, float] | None = None
    try:
        with Resources() as rss:
            while time.time() - begin < warm_up_s + seconds:
                time.sleep(1)
                if (failed := query.exception()) is not None:
                    raise failed
                seen |= {p["batchId"]: p for p in query.recentProgress}
                if at_warm is None and time.time() >= warm:
                    at_warm = _numbers(client.hgetall(stats_key))
    finally:
        stop.set()
        producer.join(30)
        stop_between_batches(query, stop_file(settings, TRADES), 300)
        seen |= {p["batchId"]: p for p in query.recentProgress}
        handoff_left(settings)  # its alerts are in the stream read below, and out of the next row's way
    at_end = _numbers(client.hgetall(stats_key))
    times = key_event_times(settings.kafka_bootstrap, settings.events_topic)
    latencies, from_first, from_last = [], [], []
    for entry_id, fields in text_entries(client.xrange(RedisKeys(settings).alerts_stream)):
        written = int(entry_id.split("-")[0]) / 1000
        alert = json.loads(fields["alert"])
        decidable = (alert["window_end"] + settings.watermark_delay_ms) / 1000
        if decidable >= warm:
            latencies.append(written - decidable)
            first, last = deciding_events_ms(times, alert["key"], alert["window_end"], settings.pane_ms)
            from_first.append(written - first / 1000)
            from_last.append(written - last / 1000)
    ordered = [p for _, p in sorted(seen.items())]
    steady = [p for p in ordered if batch_end_s(p) - p["durationMs"].get("triggerExecution", 0) / 1000 >= warm]
    n = max(len(steady), 1)
    processed = sum(p["numInputRows"] for p in steady)
    starts = [batch_end_s(p) - p["durationMs"].get("triggerExecution", 0) / 1000 for p in steady]
    gaps = [start - batch_end_s(before) for before, start in zip(steady, starts[1:], strict=False)]
    diff = {k: at_end.get(k, 0.0) - (at_warm or {}).get(k, 0.0) for k in at_end}
    pipe = client.pipeline(transaction=False)
    for spec in row.specs:
        pipe.hlen(RedisKeys(settings).firing(spec.id))
    firing = sum(pipe.execute())
    pairs = sum(len(spec.keys) if spec.keys is not None else keys for spec in row.specs)  # (subscription, key)
    return {
        "latencies": latencies, "from_first": from_first, "from_last": from_last,
        "batches": len(steady), "batch_rows": processed / n,
        "batch_ms": sum(p["durationMs"].get("triggerExecution", 0) for p in steady) / n,
        "gap_ms": 1000 * sum(gaps) / max(len(gaps), 1),
        "rate": processed / (batch_end_s(steady[-1]) - starts[0]) if steady else float("nan"),
        "behind": _behind(settings, ordered), "rss_mb": rss.rss_mb,
        "transitions": diff.get("transitions", 0.0) / n,
        "warm_up_alerts": client.xlen(RedisKeys(settings).alerts_stream) - len(latencies),
        "firing_share": firing / pairs,
        "spark_ms": {s: sum(p["durationMs"].get(s, 0) for p in steady) / n for s in SPARK_STAGES},
        "task_ms": {s: diff.get(f"{s}_ms_total", 0.0) / n for s in STAGES},
        "restores": [int(diff.get(f"shard_restore_{how}", 0)) for how in RESTORES],
        "state_ms": diff.get("restore_state_ms_total", 0.0) / n,
        "log_read_ms": diff.get("restore_log_read_ms_total", 0.0) / n,
        "transfer_ms": diff.get("shard_host_transfer_ms_total", 0.0) / n,
    }


def key_event_times(bootstrap: str, topic: str) -> dict[str, np.ndarray]:
    """Every event's time on ``topic``, sorted, by key (heartbeats carry no key): a live run's alerts are timed
    from the events that decided them. Read back after the run, so the feed pays nothing for it."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-event-times",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions}
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        unread = {p for p, end in ends.items() if end > 0}
        by_key: dict[str, list[int]] = {}
        while unread:
            for message in consumer.consume(10_000, timeout=1.0):
                if message.error() is not None:
                    continue
                offset, partition = message.offset(), message.partition()
                if offset is not None and partition is not None and offset >= ends[partition] - 1:
                    unread.discard(partition)
                key, value = message.key(), message.value()
                if key is not None and value is not None:
                    by_key.setdefault(key.decode(), []).append(json.loads(value)["ts"])
    finally:
        consumer.close()
    return {key: np.sort(np.asarray(ts, dtype=np.int64)) for key, ts in by_key.items()}


def deciding_events_ms(times: dict[str, np.ndarray], key: str, boundary: int, pane_ms: int) -> tuple[int, int]:
    """The first and last event times of ``key`` in the pane that ends at ``boundary``: the window ending there
    differs from the one before by that pane's events (the event that made the condition true is one of them)
    and by the pane that left it. A transition with no event of its key in that pane was decided by time alone
    (a pane leaving the window): its moment is the boundary itself."""
    ts = times.get(key)
    if ts is not None:
        lo, hi = np.searchsorted(ts, [boundary - pane_ms, boundary], side="left")
        if hi > lo:
            return int(ts[lo]), int(ts[hi - 1])
    return boundary, boundary


def _numbers(stats: dict) -> dict[str, float]:
    return {k: float(v) for k, v in text_hash(stats).items() if _is_number(v)}


def _behind(settings: Settings, progress: list[dict]) -> int:
    """Records in the log the query had not read when it stopped: its lag."""
    from ingest.kafka import topic_end_offsets

    if not progress:
        return -1
    read = json.loads(json.dumps(progress[-1]["sources"][0]["endOffset"]))
    read = json.loads(read) if isinstance(read, str) else read
    ends = topic_end_offsets(settings, settings.events_topic)
    return sum(end - int(read.get(str(p), 0)) for p, end in ends.items())


@dataclass(frozen=True)
class PeerRow:
    """One pipeline's drain of the peers' topic at one micro-batch size (``batch`` None: it has none)."""

    name: str
    batch: int | None
    rate: float
    rss_mb: float


def peer_rows(spark, base: Settings, specs, args, total_rows: int) -> list[PeerRow]:
    """The Spark ``window()`` peer at each window length and each ``--peer-batches`` size."""
    limits = thresholds(specs)
    rows = []
    for batch in counts(args.peer_batches):
        for seconds in counts(args.spark_windows):
            print(f"Spark window() {seconds} s, {batch:,} records per batch ...", file=sys.stderr, flush=True)
            with Resources() as rss:
                throughput, alerts, progress = spark_window_peer(
                    spark, bootstrap=base.kafka_bootstrap, topic=base.events_topic, rows=limits,
                    window_ms=seconds * SECOND, delay_ms=base.watermark_delay_ms, rows_per_batch=batch,
                    checkpoint=base.data_dir / f"checkpoint-spark-window-{seconds}-{batch}", total_rows=total_rows,
                    warm_up_rows=min(batch, total_rows // 2), budget_s=args.budget,
                )
            batch_ms = sum(p["durationMs"].get("triggerExecution", 0) for p in progress) / max(len(progress), 1)
            print(f"  {throughput} alerts={alerts} batch_ms={batch_ms:.0f}", file=sys.stderr, flush=True)
            rows.append(PeerRow(f"Spark window() {window_label(seconds)}", batch, throughput.rate, rss.rss_mb))
    return rows


#: Printed instead of the quixstreams peer's rows when this interpreter lacks it.
QUIX_MISSING = ("quixstreams peer skipped: quixstreams is not installed here (it is in the bench extra); "
                "run infra/bench-venv, then .venv-bench/bin/python benchmarks/pipeline.py")


def quix_rows(base: Settings, specs, args, total_rows: int) -> list[PeerRow]:
    """The quixstreams peer at each window length (it reads record by record: no batch size); run before Spark.

    quixstreams is in the ``bench`` extra, not the test venv (it pins pydantic below production's): without it
    the peer is left out, saying how to run it."""
    if importlib.util.find_spec("quixstreams") is None:
        print(QUIX_MISSING, flush=True)
        return []
    limits = thresholds(specs)
    rows = []
    for seconds in counts(args.quix_windows):
        print(f"quixstreams {seconds} s ...", file=sys.stderr, flush=True)
        with Resources() as rss:
            throughput, alerts = quixstreams_peer(
                bootstrap=base.kafka_bootstrap, topic=base.events_topic, rows=limits, window_ms=seconds * SECOND,
                state_dir=base.data_dir / f"quix-{seconds}", total_rows=total_rows,
                warm_up_rows=min(counts(args.peer_batches)),
                budget_s=args.budget,
            )
        print(f"  {throughput} alerts={alerts}", file=sys.stderr, flush=True)
        rows.append(PeerRow(f"quixstreams {window_label(seconds)}", None, throughput.rate, rss.rss_mb))
    return rows


def window_label(seconds: int) -> str:
    return f"{seconds // 60} min" if seconds % 60 == 0 else f"{seconds} s"


def counts(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def short(n: int) -> str:
    return f"{n // 1000}k" if n >= 1000 and n % 1000 == 0 else str(n)


def start_stack(name: str, shards: int = 2, partitions: int = 4) -> tuple[Path, Settings, Callable[[], None]]:
    """A Tansu broker and a Redis on free ports in a fresh work directory, the settings for them (``shards``
    shuffle partitions, ``partitions`` Kafka partitions of the events topic), and their stop."""
    work = Path(tempfile.mkdtemp(prefix=f"tocsin-{name}-"))
    kafka_port, redis_port = free_port(), free_port()
    broker = start_tansu("127.0.0.1", kafka_port, work / "tansu.log")
    redis_server = start_redis(redis_port, work / "redis", work / "redis.log")
    base = Settings(
        kafka_bootstrap=f"127.0.0.1:{kafka_port}", redis_url=f"redis://127.0.0.1:{redis_port}/0",
        events_topic=f"{name}-events", dead_letter_topic=f"{name}-dead", event_partitions=partitions,
        data_dir=work, spark_shuffle_partitions=shards, metrics_port_evaluator=0, max_window_ms=max(WINDOWS),
        database_url=f"sqlite:///{work / 'tocsin.db'}",  # the deployment id's database: not ./var of the caller
    )

    def stop() -> None:
        broker.stop()
        redis_server.stop()

    return work, base, stop


def publish_feed(base: Settings, n_keys: int, rate: int, seconds: int) -> tuple[list[str], int, int, float]:
    """Publish the benchmark's feed to ``base.events_topic``: its keys, start time, records and seconds taken."""
    keys = key_names(n_keys)
    start_ms = (int(time.time() * 1000) // 3_600_000 - 24) * 3_600_000  # in the past: never ahead of the clock
    create_event_topic(base, base.events_topic)
    total_rows, publish_s = publish(base, base.events_topic, stream(n_keys, rate, seconds, start_ms))
    print(f"published {total_rows:,} records in {publish_s:.1f} s", file=sys.stderr, flush=True)
    return keys, start_ms, total_rows, publish_s


def main() -> None:
    default_cap = Settings.model_fields["source_max_records_per_trigger"].default
    parser = cli.parser(__doc__, "python -m benchmarks.pipeline")
    parser.add_argument("--quick", action="store_true", help="small sizes and budgets (a smoke run)")
    add_markdown_option(parser)
    parser.add_argument("--keys", type=int, default=5_000, help="keys (active at a time, in the churn stream)")
    parser.add_argument("--rate", type=int, default=20_000, help="events per event-second")
    parser.add_argument("--seconds", type=int, default=200,
                        help="event-seconds in the stream (4M events by default: ~10 batches at the admission cap)")
    parser.add_argument("--cap", type=int, default=default_cap, help="records per micro-batch (admission cap)")
    parser.add_argument("--subscriptions", default="1000,10000,100000", help="collective rows")
    parser.add_argument("--naive", default="1000", help="naive rows (subscription counts)")
    parser.add_argument("--sweep-caps", default="20000", help="10k collective rows at these caps too")
    parser.add_argument("--high-selectivity", default="1000,10000", help="subscription counts of its rows")
    parser.add_argument("--churn", type=int, default=10_000, help="subscriptions (0: no row)")
    parser.add_argument("--semantics", default="10000",
                        help="subscription counts of the issue-16 mix rows (lifecycle clauses, crossings, CHANGE %%, "
                             "tuple windows, NO DATA), collective and naive")
    parser.add_argument("--churn-turnover", type=int, default=2_000, help="new keys per event-second")
    parser.add_argument("--two-streams", type=int, default=10_000,
                        help="subscriptions on trades in the two-stream row (a collective row's mix; 0: no row)")
    parser.add_argument("--hosts-subscriptions", type=int, default=1_000,
                        help="the two-stream row: the mix's first this many, over hosts' cpu and mem")
    parser.add_argument("--peer-subscriptions", type=int, default=10_000)
    parser.add_argument("--peer-batches", default=f"20000,{default_cap}",
                        help="records per micro-batch at which Tocsin and the Spark peer are compared, each at each")
    parser.add_argument("--spark-windows", default="60,300", help="window lengths (s) of the Spark window() peer")
    parser.add_argument("--quix-windows", default="60", help="window lengths (s) of the quixstreams peer")
    parser.add_argument("--budget", type=float, default=90.0, help="wall seconds per row after warm-up")
    parser.add_argument("--live-rates", default="0,1000,5000,20000,50000",
                        help="live feed rates (events/s) of the per-symbol alert mix; 0: heartbeats only (the floor)")
    parser.add_argument("--live-heavy-rates", default="1000", help="live feed rates of the heavy (old) mix")
    parser.add_argument("--live-share", type=float, default=0.005,
                        help="alert mix: about this share of the subscriptions over their threshold")
    parser.add_argument("--live-edge-share", type=float, default=0.03,
                        help="share of the live subscriptions watching a key's 10-second high/low against the "
                             "price it starts at: alerts that fire and resolve during the run, so there are some to time")
    parser.add_argument("--live-subscriptions", type=int, default=10_000)
    parser.add_argument("--live-warm-up", type=int, default=20, help="seconds fed before measuring")
    parser.add_argument("--live-seconds", type=int, default=60,
                        help="seconds measured after the warm-up (a p99 wants 200 alerts or more)")
    parser.add_argument("--trigger", type=float, default=1.0, help="trigger (s) of the live runs")
    parser.add_argument("--live-panes", default="1000",
                        help="pane widths (ms) of the alert mix's live rows: narrower panes decide a window sooner "
                             "after its events, at more boundaries a second (TOCSIN_PANE_MS)")
    parser.add_argument("--live-delays", default=str(LIVE_DELAY_MS),
                        help="allowed delays (ms) of the alert mix's live rows (TOCSIN_WATERMARK_DELAY_MS): a "
                             "boundary is decided by the first trigger tick after boundary + delay")
    parser.add_argument("--shards", type=int, default=2, help="shuffle partitions: one shard each (Tocsin's rows)")
    parser.add_argument("--partitions", type=int, default=4,
                        help="Kafka partitions of the events topic: one read-and-parse task each per batch")
    args = parser.parse_args()
    if not counts(args.peer_batches):
        parser.error("--peer-batches names no batch size: the peers are compared with Tocsin at one at least")
    if args.quick:
        args.keys, args.rate, args.seconds, args.cap, args.subscriptions, args.naive = 200, 200, 4, 200, "300", "300"
        args.sweep_caps, args.high_selectivity, args.churn, args.churn_turnover = "", "300", 300, 50
        args.semantics, args.two_streams, args.hosts_subscriptions = "300", 300, 30
        args.peer_subscriptions, args.peer_batches, args.spark_windows = 300, "100,200", "60"
        args.budget, args.live_rates, args.live_subscriptions, args.live_seconds = 60.0, "100", 300, 15
        args.live_heavy_rates, args.live_warm_up, args.live_panes = "", 5, "1000,250"

    load_before = psutil.getloadavg()
    begun = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    # topics bench-events, bench-dead (the peers' table reads them)
    _, base, stop_stack = start_stack("bench", args.shards, args.partitions)
    keys, start_ms, total_rows, publish_s = publish_feed(base, args.keys, args.rate, args.seconds)
    hosts_rows = 0
    if args.two_streams:
        hosts_topic = topic_name(HOSTS.name, base)
        create_event_topic(base, hosts_topic)
        hosts_rows, _ = publish(base, hosts_topic, stream(args.keys, args.rate, args.seconds, start_ms),
                                encode=host_value, reference=host_reference)
    churn_topic, churn_rows = "bench-churn", 0
    if args.churn:
        create_event_topic(base, churn_topic)
        churn_rows, _ = publish(base, churn_topic, stream(args.keys, args.rate, args.seconds, start_ms,
                                                          turnover=args.churn_turnover, name=churn_key_name))

    def row(name: str, specs, mode: str = "collective", cap: int = args.cap, topic: str = base.events_topic,
            n_keys: int = args.keys) -> Row:
        return Row(name, specs, topic, mode, cap, n_keys)

    mix = {n: subscriptions(n, keys, args.rate) for n in {*counts(args.subscriptions), *counts(args.naive),
                                                          args.peer_subscriptions, args.churn, args.two_streams} if n}
    runs = [row(f"collective {short(n)}", mix[n]) for n in counts(args.subscriptions)]
    runs += [row(f"naive {short(n)}", mix[n], "naive") for n in counts(args.naive)]
    sweep_n = 10_000 if 10_000 in mix else max(mix)
    runs += [row(f"collective {short(sweep_n)} cap {short(c)}", mix[sweep_n], cap=c) for c in counts(args.sweep_caps)]
    peer_n = args.peer_subscriptions
    for b in counts(args.peer_batches):  # Tocsin at every batch size a peer runs at
        if not any(r.specs is mix[peer_n] and r.cap == b and r.mode == "collective" and r.topic == base.events_topic
                   for r in runs):
            runs.append(row(f"collective {short(peer_n)}" + ("" if b == args.cap else f" cap {short(b)}"),
                            mix[peer_n], cap=b))
    runs += [row(f"high selectivity {short(n)}", selective_subscriptions(n, keys, args.rate, args.seconds))
             for n in counts(args.high_selectivity)]
    for n in counts(args.semantics):
        semantic = semantics_subscriptions(n, keys, args.rate)
        runs += [row(f"issue-16 mix {short(n)}", semantic), row(f"issue-16 mix {short(n)} naive", semantic, "naive")]
    if args.churn:
        runs.append(row(f"key churn {short(args.churn)}", mix[args.churn], topic=churn_topic,
                        n_keys=args.keys + args.seconds * args.churn_turnover))
    two: TwoStreamRow | None = None
    if args.two_streams:
        n, m = args.two_streams, min(args.hosts_subscriptions, args.two_streams)
        single = next((r.name for r in runs if r.specs is mix[n] and r.mode == "collective" and r.cap == args.cap
                       and r.topic == base.events_topic), "")
        two = TwoStreamRow(f"trades {short(n)} + hosts {short(m)}", mix[n], on_hosts(mix[n][:m]), single, args.cap)
    peer_specs = mix[args.peer_subscriptions]
    peers: list[PeerRow] = []
    results: dict[str, dict] = {}
    two_result: dict | None = None
    live: dict[str, tuple[LiveRow, dict]] = {}
    spark = None
    try:
        peers += quix_rows(base, peer_specs, args, total_rows)
        spark = spark_session(base, "tocsin-benchmark")
        for r in runs:
            results[r.name] = throughput_run(spark, base, r, churn_rows if r.topic == churn_topic else total_rows,
                                             args.budget)
        if two is not None:
            reference = None
            if two.reference:
                m = len(two.hosts)
                alone = row_settings(base, two.reference, "collective", base.events_topic, two.cap)
                reference = {"finished": results[two.reference]["finished"], "rate": results[two.reference]["rate"],
                             "digests": alert_digests(alone, {"trades": lambda i: i,
                                                               "hosts": lambda i: i if i <= m else None})}
            two_result = two_stream_run(spark, base, two, total_rows, hosts_rows, args.budget, reference)
            two_result["single_rate"] = reference["rate"] if reference else float("nan")
        peers = peer_rows(spark, base, peer_specs, args, total_rows) + peers
        for lr in live_rows(args, keys):
            live[lr.name] = (lr, latency_run(spark, base, lr, args.keys, args.live_warm_up, args.live_seconds,
                                             args.trigger))
    finally:
        if spark is not None:
            stop_session(spark)
        stop_stack()
    load_after = psutil.getloadavg()
    report(args, runs, results, peers, live, total_rows, publish_s, begun, load_before, load_after, two, two_result)


def live_rows(args, keys: list[str]) -> list[LiveRow]:
    """The per-symbol alert mix at each feed rate (0: calibrated at 1,000), then the heavy mix's rows.

    Realistic (:func:`alert_subscriptions`): one key per subscription, about ``--live-share`` of them
    over their threshold, the rest comfortably not, as users set price and volume alerts, and about
    ``--live-edge-share`` breakout alerts, which fire and resolve while the run is measured. Heavy: the
    throughput rows' mix (every key, thresholds calibrated at 20,000 events/s, price thresholds near
    many keys' levels), whose pairs flap on the random-walk feed (~5 transitions per event) -- kept to
    show what a catalog of thresholds at the keys' levels costs.
    """
    n = args.live_subscriptions
    rows = [LiveRow((f"alerts {rate:,}" if rate else "alerts 0 (heartbeats only)") + setting_label(pane, delay),
                    alert_subscriptions(n, keys, rate or 1_000, args.live_share, edge_share=args.live_edge_share),
                    rate, pane, delay)
            for rate in counts(args.live_rates) for pane in counts(args.live_panes) for delay in counts(args.live_delays)]
    heavy = subscriptions(n, keys, 20_000)
    return rows + [LiveRow(f"heavy {rate:,}", heavy, rate) for rate in counts(args.live_heavy_rates)]


def setting_label(pane_ms: int, delay_ms: int) -> str:
    """A live row's name names its panes and allowed delay when they are not the table's (1 s and 0.5 s)."""
    return ("" if pane_ms == 1_000 else f", panes {pane_ms} ms") + ("" if delay_ms == LIVE_DELAY_MS
                                                                    else f", delay {delay_ms} ms")


def peer_table(args, runs: list[Row], results: dict[str, dict], peers: list[PeerRow]) -> tuple:
    """Tocsin and each peer at equal records per micro-batch, then each at its best size. The ratio is
    Tocsin's events/s at the row's batch size over the row's: a batch size favours both pipelines (Spark
    more, its fixed cost per batch being higher), so pipelines are only compared at the same one. quixstreams
    reads record by record; it is set beside Tocsin at the smallest size, the peers' usual setting."""
    name = f"collective {short(args.peer_subscriptions)}"  # at the production cap, or only at a peer's size
    peer_specs = next(r.specs for r in runs if r.name == name or r.name.startswith(f"{name} cap "))
    tocsin = {r.cap: PeerRow("Tocsin collective", r.cap, results[r.name]["rate"], results[r.name]["rss_mb"])
              for r in runs if r.specs is peer_specs and r.mode == "collective" and r.topic == "bench-events"}
    sizes = [b for b in counts(args.peer_batches) if b in tocsin]
    table: list[tuple[str, PeerRow, PeerRow]] = []  # (label, row, Tocsin's row it is compared with)
    for b in sizes:
        table += [("same batch", row, tocsin[b]) for row in [tocsin[b], *(p for p in peers if p.batch == b)]]
    table += [("per record", p, tocsin[min(sizes)]) for p in peers if p.batch is None]
    best_tocsin = max(tocsin.values(), key=lambda r: r.rate)
    for name in dict.fromkeys(p.name for p in peers if p.batch is not None):
        best = max((p for p in peers if p.name == name), key=lambda r: r.rate)
        table.append(("each at its best", best, best_tocsin))
    return (
        f"Peers at equal batch sizes: {args.peer_subscriptions:,} subscriptions' thresholds, the same topic and "
        "data, rows processed per wall second; x Tocsin = Tocsin's events/s at the batch size it is set beside "
        "over the row's (peak RSS of the process tree, Spark rows include the JVM)",
        ["compared", "pipeline", "records per batch", "events/s", "peak RSS MB", "Tocsin's records per batch",
         "x Tocsin"],
        [[label, row.name, "per record" if row.batch is None else f"{row.batch:,}", row.rate, row.rss_mb,
          f"{versus.batch:,}", versus.rate / row.rate if row.rate > 0 else float("nan")]
         for label, row, versus in table],
    )


def report(args, runs: list[Row], results: dict[str, dict], peers, live: dict[str, tuple[LiveRow, dict]],
           total_rows: int, publish_s: float, begun: str, load_before, load_after,
           two: TwoStreamRow | None = None, two_result: dict | None = None) -> None:
    naive = {id(r.specs): results[r.name]["rate"] for r in runs if r.mode == "naive"}  # by mix, not by size
    tables = [(
        f"Sustained throughput (backlog drain), {args.rate:,} events per event-second, {args.seconds} event-seconds, "
        "local[2]; events/s = rows processed after the first batch / wall time of their batches; first batch s = "
        "the first batch, where every subscription is new over the backlog (each shard evaluates up to "
        "TOCSIN_EVALUATOR_ADMISSION_TRANSITIONS of their first transitions a batch, the rest wait; the batch stores "
        "up to TOCSIN_SINK_BATCH_TRANSITIONS itself); longest batch s = the stream's longest wait; admitted after s = "
        "from the first batch's start to every subscription admitted; handed over = transitions stored after their "
        "batch, by the sink's handoff; handoff left s = how long it still stored after the stream's last batch",
        ["row", "subscriptions", "keys", "events/s", "events done", "finished", "batches", "events/batch",
         "batch ms", "transitions/batch", "candidates/boundary", "matches/boundary", "selectivity %",
         "peak RSS MB", "first batch s", "longest batch s", "admitted after s", "handed over", "handoff left s",
         "vs naive"],
        [[r.name, f"{len(r.specs):,}", f"{r.keys:,}", x["rate"], x["events"], "yes" if x["finished"] else "budget",
          x["batches"], x["batch_rows"], x["batch_ms"], x["transitions"], x["candidates"], x["matches"],
          100 * x["selectivity"], x["rss_mb"], x["first_s"], x["longest_s"], x["admitted_s"], x["handed_over"],
          x["handoff_s"],
          x["rate"] / naive[id(r.specs)] if r.mode == "collective" and id(r.specs) in naive else float("nan")]
         for r in runs for x in [results[r.name]]],
    ), (
        "Where the time goes: µs per record read. Stages: wall time inside the tasks, both cores summed; rest = "
        "2 cores x batch wall time - the stages (shuffle, Arrow transfers, scheduling, state commit, idle or "
        "lent cores); tree CPU = CPU time of the whole process tree, what the row costs on idle cores",
        ["row", *STAGES, "rest", "2 cores x wall", "tree CPU", "restore share %", "without rebuilds %",
         "restore ms each cached/caught up/rebuilt", "shard restores cached/caught up/rebuilt",
         "evaluate ms per shard boundary", "of evaluate: to and from shard hosts"],
        [[r.name, *(x["us"][s] for s in STAGES), x["cores_us"] - sum(x["us"].values()), x["cores_us"], x["cpu_us"],
          100 * x["restore_share"], 100 * x["steady_restore_share"], "/".join(f"{ms:.1f}" for ms in x["restore_ms"]),
          "/".join(map(str, x["restores"])), x["evaluate_ms"], x["transfer_us"]]
         for r in runs for x in [results[r.name]]],
    )]
    if two is not None and two_result is not None:
        x = two_result
        tables.append((
            "Two streams at once (a query per stream): trades with the collective mix beside hosts (the same feed "
            "relabelled, cpu = price and mem = volume, under the mix's first subscriptions over cpu and mem), both "
            "draining their backlog from the start; events/s per stream as above, total = both streams' rows after "
            "their first batch / wall time from the first warm-up to the last batch; alerts: each stream's "
            "transitions against the same subscriptions' in the single-stream collective row over the same feed",
            ["row", "trades subscriptions", "hosts subscriptions", "trades events/s", "hosts events/s",
             "total events/s", "single-stream events/s", "finished trades/hosts", "batches trades/hosts",
             "trades alerts", "hosts alerts", "tree CPU µs per record", "peak RSS MB"],
            [[two.name, f"{len(two.trades):,}", f"{len(two.hosts):,}", x["trades"].rate, x["hosts"].rate,
              x["total"].rate, x["single_rate"], "/".join("yes" if t.finished else "budget"
                                                          for t in (x["trades"], x["hosts"])),
              "/".join(map(str, x["batches"])), x["alerts"]["trades"], x["alerts"]["hosts"], x["cpu_us"],
              x["rss_mb"]]],
        ))
    tables.append(peer_table(args, runs, results, peers))
    warm = f"after a {args.live_warm_up} s warm-up, {args.live_seconds} s measured"

    def spread(seconds: list[float], qs: tuple[float, ...]) -> list[float]:
        return percentiles(seconds, qs, 1.0) if seconds else [float("nan")] * len(qs)

    tables.append((
        f"Alert latency, live feed, {args.live_subscriptions:,} subscriptions, trigger {args.trigger:g} s, "
        f"cap {args.cap:,}, panes of 1 s and allowed delay {LIVE_DELAY_MS / 1000:g} s unless the row names others, {warm}: "
        "alerts whose window completed after the warm-up. From the event: the deciding pane's first event of the "
        "alert's key (the event that made the condition true is that one or later: an upper bound; the boundary "
        "itself when no event of the key was in that pane, time alone deciding) -> alert in Redis, and from its "
        "last (a lower bound). Decision: the window complete in the log (boundary + allowed delay) -> alert in "
        "Redis. Tick floor: the p99 wait from an event to the trigger's tick that starts its deciding batch "
        "(benchmarks/latency_floor.py: panes and ticks aligned; a boundary decidable exactly at a tick decided there, "
        "the feed never lagging) plus the row's mean batch: a lower bound, no batch ever late",
        ["mix, feed events/s", "processed events/s", "events/batch", "transitions/batch", "batch ms", "gap ms",
         "lag at end", "firing % of pairs watched", "warm-up alerts", "alerts", "from the event p50 s",
         "p95 s", "p99 s", "max s", "tick floor p99 s", "from the last event p99 s", "decision p50 s",
         "decision p99 s", "peak RSS MB"],
        [[name, x["rate"], x["batch_rows"], x["transitions"], x["batch_ms"], x["gap_ms"], f"{x['behind']:,}",
          100 * x["firing_share"], x["warm_up_alerts"], len(x["latencies"]),
          *spread(x["from_first"], (50, 95, 99, 100)),
          tick_wait_s(row.pane_ms, row.delay_ms, 0, round(args.trigger * 1000), 99) + x["batch_ms"] / 1000,
          *spread(x["from_last"], (99,)), *spread(x["latencies"], (50, 99)), x["rss_mb"]]
         for name, (row, x) in live.items()],
    ))
    tables.append((
        "Where a live batch's time goes, ms per batch after the warm-up: Spark's own stages (durationMs: "
        "offsets, planning, write-ahead log, the batch's execution = addBatch, offset commit), then inside "
        "addBatch the task time of each of our stages, both cores summed",
        ["mix, feed events/s", "trigger ms", *SPARK_STAGES, *(f"{s} (tasks)" for s in STAGES),
         "of restore: state store open", "of restore: change log read", "of evaluate: to and from shard hosts",
         "restore share %", "shard restores cached/caught up/rebuilt"],
        [[name, x["batch_ms"], *(x["spark_ms"][s] for s in SPARK_STAGES), *(x["task_ms"][s] for s in STAGES),
          x["state_ms"], x["log_read_ms"], x["transfer_ms"],
          100 * x["task_ms"]["restore"] / max(sum(x["task_ms"][s] for s in ("restore", "evaluate", "persist")), 1e-9),
          "/".join(map(str, x["restores"]))] for name, (_, x) in live.items()],
    ))
    print(f"\nPublished {total_rows:,} records (events and heartbeats) in {publish_s:.1f} s: "
          f"{total_rows / publish_s:,.0f} records/s (pre-serialised, librdkafka batches)")
    load = f"load average {load_before[0]:.1f} at the start, {load_after[0]:.1f} at the end"
    print(f"Run of {begun}, {psutil.cpu_count()} cores, {load}; {args.partitions} Kafka partitions, {args.shards} shards")
    print_tables(tables)


if __name__ == "__main__":
    with markdown_run():
        main()
