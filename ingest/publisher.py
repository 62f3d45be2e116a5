"""Publishing ``trades`` events (the market feed, the replay, tests): the built-in stream's publisher.

Events are keyed by ``key`` so one key always lands on one partition (and, later,
one evaluator shard). Heartbeats go to every partition explicitly. Raw records and
batches are judged against the ``trades`` schema by ``ingest.streams.StreamPublisher``
(the HTTP path's validator), rejects dead-lettered with their reasons.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from core.settings import Settings
from core.streams import trades_schema
from ingest.model import Event
from ingest.streams import EVENTS_PUBLISHED, StreamPublisher


class EventPublisher(StreamPublisher):
    """The ``trades`` stream's publisher, with shortcuts for :class:`ingest.model.Event` objects."""

    def __init__(self, settings: Settings, *, linger_ms: int = 5) -> None:
        super().__init__(settings, trades_schema(settings), linger_ms=linger_ms)

    def publish(self, event: Event) -> None:
        """One event as it is: an ``Event`` is a valid ``trades`` record by construction (tests write these)."""
        self.producer.send(self.topic, key=event.key.encode(), value=event.to_json())
        self.published += 1
        EVENTS_PUBLISHED.inc()

    def publish_raw(self, record: bytes | str | dict, source: str) -> bool:
        """Judge one raw record and route it; True if it was a good event."""
        text = json.dumps(record) if isinstance(record, dict) else record
        return self.publish_records([text], [source]).accepted == 1

    def publish_many(self, events: Iterable[Event]) -> int:
        """Events judged as one batch against the stream's schema (the feed's path); the number accepted."""
        texts = [event.model_dump_json() for event in events]
        return self.publish_records(texts, [f"event {i}" for i in range(len(texts))]).accepted
