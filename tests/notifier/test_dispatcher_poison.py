"""A malformed entry in the alerts stream costs that entry only (real Redis, real dispatcher)."""

from __future__ import annotations

import json

import redis
from prometheus_client import REGISTRY

from core.redis_schema import NOTIFIER_GROUP, RedisKeys
from core.settings import Settings
from evaluator.spark.sink import RedisAlertSink
from evaluator.transition import alert_id
from notifier.app import make_celery
from notifier.dispatcher import Dispatcher
from subscriptions.db import session_factory
from subscriptions.schemas import SubscriptionIn
from subscriptions.service import SubscriptionService


def _transition(subscription_id: int, evaluated_at: int) -> dict:
    return {"alert_id": alert_id(subscription_id, "AAPL", "firing", evaluated_at), "subscription_id": subscription_id,
            "key": "AAPL", "state": "firing", "value": 150.0, "window_start": evaluated_at - 60_000,
            "window_end": evaluated_at, "evaluated_at": evaluated_at}


def test_malformed_entries_are_dead_lettered_with_reasons_and_the_rest_flows(settings: Settings,
                                                                            redis_client: redis.Redis) -> None:
    keys = RedisKeys(settings)
    dispatcher = Dispatcher(settings, make_celery(settings))
    poison = [{"alert": "{not json"}, {"something": "else"}, {"alert": "[1, 2]"},
              {"alert": '{"alert_id": "x", "subscription_id": 1, "key": "K", "state": "exploded", "value": 1,'
                        ' "window_start": 0, "window_end": 1, "evaluated_at": 1}'}]
    for fields in poison:
        redis_client.xadd(keys.alerts_stream, fields)
    assert RedisAlertSink(settings).write([_transition(987_654, 1_700_000_060_000)]) == 1

    assert dispatcher.read(block_ms=1_000) == 1  # only the good one is buffered
    dispatcher.flush(force=True)

    dead = redis_client.xrange(keys.alerts_dead)
    assert len(dead) == len(poison)
    reasons = [fields["reason"] for _, fields in dead]
    assert reasons[0].startswith("JSONDecodeError")
    assert reasons[1].startswith("KeyError")
    assert reasons[2].startswith("TypeError")
    assert "exploded" in reasons[3]
    assert all(fields["entry"] for _, fields in dead)
    # nothing is left pending: a restarted dispatcher does not trip over them again
    assert redis_client.xpending(keys.alerts_stream, NOTIFIER_GROUP)["pending"] == 0
    assert dispatcher.read(block_ms=10, pending=True) == 0


def test_a_malformed_firing_value_costs_its_key_not_every_reminder(settings: Settings, redis_client: redis.Redis,
                                                                   owner) -> None:
    keys = RedisKeys(settings)
    with session_factory(settings.database_url)() as session:
        service = SubscriptionService(session, settings, redis_client, owner)
        sid = service.create(SubscriptionIn(name="r", condition="SUM(volume) OVER 1m > 100",
                                            policy={"renotify_s": 60})).id
    good = _transition(sid, 1_700_000_060_000)
    redis_client.hset(keys.firing(sid), mapping={"AAPL": json.dumps(good), "BAD": "{not json", "WORSE": "[1]"})
    dispatcher = Dispatcher(settings, make_celery(settings))
    before = REGISTRY.get_sample_value("tocsin_dispatcher_transitions_total", {"outcome": "malformed"}) or 0.0
    assert dispatcher._firing(sid) == {"AAPL": good}
    with session_factory(settings.database_url)() as session:
        assert dispatcher.remind(session) == 0  # AAPL was never decided on: nothing due, and no crash
    after = REGISTRY.get_sample_value("tocsin_dispatcher_transitions_total", {"outcome": "malformed"})
    assert after == before + 4  # two bad values, read twice
