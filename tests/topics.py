"""Kafka topics in tests: one deleted and gone, as a stream's is before the stream is declared again."""

from __future__ import annotations

import time

from kafka.admin import KafkaAdminClient

from core.settings import Settings
from devstack.patience import patient


def delete_topic(settings: Settings, topic: str | None = None) -> None:
    """Delete ``topic`` (the event topic by default) and wait until the broker no longer names it."""
    topic = topic or settings.events_topic
    admin = KafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    try:
        admin.delete_topics([topic])
        deadline = time.monotonic() + patient(30)
        while topic in admin.list_topics():
            assert time.monotonic() < deadline, f"the deleted topic {topic} is still there"
            time.sleep(0.1)
    finally:
        admin.close()
