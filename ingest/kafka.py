"""Kafka plumbing shared by producers, the Spark source and the tests.

The one subtle piece is :func:`log_end_offsets`. Some Kafka-protocol brokers
(Tansu, which we embed for local runs) answer ListOffsets(latest) with the base
offset of the last record batch plus one instead of the log end, which would make
a reader stop short of a final multi-record batch. The high watermark carried in
every Fetch response is right on Tansu and on Apache Kafka alike, so we read the
log end from there.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import TopicAlreadyExistsError

from core.settings import Settings


def ensure_topics(settings: Settings, topics: dict[str, int] | None = None) -> None:
    """Create the event and dead-letter topics (idempotent): producers block on missing topics."""
    wanted = topics or {settings.events_topic: settings.event_partitions, settings.dead_letter_topic: 1}
    admin = KafkaAdminClient(
        bootstrap_servers=settings.kafka_bootstrap, request_timeout_ms=settings.kafka_request_timeout_ms
    )
    try:
        existing = set(admin.list_topics())
        missing = [NewTopic(name, n, 1) for name, n in wanted.items() if name not in existing]
        if missing:
            with contextlib.suppress(TopicAlreadyExistsError):  # another process made it meanwhile
                admin.create_topics(missing)
    finally:
        admin.close()


class TopicMissing(LookupError):
    """The broker's metadata names no such topic."""


def partitions_of(consumer: KafkaConsumer, topic: str, timeout_s: float = 10.0, wait_for_topic: bool = True) -> list[int]:
    """Partition ids of ``topic``, waiting for metadata to arrive. ``wait_for_topic=False`` (probes asked by a
    dashboard or /readyz): a topic the broker's fresh metadata does not name fails at once with
    :class:`TopicMissing` instead of being waited for as one being created."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = consumer.partitions_for_topic(topic)  # kafka-python: a cache miss fetches every topic's metadata
        if found:
            return sorted(found)
        if topic not in consumer.topics() and not wait_for_topic:  # topics() refreshes the metadata
            raise TopicMissing(f"topic {topic!r} does not exist")
        if time.monotonic() > deadline:
            raise TimeoutError(f"topic {topic!r} has no partitions (does it exist?)")
        time.sleep(0.05)


def consumer_config(settings: Settings, bounded: bool = False) -> dict[str, Any]:
    """A group-less consumer's configuration. ``bounded``: the first connection too gives up after the request
    timeout, not kafka-python's 30 s (a probe asked by /readyz or the dashboard must answer within its own)."""
    timeout_ms = max(settings.kafka_request_timeout_ms, 1_000)
    return {"bootstrap_servers": settings.kafka_bootstrap, "enable_auto_commit": False, "group_id": None,
            "request_timeout_ms": timeout_ms, "consumer_timeout_ms": 1_000,
            **({"bootstrap_timeout_ms": timeout_ms} if bounded else {})}


def new_consumer(settings: Settings, bounded: bool = False) -> KafkaConsumer:
    """A group-less consumer for explicit ``assign`` + ``seek`` reads (``bounded``: see :func:`consumer_config`)."""
    return KafkaConsumer(**consumer_config(settings, bounded))


def log_end_offsets(
    consumer: KafkaConsumer, partitions: Iterable[TopicPartition], timeout_s: float = 10.0
) -> dict[TopicPartition, int]:
    """The log end offset of each partition, taken from Fetch high watermarks.

    ``consumer`` must be fresh (no earlier fetch), because kafka-python keeps the
    last high watermark it saw and never resets it. We seek to one before the
    ListOffsets answer, which is at or after the start of the last batch on every
    broker, so the fetch carries at most one batch.
    """
    tps = list(partitions)
    consumer.assign(tps)
    lower = consumer.end_offsets(tps)
    for tp in tps:
        consumer.seek(tp, max(lower[tp] - 1, 0))
    deadline = time.monotonic() + timeout_s
    while any(consumer.highwater(tp) is None for tp in tps):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no fetch response for {[tp for tp in tps if consumer.highwater(tp) is None]}")
        consumer.poll(timeout_ms=50, max_records=1)
    return {tp: max(consumer.highwater(tp), lower[tp]) for tp in tps}


def topic_end_offsets(
    settings: Settings, topic: str, timeout_s: float = 10.0, wait_for_topic: bool = True
) -> dict[int, int]:
    """``{partition: log end offset}`` for every partition of ``topic``, or an error within about ``timeout_s``,
    the first connection included (``wait_for_topic``: see :func:`partitions_of`)."""
    bounded = min(settings.kafka_request_timeout_ms, int(timeout_s * 1000))
    consumer = new_consumer(settings.model_copy(update={"kafka_request_timeout_ms": bounded}), bounded=True)
    try:
        tps = [TopicPartition(topic, p) for p in partitions_of(consumer, topic, timeout_s, wait_for_topic)]
        return {tp.partition: end for tp, end in log_end_offsets(consumer, tps, timeout_s).items()}
    finally:
        consumer.close()


class LogEndProbe:
    """Log ends of one topic, asked again and again over one long-lived client.

    A fresh client per question costs a connection, metadata and a log line or
    two; the dashboard sampler asks every few seconds. A reused client keeps the
    last high watermark it saw, so each question waits until the fetch it makes
    returns a record of every non-empty partition: that response carries the
    current high watermark. On any error the client is dropped and the next
    question makes a new one. A topic that does not exist fails at once
    (:class:`TopicMissing`): waiting the whole timeout for it held up every
    question and the web app's shutdown, which waits for the question under way.
    """

    def __init__(self, settings: Settings, topic: str, timeout_s: float = 10.0) -> None:
        bounded = min(settings.kafka_request_timeout_ms, int(timeout_s * 1000))
        self.settings = settings.model_copy(update={"kafka_request_timeout_ms": bounded})
        self.topic = topic
        self.timeout_s = timeout_s
        self._consumer: KafkaConsumer | None = None

    def ends(self) -> dict[int, int]:
        """``{partition: log end offset}``, or an error within about the probe's timeout."""
        try:
            return self._ask()
        except Exception:
            self.close()
            raise

    def _ask(self) -> dict[int, int]:
        if self._consumer is None:
            self._consumer = new_consumer(self.settings, bounded=True)
        consumer = self._consumer
        tps = [TopicPartition(self.topic, p)
               for p in partitions_of(consumer, self.topic, self.timeout_s, wait_for_topic=False)]
        consumer.assign(tps)
        lower = consumer.end_offsets(tps)
        waiting = {tp for tp in tps if lower[tp] > 0}
        for tp in tps:
            consumer.seek(tp, max(lower[tp] - 1, 0))
        deadline = time.monotonic() + self.timeout_s
        while waiting:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no fetch response for {sorted(tp.partition for tp in waiting)}")
            waiting -= set(consumer.poll(timeout_ms=50, max_records=500))
        return {tp.partition: max(consumer.highwater(tp) or 0, lower[tp]) for tp in tps}

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


def new_reader(bootstrap: str, request_timeout_ms: int) -> Any:  # confluent_kafka's Consumer
    """A librdkafka consumer for reading slices (the live source's) and history (backtests): assigned explicitly,
    never committing (progress is Spark's checkpoint, or none; the group id is never joined), its own logging quiet
    but for errors."""
    from confluent_kafka import Consumer

    return Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": "tocsin-evaluator-source",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "socket.timeout.ms": request_timeout_ms,
        # A slice's first fetch after assign(): the broker may hold a fetch this long waiting for data, and
        # librdkafka's 500 ms default made every live slice take ~510 ms (one task per partition per batch).
        "fetch.wait.max.ms": 5,
        # A consumer back from the pool after a slice inside a backlog had queued ahead past its slice (up to
        # queued.min.messages); librdkafka then postponed the partition's next fetch by this much (1 s by
        # default), so the next slice it read waited a second for its first record: half the slices of a
        # 1M-event drain, which ran at ~65 % of its speed (docs/evaluator.md: *Reading Kafka and parsing*).
        "fetch.queue.backoff.ms": 5,
        # What it queues ahead of the reader (100,000 by default): more than a consume() takes (5,000), and
        # what lies past the slice's end is fetched and decoded for nothing (dropped at unassign).
        "queued.min.messages": 10_000,
        "log_level": 3,
    })
