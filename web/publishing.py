"""The web process's Kafka producer for published records, with admission control (backpressure).

librdkafka (``confluent_kafka``) rather than kafka-python: it batches and sends in
C threads, so producing is a C call per record (see benchmarks/publish.py for the
measured difference). Records are partitioned with ``murmur2_random``, the Java
client's and kafka-python's partitioner, so a key lands on the same partition
whoever publishes it (the evaluator relies on one partition per key).

A batch is admitted only if the records and bytes the process holds undelivered
stay within the settings, and those of its publisher token within the token's
share of them (``publish_token_share``); otherwise the request gets a 429 with
``Retry-After`` and nothing of it is produced. A token also has at most
``publish_token_max_requests`` requests in progress. So one token flooding is
refused its excess while the others keep their room. One batch is always admitted
when none is in flight (of the process, of the token), so any request within the
size limits can eventually pass. A request
answers once Kafka acknowledged (``acks=all``) every record of its batch, or
after ``publish_delivery_timeout_ms`` with the number not acknowledged.

Heartbeats. The evaluator's clock for a stream is its slowest partition's newest event time, and an
HTTP publisher cannot write to a partition its keys do not hash to: a stream with a few keys on many
partitions would never close a window. So once a batch is stored, the process sends a heartbeat at the
batch's newest event time to every partition of the stream's topic (what ``ingest``'s publishers do
for the demo streams), at most once per ``publish_heartbeat_ms`` per stream; the poller sends the
newest time a paced round held back, so the last batch before a pause is never left out. A heartbeat
never carries a time ahead of this process's clock: for a batch dated ahead (a publisher's clock
running fast), the rounds go on at the current time until they reach it (docs/clock.md).

Publishing's blocking work (the token's database check, judging a batch, producing it) runs on an
executor of its own, ``publish_threads`` threads (:func:`publishing_executor`), never on the thread
pool the UI's sync endpoints share: a publishing flood queues behind publishing only.

Dead letters (the batch's rejects, with their reasons) are a record of what was refused, not part of
what the publisher asked to store: a dead letter Kafka does not take (its topic refused, or missing on
a broker that does not create topics) is reported in the 202 and counted, never turned into a 503,
which would tell the publisher to send again records that are already stored.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

import redis
import structlog
from confluent_kafka import KafkaError, KafkaException, Message, Producer
from prometheus_client import Counter, Gauge
from redis import RedisError

from core.clock_ahead import ClockAhead, mark
from core.redis_schema import RedisKeys
from core.series_limit import Refusal, SeriesLimit
from core.settings import Settings
from core.streams import StreamSchema, ValidatedBatch
from evaluator.views import read_wire, split_cell
from ingest.model import Heartbeat

log = structlog.get_logger(__name__)

PUBLISHED = Counter("tocsin_publish_records_total", "Records published over HTTP, by stream and outcome",
                    ["stream", "outcome"])
REFUSED_BATCHES = Counter("tocsin_publish_backpressure_total", "Publish requests refused with 429 (backpressure)")
IN_FLIGHT = Gauge("tocsin_publish_inflight_records", "Records this process holds that Kafka has not acknowledged")
HEARTBEATS = Counter("tocsin_publish_heartbeats_total", "Heartbeats the web process sent for streams published over "
                     "HTTP (one per partition)", ["stream"])
CLOCK_AHEAD = Counter("tocsin_publish_clock_ahead_total", "Publish requests whose newest record was dated ahead of "
                      "this process's clock by more than TOCSIN_CLOCK_TOLERANCE_MS", ["stream", "token"])
DEAD_LETTERS_LOST = Counter("tocsin_publish_dead_letters_failed_total",
                            "Rejects of published batches that Kafka did not take on the dead-letter topic")


def within_series_limit(batch: ValidatedBatch, raw: Sequence[str | bytes], schema: StreamSchema,
                        limit: SeriesLimit, token: int | None = None) -> ValidatedBatch:
    """``batch`` with the records of new series beyond the stream's limit, or beyond publisher ``token``'s share of
    it (``core.series_limit``), made rejects: the evaluator would dead-letter the first, so a 202 must not count
    them accepted. The series admitted here are admitted for the evaluator too. Redis not answering: the batch as it
    is (the evaluator still holds the stream's limit)."""
    if not batch.accepted:
        return batch
    cells, ts, _ = read_wire(batch.records, schema.attribute_names, schema.dimension_names, schema.required_attributes)
    try:
        why = limit.event_refusals(schema.name, cells, ts, token)
    except RedisError as exc:
        log.warning("series_limit_not_checked", stream=schema.name, reason=f"{type(exc).__name__}: {exc}")
        return batch
    return batch.refusing({int(i): limit.reason(schema.name, *split_cell(cells[i]), Refusal(why[i]))
                           for i in why.nonzero()[0]}, raw)


def note_clock_ahead(client: redis.Redis, settings: Settings, stream: str, source: str, newest_ts: int) -> None:
    """A batch from ``source`` dated ahead of this process's clock: counted, and marked for the dead man's switch
    (``core.clock_ahead``). Its records are stored and count when their time comes; Redis not answering costs the
    mark only."""
    ahead_ms = newest_ts - int(time.time() * 1000)
    CLOCK_AHEAD.labels(stream, source).inc()
    log.warning("publisher_clock_ahead", stream=stream, source=source, ahead_ms=ahead_ms)
    try:
        mark(client, RedisKeys(settings), [ClockAhead(stream, source, ahead_ms, time.time())])
    except RedisError as exc:
        log.warning("clock_ahead_not_marked", stream=stream, reason=f"{type(exc).__name__}: {exc}")


T = TypeVar("T")
DeliveryCallback = Callable[..., None]  # (KafkaError | None, Message | None[, count])


class Backpressure(Exception):
    """The producer (or this token's share of it) holds too much undelivered: try again after ``retry_after_s``."""

    def __init__(self, retry_after_s: int, why: str = "the publisher is busy") -> None:
        super().__init__(f"{why}: retry after {retry_after_s} s")
        self.retry_after_s = retry_after_s


@dataclass
class _Clock:
    """A stream's heartbeats: the newest event time stored, the newest sent, when the last round went."""

    stream: str
    partitions: int
    newest: int = 0
    sent: int = 0
    round_at: float = float("-inf")


@dataclass
class _Delivery:
    """One batch's acknowledgements; ``done`` resolves when every record and dead letter is acknowledged or failed.

    ``failed``/``error`` concern the records, ``dead_failed``/``dead_error`` the dead letters (``letters`` of them).
    """

    pending: int
    size: int
    byte_size: int
    token: int
    owner: StreamProducer
    loop: asyncio.AbstractEventLoop
    done: asyncio.Future
    letters: int = 0
    failed: int = 0
    error: str | None = None
    dead_failed: int = 0
    dead_error: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def records(self) -> int:
        return self.size - self.letters

    def acknowledged(self, err: KafkaError | None, _msg: Message | None, count: int = 1) -> None:
        """Called per record by whichever thread polls the producer (``count`` > 1: records never produced)."""
        self._settle(err, count, dead=False)

    def dead_acknowledged(self, err: KafkaError | None, _msg: Message | None, count: int = 1) -> None:
        """As :meth:`acknowledged`, for a dead letter."""
        self._settle(err, count, dead=True)

    def _settle(self, err: KafkaError | None, count: int, dead: bool) -> None:
        with self.lock:
            if err is not None and dead:
                self.dead_failed += count
                self.dead_error = str(err)
            elif err is not None:
                self.failed += count
                self.error = str(err)
            self.pending -= count
            finished = self.pending == 0
        if finished:
            self.owner.release(self)
            self.loop.call_soon_threadsafe(self._resolve)

    def _resolve(self) -> None:
        if not self.done.done():
            self.done.set_result(None)


def dead_letters_failed(stream: str, delivery: _Delivery) -> str:
    """What a 202 says when some rejects did not reach the dead-letter topic; logged and counted once here."""
    DEAD_LETTERS_LOST.inc(delivery.dead_failed)
    log.error("publish_dead_letters_failed", stream=stream, failed=delivery.dead_failed, error=delivery.dead_error)
    return (f"{delivery.dead_failed} of {delivery.letters} rejects could not be dead-lettered ({delivery.dead_error}); "
            f"the accepted records are stored: do not send the batch again")


def publishing_executor(settings: Settings) -> ThreadPoolExecutor:
    """The web process's publishing threads (``publish_threads``), apart from the pool of sync endpoints."""
    return ThreadPoolExecutor(max_workers=settings.publish_threads, thread_name_prefix="publish")


async def on_publishing_threads(executor: Executor, fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)`` on the publishing executor, awaited."""
    return await asyncio.get_running_loop().run_in_executor(executor, partial(fn, *args))


class StreamProducer:
    """One per web process: produces batches, counts what is in flight, serves acknowledgements."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.producer = Producer({
            "bootstrap.servers": settings.kafka_bootstrap,
            "acks": "all",
            "linger.ms": settings.publish_linger_ms,
            "partitioner": "murmur2_random",
            "message.timeout.ms": settings.publish_delivery_timeout_ms,
            # Admission (below) is the limit; librdkafka's own queue has room for one more batch beyond it.
            "queue.buffering.max.messages": settings.publish_queue_max_messages + settings.publish_max_records + 1,
            "queue.buffering.max.kbytes": 2 * (settings.publish_max_inflight_bytes + settings.request_max_bytes) // 1024 + 1,
            "batch.num.messages": 10_000,
            "log_level": 3,
        })
        self._lock = threading.Lock()
        self._records = 0
        self._bytes = 0
        self._tokens: dict[int, list[int]] = {}  # publisher token id -> [records, bytes] in flight
        self._requests: dict[int, int] = {}  # publisher token id -> requests in progress
        self._token_records = max(1, int(settings.publish_queue_max_messages * settings.publish_token_share))
        self._token_bytes = max(1, int(settings.publish_max_inflight_bytes * settings.publish_token_share))
        self._clocks: dict[str, _Clock] = {}  # topic -> its heartbeats (see the module doc)
        self._closed = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="publish-acks", daemon=True)
        self._poller.start()

    @property
    def in_flight(self) -> tuple[int, int]:
        """(records, bytes) produced and not yet acknowledged."""
        return self._records, self._bytes

    def _poll(self) -> None:
        while not self._closed.is_set():
            self.producer.poll(0.05)
            self._beat()

    def published(self, stream: str, topic: str, partitions: int, newest_ts: int) -> None:
        """Records of ``stream`` up to event time ``newest_ts`` are stored: its partitions' heartbeats may move."""
        with self._lock:
            clock = self._clocks.setdefault(topic, _Clock(stream, partitions))
            clock.partitions = partitions
            clock.newest = max(clock.newest, newest_ts)
        self._beat()

    def _beat(self) -> None:
        """A heartbeat round for every stream whose newest time moved, unless it had one in the last interval."""
        interval = self.settings.publish_heartbeat_ms / 1000
        if not interval:
            return
        now = time.monotonic()
        wall_ms = int(time.time() * 1000)  # a heartbeat never claims a time ahead of this process's clock
        with self._lock:
            due = [(topic, clock.stream, clock.partitions, min(clock.newest, wall_ms))
                   for topic, clock in self._clocks.items()
                   if clock.newest > clock.sent and now - clock.round_at >= interval]
            for topic, *_rest, newest in due:
                self._clocks[topic].sent, self._clocks[topic].round_at = newest, now
        for topic, stream, partitions, newest in due:
            try:
                for partition in range(partitions):
                    self.producer.produce(topic, Heartbeat(partition=partition, ts=newest).to_json(),
                                          partition=partition)
                HEARTBEATS.labels(stream).inc(partitions)
            except (BufferError, KafkaException) as exc:  # the next batch's round carries the time on
                log.warning("publish_heartbeat_failed", topic=topic, error=str(exc))
                with self._lock:
                    self._clocks[topic].sent = 0

    def _refusal(self, records: int, size: int, token: int) -> str | None:
        """Why a batch of ``records`` records and ``size`` bytes of ``token`` is not admitted now (None: it is)."""
        if self._records > 0 and (self._records + records > self.settings.publish_queue_max_messages
                                  or self._bytes + size > self.settings.publish_max_inflight_bytes):
            return "the publisher is busy"
        held_records, held_bytes = self._tokens.get(token, (0, 0))
        if held_records > 0 and (held_records + records > self._token_records
                                 or held_bytes + size > self._token_bytes):
            return (f"this publisher token holds its share of the undelivered records ({self._token_records} "
                    f"records, {self._token_bytes} bytes)")
        return None

    def _refuse(self, why: str) -> Backpressure:
        REFUSED_BATCHES.inc()
        return Backpressure(self.settings.publish_retry_after_s, why)

    @contextmanager
    def request(self, token: int) -> Iterator[None]:
        """One request of publisher ``token`` in progress; :class:`Backpressure` if no batch would be admitted now.

        Entered before a request's body is read and judged: judging costs a core up to half a second per
        batch, which a request refused anyway should not cost while the process (or the token) is full.
        """
        with self._lock:
            why = self._refusal(1, 1, token)
            if why is None and self._requests.get(token, 0) >= self.settings.publish_token_max_requests:
                why = (f"this publisher token has {self.settings.publish_token_max_requests} requests at a time "
                       f"in progress")
            if why is not None:
                raise self._refuse(why)
            self._requests[token] = self._requests.get(token, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                self._requests[token] -= 1
                if not self._requests[token]:
                    del self._requests[token]

    def _admit(self, records: int, size: int, token: int) -> None:
        with self._lock:
            why = self._refusal(records, size, token)
            if why is not None:
                raise self._refuse(why)
            self._records += records
            self._bytes += size
            held = self._tokens.setdefault(token, [0, 0])
            held[0] += records
            held[1] += size
            IN_FLIGHT.set(self._records)

    def release(self, delivery: _Delivery) -> None:
        with self._lock:
            self._records -= delivery.size
            self._bytes -= delivery.byte_size
            held = self._tokens[delivery.token]
            held[0] -= delivery.size
            held[1] -= delivery.byte_size
            if not held[0]:
                del self._tokens[delivery.token]
            IN_FLIGHT.set(self._records)

    def send(self, loop: asyncio.AbstractEventLoop, done: asyncio.Future, topic: str, keys: Sequence[str],
             values: Sequence[str], dead_topic: str, dead_letters: Sequence[bytes], token: int = 0
             ) -> _Delivery | None:
        """Produce a batch of publisher ``token`` (records keyed by their key, then dead letters); None if empty.

        ``done`` (a future of ``loop``) resolves once every record is acknowledged or failed.

        Raises :class:`Backpressure` before producing anything when the batch is not admitted.
        """
        size = len(values) + len(dead_letters)
        if size == 0:
            return None
        encoded = [value.encode() for value in values]  # what Kafka holds is bytes (a character is up to 4)
        byte_size = sum(map(len, encoded)) + sum(map(len, dead_letters))
        self._admit(size, byte_size, token)
        delivery = _Delivery(size, size, byte_size, token, self, loop, done, letters=len(dead_letters))
        self._produce_all(topic, list(zip(keys, encoded, strict=True)), delivery.acknowledged)
        self._produce_all(dead_topic, [(None, letter) for letter in dead_letters], delivery.dead_acknowledged)
        return delivery

    def _produce_all(self, topic: str, records: list[tuple[str | None, bytes]], ack: DeliveryCallback) -> None:
        produced = 0
        try:
            for key, value in records:
                try:
                    self.producer.produce(topic, value, key, on_delivery=ack)
                except BufferError:
                    self._produce_when_room(topic, value, key, ack)
                produced += 1
        except KafkaException as exc:  # e.g. a topic librdkafka knows is gone: the rest fail, nothing hangs
            log.error("publish_failed", topic=topic, error=str(exc))
            ack(exc.args[0], None, len(records) - produced)

    def _produce_when_room(self, topic: str, value: bytes, key: str | None, ack: DeliveryCallback) -> None:
        """librdkafka's queue is full despite admission (another batch got in first): wait for acknowledgements."""
        while True:
            self.producer.poll(0.01)
            try:
                self.producer.produce(topic, value, key, on_delivery=ack)
                return
            except BufferError:
                continue

    def close(self) -> None:
        self._closed.set()
        self._poller.join(timeout=5)
        remaining = self.producer.flush(self.settings.publish_delivery_timeout_ms / 1000)
        if remaining:
            log.warning("publish_unflushed", records=remaining)
