"""What the web app says about the evaluator: /readyz freshness, and why a preview got no answer."""

from __future__ import annotations

import re
import time

import redis

from core.redis_schema import RedisKeys, shard_clock_field
from core.settings import Settings
from ingest.kafka import ensure_topics
from tests.users import api_client, new_user


def test_readyz_and_previews_say_whether_the_evaluator_evaluates(settings: Settings,
                                                                  redis_client: redis.Redis) -> None:
    ensure_topics(settings)
    settings = settings.model_copy(update={"preview_timeout_s": 0.3, "evaluator_stale_s": 30})
    stats = RedisKeys(settings).evaluator_stats
    _, token = new_user(settings)
    preview = {"condition": "COUNT(*) OVER 10s > 5"}
    with api_client(settings, token) as api:
        absent = api.get("/readyz")
        assert absent.status_code == 503 and absent.json()["checks"]["evaluator"].startswith("absent: ")
        answer = api.post("/api/conditions/preview", json=preview).json()
        assert answer["shards"] == 0 and "has not started yet" in answer["reason"]

        now = time.time()
        redis_client.hset(stats, mapping={"driver_started_at": now, "driver_heartbeat_at": now})
        starting = api.get("/readyz").json()
        assert starting["checks"]["evaluator"].startswith("starting: ") and starting["evaluator"]["shards"] == 0
        assert "no batch evaluated yet" in api.post("/api/conditions/preview", json=preview).json()["reason"]

        redis_client.hset(stats, mapping={"last_batch_at": time.time(), shard_clock_field(0): 1_800_000_000_000})
        ready = api.get("/readyz")
        assert ready.status_code == 200, ready.text
        assert ready.json()["checks"] == {"database": "ok", "redis": "ok", "stream": "ok", "evaluator": "ok"}
        assert ready.json()["evaluator"]["newest_clock_ms"] == 1_800_000_000_000
        behind = api.post("/api/conditions/preview", json=preview).json()  # nobody answers: no Spark here
        assert behind["shards"] == 1 and behind["answered"] == 0 and "evaluator is behind" in behind["reason"]

        redis_client.hset(stats, "driver_heartbeat_at", time.time() - 120)
        stale = api.get("/readyz")
        assert stale.status_code == 503 and re.search(r"no heartbeat from the evaluator for 12\d s", stale.text)
        assert "it is down or hung" in api.post("/api/conditions/preview", json=preview).json()["reason"]
