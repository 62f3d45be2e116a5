"""The evaluator's job follows its query until stopped; a query that ends on its own is a failure, never a quiet
exit."""

from __future__ import annotations

import threading

import pytest
import redis

from core.redis_schema import RedisKeys
from core.settings import Settings
from evaluator.spark.__main__ import _follow
from ingest.kafka import ensure_topics

pytestmark = pytest.mark.spark


def _ended_query(spark, settings: Settings, tmp_path):
    """A real query that ends by itself with no error (availableNow over the empty events topic)."""
    ensure_topics(settings)
    query = (spark.readStream.format("tocsin_kafka").option("bootstrap", settings.kafka_bootstrap)
             .option("topic", settings.events_topic).load()
             .writeStream.format("noop").option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert not query.isActive and query.exception() is None
    return query


def test_a_query_that_ends_by_itself_fails_the_job(spark, settings: Settings, tmp_path) -> None:
    """It returned quietly before: the job exited 0, as if asked to stop, and nothing said why alerts stopped."""
    query = _ended_query(spark, settings, tmp_path)
    stats = redis.Redis.from_url(settings.redis_url)
    with pytest.raises(RuntimeError, match="ended by itself"):
        _follow(query, stats, RedisKeys(settings), threading.Event(), refresh_s=0.1)


def test_a_query_stopped_on_request_ends_the_job_quietly(spark, settings: Settings, tmp_path) -> None:
    query = _ended_query(spark, settings, tmp_path)
    stop = threading.Event()
    stop.set()
    _follow(query, redis.Redis.from_url(settings.redis_url), RedisKeys(settings), stop, refresh_s=0.1)
