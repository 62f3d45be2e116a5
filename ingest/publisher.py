"""Publishing validated events to Kafka, rejects to the dead-letter topic.

Events are keyed by ``key`` so one key always lands on one partition (and, later,
one evaluator shard). Heartbeats go to every partition explicitly.
"""

from __future__ import annotations

from collections.abc import Iterable

import structlog
from kafka import KafkaProducer
from prometheus_client import Counter

from core.settings import Settings
from ingest.model import DeadLetter, Event, Heartbeat, parse_event

log = structlog.get_logger(__name__)

EVENTS_PUBLISHED = Counter("tocsin_ingest_events_total", "Events published to Kafka")
DEAD_LETTERS = Counter("tocsin_ingest_dead_letters_total", "Records sent to the dead-letter topic")
HEARTBEATS = Counter("tocsin_ingest_heartbeats_total", "Heartbeat records published")


class EventPublisher:
    """Validates and publishes records; the one way anything writes the event topic."""

    def __init__(self, settings: Settings, *, linger_ms: int = 5) -> None:
        self.settings = settings
        self.producer = KafkaProducer(
            bootstrap_servers=settings.kafka_bootstrap,
            linger_ms=linger_ms,
            acks="all",
            request_timeout_ms=max(settings.kafka_request_timeout_ms, 1_000),
        )
        self.published = 0
        self.dead_lettered = 0

    def publish(self, event: Event) -> None:
        self.producer.send(self.settings.events_topic, key=event.key.encode(), value=event.to_json())
        self.published += 1
        EVENTS_PUBLISHED.inc()

    def dead_letter(self, letter: DeadLetter) -> None:
        self.producer.send(self.settings.dead_letter_topic, value=letter.to_json())
        self.dead_lettered += 1
        DEAD_LETTERS.inc()
        log.warning("dead_letter", reason=letter.reason, source=letter.source)

    def publish_raw(self, record: bytes | str | dict, source: str) -> bool:
        """Validate one raw record and route it; True if it was a good event."""
        parsed = parse_event(record, source=source)
        if isinstance(parsed, DeadLetter):
            self.dead_letter(parsed)
            return False
        self.publish(parsed)
        return True

    def publish_many(self, events: Iterable[Event]) -> int:
        count = 0
        for event in events:
            self.publish(event)
            count += 1
        return count

    def heartbeat(self, ts: int) -> None:
        """Tell every partition that the source has progressed to event time ``ts``."""
        for partition in self.producer.partitions_for(self.settings.events_topic):
            self.producer.send(
                self.settings.events_topic,
                value=Heartbeat(partition=partition, ts=ts).to_json(),
                partition=partition,
            )
            HEARTBEATS.inc()

    def flush(self) -> None:
        self.producer.flush()

    def close(self) -> None:
        self.producer.flush()
        self.producer.close()

    def __enter__(self) -> EventPublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
