"""A shard answer the web app cannot read, or a shard whose preview failed, costs that answer only, not the whole
preview; a failure is shown with its reason."""

from __future__ import annotations

import threading
import time

import redis

from core.redis_schema import RedisKeys, shard_clock_field
from core.settings import Settings
from evaluator.preview import PreviewAnswer
from ingest.kafka import ensure_topics
from tests.users import api_client, new_user


def _answer_as_two_shards(client: redis.Redis, keys: RedisKeys, stop: threading.Event,
                          first: bytes | str = b'{"shard": "zero", "matches": 7}') -> None:
    """Shard 0 answers ``first`` (garbage by default), shard 1 a good answer, to every request that appears."""
    answered: set[str] = set()
    while not stop.is_set():
        for request_id in client.hkeys(keys.previews):
            if request_id not in answered:
                answered.add(request_id)
                target = keys.preview_answers(request_id)
                client.rpush(target, first)
                client.rpush(target, PreviewAnswer.of(1, 1_800_000_000_000, {"AAPL": 42.0}, 3).to_json())
        time.sleep(0.01)


def _preview_with_two_shards(settings: Settings, redis_client: redis.Redis, first: bytes | str | None = None) -> dict:
    """``/api/conditions/preview`` with two live shards answering as :func:`_answer_as_two_shards` does."""
    ensure_topics(settings)
    settings = settings.model_copy(update={"preview_timeout_s": 1.0, "evaluator_stale_s": 30})
    keys = RedisKeys(settings)
    now = time.time()
    redis_client.hset(keys.evaluator_stats, mapping={
        "driver_started_at": now, "driver_heartbeat_at": now, "last_batch_at": now,
        shard_clock_field(0): 1_800_000_000_000, shard_clock_field(1): 1_800_000_000_000})
    _, token = new_user(settings)
    stop = threading.Event()
    shards = threading.Thread(target=_answer_as_two_shards, args=(redis_client, keys, stop, *([first] if first else [])),
                              daemon=True)
    shards.start()
    try:
        with api_client(settings, token) as api:
            response = api.post("/api/conditions/preview", json={"condition": "COUNT(*) OVER 10s > 5"})
    finally:
        stop.set()
        shards.join()
    assert response.status_code == 200, response.text
    return response.json()


def test_a_malformed_shard_answer_is_skipped_and_the_good_ones_are_shown(settings: Settings,
                                                                          redis_client: redis.Redis) -> None:
    answer = _preview_with_two_shards(settings, redis_client)
    assert answer["shards"] == 2 and answer["answered"] == 1 and not answer["complete"]
    assert answer["matches"] == [{"key": "AAPL", "value": 42.0}] and answer["watched"] == 3


def test_a_shard_whose_preview_failed_says_why_and_the_others_are_shown(settings: Settings,
                                                                        redis_client: redis.Redis) -> None:
    failed = PreviewAnswer.failed(0, 1_800_000_000_000, "RuntimeError: forced failure").to_json()
    answer = _preview_with_two_shards(settings, redis_client, failed)
    assert answer["shards"] == 2 and answer["answered"] == 2 and not answer["complete"]
    assert answer["errors"] == [{"shard": 0, "error": "RuntimeError: forced failure"}]
    assert answer["reason"] == "1 of 2 evaluator shards could not compute the preview: shard 0: RuntimeError: forced failure"
    assert answer["matches"] == [{"key": "AAPL", "value": 42.0}] and answer["watched"] == 3
