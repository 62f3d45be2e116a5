"""Claiming pending entries (real Redis, real dispatcher): a failed dispatch comes back; a live holder's
entries are left alone until they are idle long enough."""

from __future__ import annotations

import time

import pytest
import redis

from core.redis_schema import NOTIFIER_GROUP, LayoutMismatch, RedisKeys, celery_queue_keys
from core.settings import Settings
from evaluator.spark.sink import RedisAlertSink
from notifier.dispatcher import Dispatcher
from subscriptions.db import session_factory
from subscriptions.schemas import EndpointIn, SubscriptionIn
from subscriptions.service import SubscriptionService
from tests.notifier.test_dispatcher_poison import _transition


def _subscription(settings: Settings, client: redis.Redis, owner) -> int:
    with session_factory(settings.database_url)() as session:
        service = SubscriptionService(session, settings, client, owner)
        hook = service.create_endpoint(EndpointIn(kind="webhook", target="http://127.0.0.1:9/hook")).id
        return service.create(SubscriptionIn(name="c", condition="SUM(volume) OVER 1m > 100",
                                             endpoint_ids=[hook])).id


def test_a_dispatch_that_failed_is_claimed_back_and_enqueued_once(settings: Settings, redis_client: redis.Redis,
                                                                    owner, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = settings.model_copy(update={"dispatcher_claim_idle_ms": 1})
    sid = _subscription(settings, redis_client, owner)
    dispatcher = Dispatcher(settings)
    assert RedisAlertSink(settings).write([_transition(sid, 1_700_000_060_000)]) == 1
    assert dispatcher.read(block_ms=1_000) == 1

    def broker_down(*_: object) -> None:
        raise ConnectionError("the broker is down")

    with monkeypatch.context() as patched:
        patched.setattr(dispatcher, "enqueue", broker_down)
        with pytest.raises(ConnectionError):
            dispatcher.flush(force=True)
    assert dispatcher.buffer == {} and dispatcher.read(block_ms=10) == 0  # gone from the buffer, still pending
    time.sleep(0.01)
    assert dispatcher.claim() == 1  # its own idle entry, back in the buffer
    dispatcher.flush(force=True)
    assert redis_client.xpending(RedisKeys(settings).alerts_stream, NOTIFIER_GROUP)["pending"] == 0
    assert redis_client.llen(celery_queue_keys(settings)[0]) == 1


def test_entries_a_live_dispatcher_holds_are_not_claimed_before_they_are_idle(settings: Settings,
                                                                             redis_client: redis.Redis,
                                                                             owner) -> None:
    sid = _subscription(settings, redis_client, owner)
    holder = Dispatcher(settings.model_copy(update={"dispatcher_consumer": "holder"}))
    other = Dispatcher(settings.model_copy(update={"dispatcher_consumer": "other",
                                                   "dispatcher_claim_idle_ms": 3_600_000}))
    assert RedisAlertSink(settings).write([_transition(sid, 1_700_000_060_000)]) == 1
    assert holder.read(block_ms=1_000) == 1
    assert other.claim() == 0 and other.buffer == {}
    holder.flush(force=True)
    assert redis_client.xpending(RedisKeys(settings).alerts_stream, NOTIFIER_GROUP)["pending"] == 0


def test_a_dispatcher_configured_for_other_partitions_than_the_sink_refuses_to_start(settings: Settings,
                                                                                     redis_client: redis.Redis) -> None:
    """A sink writing 1 partition and a dispatcher reading 4 (or a setting changed on a running deployment) would
    leave alerts in streams nobody reads: the second to start stops with the reason instead."""
    RedisAlertSink(settings)  # records the layout: one partition, untagged
    with pytest.raises(LayoutMismatch, match="TOCSIN_REDIS_PARTITIONS"):
        Dispatcher(settings.model_copy(update={"redis_partitions": 4}))
    Dispatcher(settings)  # the same layout starts
    redis_client.delete(RedisKeys(settings).layout)  # drained and reset on purpose: a new layout may start
    Dispatcher(settings.model_copy(update={"redis_partitions": 4}))
    with pytest.raises(LayoutMismatch):
        RedisAlertSink(settings)
