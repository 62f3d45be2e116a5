"""Under the query, each shard's batches run on its host: with two shards on two Python workers, no batch catches
up a copy another worker left behind (without hosts, the shards swap workers every other batch and replay)."""

from __future__ import annotations

import threading

import pytest
import redis

from core.redis_schema import RedisKeys
from core.settings import Settings
from evaluator.spark.job import build_query
from evaluator.spec import SubscriptionSpec
from ingest.kafka import ensure_topics
from ingest.model import Event
from ingest.publisher import EventPublisher
from subscriptions.language import parse_condition
from tests.evaluator.spark.queries import stop_query
from tests.evaluator.spark.test_job import publish_catalog, recent_base
from tests.evaluator.streams import wait_until

pytestmark = pytest.mark.spark


@pytest.mark.slow  # CI: ~30 s; tests/evaluator/spark/test_shard_host.py runs the hosts without Spark
def test_every_batch_of_a_shard_finds_its_copy_on_its_host(spark, settings: Settings) -> None:
    ensure_topics(settings)
    publish_catalog(settings, SubscriptionSpec(1, parse_condition("COUNT(*) OVER 5s >= 2")))
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    stats = RedisKeys(settings).evaluator_stats
    base = recent_base()
    query = build_query(spark, settings)
    stop = threading.Event()

    def feed() -> None:  # events of many keys (both shards) and heartbeats: every shard runs every batch
        with EventPublisher(settings) as publisher:
            ts = base
            while not stop.wait(0.2):
                for key in "ABCDEFGH":
                    publisher.publish(Event(key=key, ts=ts, price=1, volume=1))
                ts += 200
                publisher.heartbeat(ts)

    feeding = threading.Thread(target=feed, daemon=True)
    feeding.start()
    try:
        # polled, not processAllAvailable: the feed never runs dry
        wait_until(lambda: int(client.hget(stats, "shard_batches") or 0) >= 16, 120, query=query)
    finally:
        stop.set()
        feeding.join()
        stop_query(query, settings)
    got = client.hgetall(stats)
    shards = settings.spark_shuffle_partitions
    assert int(got.get("shard_host_failures", 0)) == 0
    assert int(got.get("shard_restore_rebuilt", 0)) == shards, "each shard's host built its copy once"
    assert int(got.get("shard_restore_caught_up", 0)) == 0, "no batch replayed a copy another worker left behind"
    assert int(got["shard_restore_cached"]) >= 14
