"""The web app's own uses of Redis on a Redis Cluster: condition previews answered by a shard through the
evaluator's code, rate limits (the ``limits`` library's cluster storage), and the operators' samples."""

from __future__ import annotations

import threading
import time
from typing import Any, cast

import redis

from core.redis_schema import RedisKeys, celery_queue_keys, shard_clock_field
from core.settings import Settings
from core.stream_names import TRADES
from evaluator.catalog import Catalog
from evaluator.shard import ShardConfig, ShardEvaluator
from evaluator.spark.catalog_source import CatalogSource
from evaluator.spark.shard_runner import answer_previews
from ingest.kafka import ensure_topics
from ingest.model import ATTRIBUTES
from tests.evaluator.test_shard import pane_rows
from tests.users import api_client, new_user
from web.ops import sample_once, samples


def _answer_as_the_shard(settings: Settings, shard: ShardEvaluator, stop: threading.Event) -> None:
    """What the evaluator's shard 0 does at each micro-batch: read the requests, answer each once."""
    source = CatalogSource(settings)
    while not stop.is_set():
        answer_previews(source, 0, cast(Any, shard), TRADES)  # a trades shard's base evaluator answers alike
        time.sleep(0.01)


def test_a_preview_is_answered_and_the_rate_limit_counts_on_the_cluster(cluster_settings: Settings,
                                                                         cluster_client: redis.Redis) -> None:
    ensure_topics(cluster_settings)
    settings = cluster_settings.model_copy(update={"preview_timeout_s": 2.0, "evaluator_stale_s": 30,
                                                   "rate_preview_account": "2/minute"})
    shard = ShardEvaluator(ShardConfig(ATTRIBUTES, 1_000, 60_000, 0, 1, value_retention_ms=60_000,
                                       tuple_max_events=100))
    shard.step(pane_rows([("AAPL", 40_100, 10.0, 1.0), ("AAPL", 41_100, 12.0, 1.0)]), {0: 42_000}, Catalog.empty())
    now = time.time()
    cluster_client.hset(RedisKeys(settings).evaluator_stats, mapping={
        "driver_started_at": now, "driver_heartbeat_at": now, "last_batch_at": now, shard_clock_field(0): 42_000})
    _, token = new_user(settings)
    stop = threading.Event()
    answering = threading.Thread(target=_answer_as_the_shard, args=(settings, shard, stop), daemon=True)
    answering.start()
    try:
        with api_client(settings, token) as api:
            def preview() -> Any:
                return api.post("/api/conditions/preview", json={"condition": "CHANGE(price) OVER 5s > 3%"})

            for _ in range(2):
                response = preview()
                assert response.status_code == 200, response.text
                assert {m["key"]: m["value"] for m in response.json()["matches"]} == {"AAPL": 20.0}
            refused = preview()
            assert refused.status_code == 429 and int(refused.headers["Retry-After"]) > 0
    finally:
        stop.set()
        answering.join()
    assert any(key.startswith(RedisKeys(settings).rate_limits) for key in cluster_client.scan_iter(
        match=RedisKeys(settings).rate_limits + "*"))  # the counters are on the cluster


def test_the_operators_sampler_reads_the_cluster_and_celerys_redis(cluster_settings: Settings,
                                                                    cluster_client: redis.Redis) -> None:
    keys = RedisKeys(cluster_settings)
    cluster_client.hset(keys.evaluator_stats, mapping={"transitions": 7, shard_clock_field(0): 5})
    cluster_client.hset(keys.delivery_stats, mapping={"delivered": 3})
    broker = redis.Redis.from_url(cluster_settings.broker_url)
    queue, _ = celery_queue_keys(cluster_settings)
    broker.rpush(queue, "task-1", "task-2")  # what Celery's producer leaves in its own (single) Redis
    try:
        sample = sample_once(cluster_settings, cluster_client)
    finally:
        broker.delete(queue)
    assert sample is not None
    assert (sample["transitions"], sample["delivered"], sample["queued"], sample["clock"]) == (7, 3, 2, 5)
    assert samples(cluster_client, cluster_settings) == [sample]
