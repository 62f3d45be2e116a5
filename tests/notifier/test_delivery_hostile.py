"""A Redis error that no wait cures (a key of the wrong type, a script's bug) must not put a delivery back on its
queue for ever: it is a recorded failure, and the other deliveries go on. Real worker, Redis and receiver."""

from __future__ import annotations

import time

import pytest
import redis

from core.redis_schema import RedisKeys
from core.settings import Settings
from devstack.receiver import WebhookReceiver
from notifier.app import make_celery
from notifier.deliveries import DeliveryRecords
from subscriptions.schemas import EndpointIn
from subscriptions.service import SubscriptionService
from tests.notifier.test_delivery import _eventually, _notification, _outcomes, _send, _subscription, service, worker

__all__ = ["service"]  # the fixture


@pytest.mark.slow  # a real worker through its retries (~25 s): run in CI
def test_a_redis_error_no_wait_cures_is_retried_then_dead_lettered_not_requeued_for_ever(
        settings: Settings, service: SubscriptionService, redis_client: redis.Redis, tmp_path) -> None:
    # A visibility timeout longer than the test (the suite's is ~9 s): a copy the broker restored while the first
    # ran would run again and log an extra retry (seen in CI while each error took 10 s to log).
    settings = settings.model_copy(update={"delivery_max_retries": 2, "delivery_store_wait_s": 0.2,
                                           "delivery_visibility_margin_s": 60})
    receiver = WebhookReceiver()
    broken = service.create_endpoint(EndpointIn(kind="webhook", target=receiver.url))
    sound = service.create_endpoint(EndpointIn(kind="webhook", target=receiver.url))
    broken_sub, sound_sub = _subscription(service, [broken.id], "broken"), _subscription(service, [sound.id], "ok")
    keys = RedisKeys(settings)
    redis_client.set(keys.inflight_endpoint(service.owner.id, broken.id), "not a sorted set")  # WRONGTYPE in the slot script
    records = DeliveryRecords(redis_client, keys)
    celery = make_celery(settings)
    try:
        with worker(settings, tmp_path / "logs"):
            _send(celery, _notification(broken_sub, "AAPL"), broken)
            _send(celery, _notification(sound_sub, "MSFT"), sound)
            receiver.wait_for(lambda r: True)
            _eventually(lambda: _outcomes(records, broken_sub) == ["retry", "retry", "dead"], timeout_s=30)
            time.sleep(1)
    finally:
        receiver.close()
    assert [r.json["alerts"][0]["key"] for r in receiver.received] == ["MSFT"]
    dead = records.log(broken_sub)[0]
    assert "internal error: ResponseError" in dead["error"] and "WRONGTYPE" in dead["error"]
    worker_log = (tmp_path / "logs" / "worker.log").read_text()
    assert "redis_outage" not in worker_log
    # Logged as one JSON line with a plain traceback: Celery's default rendered each error with every frame's
    # locals (~800 lines, 5-10 s of the worker, the settings' Redis URL among them).
    assert "redis_url" not in worker_log and '"event": "delivery_failed_unexpectedly"' in worker_log
