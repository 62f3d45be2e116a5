"""The publishing producer's admission counts what Kafka holds: bytes, not characters (real librdkafka)."""

from __future__ import annotations

import asyncio

from core.settings import Settings
from devstack.services import free_port
from web.publishing import StreamProducer


def test_in_flight_bytes_are_utf8_bytes_not_characters(settings: Settings) -> None:
    """A dimension of emoji is 4 bytes a character: counted as 1, the in-flight byte bound held 4x its setting."""
    settings = settings.model_copy(update={"kafka_bootstrap": f"127.0.0.1:{free_port()}",  # nobody: nothing acked
                                           "publish_delivery_timeout_ms": 1_000})
    producer = StreamProducer(settings)
    loop = asyncio.new_event_loop()
    try:
        values = ['{"key":"a","ts":1,"cpu":1,"region":"' + "\U0001f600" * 100 + '"}'] * 3
        letters = [b'{"reason":"x"}']
        delivery = producer.send(loop, loop.create_future(), "t", ["a"] * 3, values, "dead", letters)
        assert delivery is not None
        assert producer.in_flight == (4, sum(len(v.encode()) for v in values) + len(letters[0]))
        loop.run_until_complete(delivery.done)  # failed after the delivery timeout, and released
        assert delivery.failed == 4 and producer.in_flight == (0, 0)
    finally:
        producer.close()
        loop.close()
