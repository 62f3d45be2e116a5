"""The operators' samples: Kafka lag and input rate from real log ends, queue depth, delivery success."""

from __future__ import annotations

import json
import time

import redis

from core.redis_schema import LANES, RedisKeys, celery_queue_keys, lane_queue
from core.settings import Settings
from devstack.patience import patient
from ingest.kafka import ensure_topics, topic_end_offsets
from ingest.model import Event
from ingest.publisher import EventPublisher
from notifier.app import DELIVER_TASK, make_celery
from tests.users import api_client
from web.ops import sample_once, samples


def test_samples_measure_lag_rates_queue_and_deliveries(settings: Settings, redis_client: redis.Redis) -> None:
    settings = settings.model_copy(update={"dashboard_sample_s": 0.01})
    ensure_topics(settings)
    keys = RedisKeys(settings)
    first = sample_once(settings, redis_client)
    assert first is not None and first["kafka"] == "ok" and first["log_end"] == 0 and "input_rate" not in first
    with EventPublisher(settings) as publisher:
        for i in range(30):
            publisher.publish(Event(key=f"K{i % 3}", ts=1_800_000_000_000 + i, price=1, volume=1))
    # The evaluator read 5 records of the fullest partition; workers delivered 3, retried 1; 2 tasks are queued.
    fullest = max(topic_end_offsets(settings, settings.events_topic).items(), key=lambda kv: kv[1])[0]
    redis_client.hset(keys.evaluator_stats, mapping={"source_offsets": json.dumps({str(fullest): 5}),
                                                     "batch_seconds": 1.25, "candidates": 40, "matches": 8})
    redis_client.hset(keys.delivery_stats, mapping={"delivered": 3, "retry": 1})
    redis_client.rpush(celery_queue_keys(settings)[0], "task-1", "task-2")
    time.sleep(0.05)
    second = sample_once(settings, redis_client)
    assert second is not None
    assert second["log_end"] == 30 and second["read"] == 5 and second["lag"] == 25
    assert second["input_rate"] > 0 and second["evaluated_rate"] > 0
    assert second["batch_ms"] == 1250.0 and second["candidate_rate"] > second["match_rate"] > 0
    assert second["queued"] == 2 and second["success_rate"] == 0.75
    assert [s["t"] for s in samples(redis_client, settings)] == [first["t"], second["t"]]
    time.sleep(0.05)  # past the 9 ms lock of the last sample
    assert sample_once(settings.model_copy(update={"dashboard_sample_s": 60}), redis_client) is not None
    assert sample_once(settings.model_copy(update={"dashboard_sample_s": 60}), redis_client) is None, \
        "one sample per period, whichever web process takes it"


def test_the_dashboard_counts_the_queues_celery_fills(settings: Settings, redis_client: redis.Redis) -> None:
    celery = make_celery(settings)
    try:
        for lane in LANES:
            celery.send_task(DELIVER_TASK, args=[{}], queue=lane_queue(settings, lane))
            queue, _ = celery_queue_keys(settings, lane)
            assert redis_client.llen(queue) == 1, lane
    finally:
        celery.close()


def test_a_web_process_samples_from_its_start_unless_told_not_to(settings: Settings, redis_client: redis.Redis) -> None:
    ensure_topics(settings)
    for sampler in (False, True):
        with api_client(settings.model_copy(update={"web_sampler": sampler})) as client:
            assert client.get("/healthz").status_code == 200
            deadline = time.monotonic() + patient(30)
            while sampler and not samples(redis_client, settings) and time.monotonic() < deadline:
                time.sleep(0.05)
        taken = samples(redis_client, settings)
        assert (len(taken), taken[0]["kafka"] if taken else None) == ((1, "ok") if sampler else (0, None))
