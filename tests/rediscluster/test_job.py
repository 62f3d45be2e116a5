"""The production streaming query writing to a Redis Cluster: catalog, shard clocks, read stats and alerts
of subscriptions in different slot partitions (Spark: run under ``flock /tmp/tocsin-spark.lock``)."""

from __future__ import annotations

import json

import pytest
import redis

from core.catalog_log import CatalogLog
from core.redis_schema import RedisKeys, shard_clocks
from core.settings import Settings
from evaluator.catalog import Catalog
from evaluator.spark.job import build_query
from evaluator.spec import SubscriptionSpec
from ingest.kafka import ensure_topics
from ingest.model import Event
from ingest.publisher import EventPublisher
from subscriptions.language import parse_condition
from subscriptions.service import publish_catalog
from tests.evaluator.spark.test_job import recent_base, wait

pytestmark = [pytest.mark.spark, pytest.mark.slow]  # Spark on a Redis Cluster: CI runs it


def test_the_query_fires_and_resolves_into_the_cluster(spark, cluster_settings: Settings,
                                                       cluster_client: redis.Redis) -> None:
    settings, client = cluster_settings, cluster_client
    keys = RedisKeys(settings)
    ensure_topics(settings)
    assert keys.partition(7) != keys.partition(8)
    assert publish_catalog(client, keys, Catalog(1, (
        SubscriptionSpec(7, parse_condition("COUNT(*) OVER 5s >= 3"), frozenset({"K1"})),
        SubscriptionSpec(8, parse_condition("MAX(price) OVER 5s > 100")))))
    assert CatalogLog(client, keys).version() == 1

    def transitions() -> list[dict]:
        return [json.loads(f["alert"]) for stream in keys.alerts_streams for _, f in client.xrange(stream)]

    base = recent_base()
    query = build_query(spark, settings)
    try:
        with EventPublisher(settings) as publisher:
            for i in range(3):
                publisher.publish(Event(key="K1", ts=base + i * 200, price=50, volume=1))
            publisher.publish(Event(key="K2", ts=base, price=150, volume=1))
            publisher.heartbeat(base + 4_000)
        wait(query, lambda: len(transitions()) >= 2)
        assert {(t["subscription_id"], t["key"], t["state"]) for t in transitions()} == {
            (7, "K1", "firing"), (8, "K2", "firing")}
        assert set(client.hkeys(keys.firing(7))) == {"K1"} and set(client.hkeys(keys.firing(8))) == {"K2"}
        with EventPublisher(settings) as publisher:  # every window drains
            publisher.heartbeat(base + 20_000)
        wait(query, lambda: len(transitions()) >= 4)
    finally:
        query.stop()
    for sid in (7, 8):  # each subscription's transitions in its own partition's stream, in order
        own = [t["state"] for t in map(json.loads, (f["alert"] for _, f in client.xrange(
            keys.alerts_stream_of(keys.partition(sid)))))]
        assert own == ["firing", "resolved"]
        assert client.hlen(keys.firing(sid)) == 0
        assert client.hgetall(keys.counters(sid)) == {"firing": "1", "resolved": "1"}
    stats = client.hgetall(keys.evaluator_stats)
    assert stats["transitions"] == "4" and shard_clocks(stats)
    assert int(stats["read_rows"]) >= 5  # the source's per-slice profile reached the cluster too
