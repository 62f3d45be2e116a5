"""A subscription deleted and re-created identically fires again (ids are never reused), on the real job."""

from __future__ import annotations

import pytest
import redis

from core.redis_schema import RedisKeys
from core.settings import Settings
from evaluator.spark.job import build_query
from ingest.kafka import ensure_topics
from ingest.publisher import EventPublisher
from subscriptions.db import session_factory
from subscriptions.schemas import SubscriptionIn
from subscriptions.service import SubscriptionService
from tests.evaluator.spark.queries import stop_query
from tests.evaluator.spark.test_job import publish_busy_key, recent_base, transitions, wait

pytestmark = pytest.mark.spark


@pytest.mark.slow  # ~25 s on the real job: CI runs it (without Spark: tests/evaluator/test_shard.py)
def test_delete_then_recreate_fires_again(spark, settings: Settings, owner) -> None:
    ensure_topics(settings)
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    data = SubscriptionIn(name="busy", condition="COUNT(*) OVER 5s >= 2")
    base = recent_base()
    with session_factory(settings.database_url)() as session:
        service = SubscriptionService(session, settings, client, owner)
        first = service.create(data).id
        query = build_query(spark, settings)
        try:
            publish_busy_key(settings, base)
            wait(query, lambda: any(t["subscription_id"] == first for t in transitions(settings)), timeout_s=60)

            before = len(transitions(settings))
            service.delete(first)  # at once, before the evaluator can have seen the catalog without it
            second = service.create(data).id
            assert second != first
            with EventPublisher(settings) as publisher:
                publisher.heartbeat(base + 5_000)
            wait(query, lambda: any(t["subscription_id"] == second and t["state"] == "firing"
                                    for t in transitions(settings)[before:]), timeout_s=60)
        finally:
            stop_query(query, settings)
    got = [(t["subscription_id"], t["state"]) for t in transitions(settings)]
    assert (second, "firing") in got and (first, "resolved") not in got
    assert list(client.hkeys(RedisKeys(settings).firing(second))) == ["A"]
