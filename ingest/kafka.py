"""Kafka plumbing shared by producers, the Spark source and the tests.

The one subtle piece is :class:`LogEndProbe`. Some Kafka-protocol brokers
(Tansu, which we embed for local runs) answer ListOffsets(latest) with the base
offset of the last record batch plus one instead of the log end, which would make
a reader stop short of a final multi-record batch. The high watermark carried in
every Fetch response is right on Tansu and on Apache Kafka alike, so we read the
log end from there.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import structlog
from kafka import KafkaConsumer
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import TopicAlreadyExistsError

from core.settings import Settings

log = structlog.get_logger(__name__)


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


def partitions_of(consumer: KafkaConsumer, topic: str, timeout_s: float = 10.0) -> list[int]:
    """Partition ids of ``topic``, waiting for metadata to arrive (a topic being created is waited for)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = consumer.partitions_for_topic(topic)  # kafka-python: a cache miss fetches every topic's metadata
        if found:
            return sorted(found)
        if time.monotonic() > deadline:
            raise TimeoutError(f"topic {topic!r} has no partitions (does it exist?)")
        time.sleep(0.05)


def consumer_config(settings: Settings) -> dict[str, Any]:
    """A group-less consumer's configuration."""
    timeout_ms = max(settings.kafka_request_timeout_ms, 1_000)
    return {"bootstrap_servers": settings.kafka_bootstrap, "enable_auto_commit": False, "group_id": None,
            "request_timeout_ms": timeout_ms, "consumer_timeout_ms": 1_000}


def new_consumer(settings: Settings) -> KafkaConsumer:
    """A group-less consumer for explicit ``assign`` + ``seek`` reads."""
    return KafkaConsumer(**consumer_config(settings))


def topic_end_offsets(
    settings: Settings, topic: str, timeout_s: float = 10.0, wait_for_topic: bool = True
) -> dict[int, int]:
    """``{partition: log end offset}`` for every partition of ``topic``, or an error within about ``timeout_s``,
    the first connection included (``wait_for_topic``: see :class:`LogEndProbe`)."""
    return LogEndProbe(settings.kafka_bootstrap, topic, timeout_s, wait_for_topic).ends()  # closes its client


class LogEndProbe:
    """Log ends of one topic from Fetch high watermarks, asked again and again.

    A question asks ListOffsets(latest) for every partition in one request (the log end on Apache Kafka, the last
    batch's base offset + 1 on Tansu), assigns every non-empty partition one record before that and takes what is
    fetched until each has given a record or its end-of-partition event: the Fetch response that brought it carried
    the partition's high watermark, which librdkafka keeps (``get_watermark_offsets(cached=True)``). A fresh
    kafka-python client a question (before 2026-12-07) took 90 ms on a drain's backlog: a connection, metadata,
    and every record of the fetched batches polled one by one.

    ``keep_client``: the client (and the topic's partitions) is kept between questions: only in the
    evaluator's source, whose probe lives as long as its query. librdkafka 2.16 crashed the process (SIGSEGV) when a
    client that had read a topic assigned it again after the topic was deleted and created anew (a stream deleted
    and declared again); the web process must never die of that, so its probes make a client per question (5 ms).
    The source's probe drops its client at any failed question, which a deleted topic makes, so only a topic deleted
    and created again between two of its batches could still reach it (the crash is in librdkafka's metadata cache
    update at the fetch; ListOffsets cannot tell the new topic from the old on Tansu, whose answer is the last record
    batch's base offset + 1). A question that fails over a kept client is asked once more over a new one, within a
    timeout of its own: a client stuck in a state of its own must not fail the query; only a new client failing too
    says the broker is.

    Every wait is bounded by the probe's timeout, the first connection included, so /readyz and the dashboard
    answer with the broker down. ``wait_for_topic=False`` (probes asked by a dashboard or /readyz): a topic the
    broker's metadata does not name fails at once with :class:`TopicMissing` instead of being waited for as one
    being created. On any error the client is dropped and the next question makes a new one.
    """

    def __init__(self, bootstrap: str, topic: str, timeout_s: float = 10.0, wait_for_topic: bool = False,
                 keep_client: bool = False) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.timeout_s = timeout_s
        self.wait_for_topic = wait_for_topic
        self.keep_client = keep_client
        self._consumer: Any = None  # confluent_kafka's Consumer
        self._partitions_seen: tuple[float, list[int]] | None = None  # when the metadata was asked, what it said

    def ends(self) -> dict[int, int]:
        """``{partition: log end offset}``, or an error within about the probe's timeout (twice that when a kept
        client failed and a new one is asked)."""
        kept = self._consumer is not None
        try:
            return self._ask(time.monotonic() + self.timeout_s)
        except Exception as error:
            self._discard()
            if not kept or isinstance(error, TopicMissing):  # a new client's failure, or the broker's own answer
                raise
            log.warning("log-end question failed over the kept client; asking over a new one", topic=self.topic,
                        error=repr(error))
            try:
                return self._ask(time.monotonic() + self.timeout_s)
            except Exception:
                self._discard()
                raise
        finally:
            if not self.keep_client:
                self.close()

    def _ask(self, deadline: float) -> dict[int, int]:
        from confluent_kafka import KafkaError, KafkaException, TopicPartition

        if self._consumer is None:
            # fetch.wait.max.ms stays the slice readers' 5: at 1 (and 0) Tansu under a live feed left partitions
            # unanswered for the whole timeout, failing the query (pipeline benchmark, 50,000 events/s)
            self._consumer = new_reader(self.bootstrap, int(self.timeout_s * 1000), {"enable.partition.eof": True})
        consumer = self._consumer
        latest = consumer.offsets_for_times([TopicPartition(self.topic, p, LATEST) for p in self._partitions(deadline)],
                                            timeout=_left(deadline))  # ListOffsets(latest): one request, not one each
        failed = [answer for answer in latest if answer.error is not None]
        if failed:
            raise KafkaException(failed[0].error)
        lower = {answer.partition: answer.offset for answer in latest}
        waiting = {p for p, end in lower.items() if end > 0}
        if not waiting:
            return lower
        consumer.assign([TopicPartition(self.topic, p, lower[p] - 1) for p in sorted(waiting)])
        try:
            while waiting:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{self.topic}: no fetch response for partitions {sorted(waiting)}")
                # what is queued, without waiting; else wait for the next (consume() waits for its whole count)
                for message in consumer.consume(num_messages=10_000, timeout=0) or [consumer.poll(0.05)]:
                    if message is None:
                        continue
                    error = message.error()
                    if error is not None and error.code() != KafkaError._PARTITION_EOF:
                        raise KafkaException(error)
                    waiting.discard(message.partition())
            seen = {p: consumer.get_watermark_offsets(TopicPartition(self.topic, p), cached=True)[1]
                    for p, end in lower.items() if end > 0}
        finally:
            consumer.unassign()  # no fetching between questions
        return {p: max(seen.get(p, 0), end) for p, end in lower.items()}

    def _partitions(self, deadline: float) -> list[int]:
        """The topic's partitions, from metadata asked at most every ``METADATA_MAX_AGE_S`` (a metadata request
        took 2-6 ms of Tansu's, more than the rest of a question)."""
        from confluent_kafka import KafkaError, KafkaException

        if self._partitions_seen is not None and time.monotonic() - self._partitions_seen[0] < METADATA_MAX_AGE_S:
            return self._partitions_seen[1]
        while True:
            try:
                metadata = self._consumer.list_topics(self.topic, timeout=_left(deadline))
            except KafkaException as error:
                raise ConnectionError(f"Kafka bootstrap {self.bootstrap}: no metadata ({error})") from error
            topic = metadata.topics.get(self.topic)
            if topic is not None and topic.error is None and topic.partitions:
                self._partitions_seen = (time.monotonic(), sorted(topic.partitions))
                return self._partitions_seen[1]
            missing = topic is None or (topic.error is not None
                                        and topic.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART)
            if missing and not self.wait_for_topic:
                raise TopicMissing(f"topic {self.topic!r} does not exist")
            if time.monotonic() > deadline:
                raise TimeoutError(f"topic {self.topic!r} has no partitions (does it exist?)")
            time.sleep(0.05)

    def close(self) -> None:
        self._partitions_seen = None
        consumer, self._consumer = self._consumer, None  # dropped even if closing it fails: never asked again
        if consumer is not None:
            consumer.close()

    def _discard(self) -> None:
        """Close a client that just failed a question; its closing failing too is no news."""
        with contextlib.suppress(Exception):
            self.close()


#: ListOffsets' timestamp that asks for the latest offset (the log end on Apache Kafka).
LATEST = -1
#: How long a probe trusts a topic's partitions: a partition added later is asked about within this.
METADATA_MAX_AGE_S = 30.0


def _left(deadline: float) -> float:
    """Seconds until ``deadline``, at least a little: librdkafka takes a timeout of 0 as "do not wait"."""
    return max(deadline - time.monotonic(), 0.01)


def new_reader(bootstrap: str, request_timeout_ms: int, extra: dict[str, Any] | None = None) -> Any:
    """A librdkafka consumer (confluent_kafka's ``Consumer``) for reading slices (the live source's), history
    (backtests) and log ends: assigned explicitly, never committing (progress is Spark's checkpoint, or none; the
    group id is never joined), its own logging quiet but for errors; ``extra`` configuration on top."""
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
        **(extra or {}),
    })
