"""Publishing records of a declared stream: judged against its schema, accepted ones to its topic, rejects
dead-lettered with their reasons.

The same judge as the HTTP publishing path (``core.streams.StreamValidator``): a
record the API would refuse is refused here with the same reason, and what lands
on the topic is the stream's wire form (``{"key", "ts" in epoch ms, attributes…,
dimensions…}``), keyed by the key and partitioned with murmur2 like every other
producer. The demo publishers (the market feed, the CSV/JSONL replay, the host
metrics) all go through :class:`StreamPublisher`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Self

import structlog
from kafka import KafkaProducer
from prometheus_client import Counter

from core.settings import Settings
from core.streams import RecordLimits, StreamSchema, StreamValidator, ValidatedBatch, topic_name
from ingest.model import DeadLetter, Heartbeat
from ingest.model import RecordLimits as LetterLimits

log = structlog.get_logger(__name__)

EVENTS_PUBLISHED = Counter("tocsin_ingest_events_total", "Events published to Kafka")
DEAD_LETTERS = Counter("tocsin_ingest_dead_letters_total", "Records sent to the dead-letter topic")
HEARTBEATS = Counter("tocsin_ingest_heartbeats_total", "Heartbeat records published")


def dead_letters(batch: ValidatedBatch, stream: str, sources: Sequence[str], limits: LetterLimits) -> list[DeadLetter]:
    """The letters of a batch's rejects: the reason, the record as sent, and ``stream <name>: <source>``."""
    return [DeadLetter.of(r.reason, r.raw, f"stream {stream}: {sources[r.index]}", limits) for r in batch.rejected]


class StreamPublisher:
    """Validates and publishes batches of one stream's records (one Kafka producer, flushed on close)."""

    def __init__(self, settings: Settings, schema: StreamSchema, *, linger_ms: int = 5) -> None:
        self.settings = settings
        self.schema = schema
        self.topic = topic_name(schema.name, settings)
        self.validator = StreamValidator(schema, RecordLimits.of(settings))
        self.letter_limits = LetterLimits.of(settings)
        self.producer = KafkaProducer(
            bootstrap_servers=settings.kafka_bootstrap,
            linger_ms=linger_ms,
            acks="all",
            request_timeout_ms=max(settings.kafka_request_timeout_ms, 1_000),
        )
        self.published = 0
        self.dead_lettered = 0

    def publish_records(self, records: Sequence[str | bytes], sources: Sequence[str]) -> ValidatedBatch:
        """Judge a batch of raw records (JSON texts as a publisher sent them) and route each; ``sources[i]``
        names record ``i`` in its dead letter (``trades.csv:4``)."""
        batch = self.validator.validate(records)
        for key, wire in zip(batch.keys, batch.records, strict=True):
            self.producer.send(self.topic, key=key.encode(), value=wire.encode())
        self.published += batch.accepted
        EVENTS_PUBLISHED.inc(batch.accepted)
        for letter in dead_letters(batch, self.schema.name, sources, self.letter_limits):
            self.dead_letter(letter)
        return batch

    def dead_letter(self, letter: DeadLetter) -> None:
        self.producer.send(self.settings.dead_letter_topic, value=letter.to_json())
        self.dead_lettered += 1
        DEAD_LETTERS.inc()
        log.warning("dead_letter", reason=letter.reason, source=letter.source)

    def heartbeat(self, ts: int) -> None:
        """Tell every partition of the stream's topic that the source has progressed to event time ``ts``."""
        for partition in self.producer.partitions_for(self.topic):
            self.producer.send(self.topic, value=Heartbeat(partition=partition, ts=ts).to_json(), partition=partition)
            HEARTBEATS.inc()

    def flush(self) -> None:
        self.producer.flush()

    def close(self) -> None:
        self.producer.flush()
        self.producer.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
