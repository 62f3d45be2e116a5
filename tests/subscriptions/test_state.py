"""State keyed by an id dies with its row, and Redis state is namespaced by the deployment (real Redis)."""

from __future__ import annotations

from pathlib import Path

import redis

from core.redis_schema import RedisKeys, seen_bucket
from core.settings import Settings
from evaluator.spark.sink import RedisAlertSink
from evaluator.transition import alert_id
from notifier.app import make_celery
from notifier.attempt import Attempt
from notifier.deliveries import DeliveryRecords
from notifier.dispatcher import Dispatcher
from notifier.notification import build_notification, notification_id
from subscriptions.db import session_factory
from subscriptions.schemas import EndpointIn, SubscriptionIn
from subscriptions.service import SubscriptionService
from tests.users import api_client, new_user

CONDITION = "SUM(volume) OVER 1m > 100"


def _transition(subscription_id: int, key: str, evaluated_at: int) -> dict:
    return {"alert_id": alert_id(subscription_id, key, "firing", evaluated_at), "subscription_id": subscription_id,
            "key": key, "state": "firing", "value": 150.0, "window_start": evaluated_at - 60_000,
            "window_end": evaluated_at, "evaluated_at": evaluated_at}


def _fire(settings: Settings, subscription_id: int, evaluated_at: int) -> Dispatcher:
    """A firing transition through the real sink and the real dispatcher (no worker: deliveries stay queued)."""
    assert RedisAlertSink(settings).write([_transition(subscription_id, "AAPL", evaluated_at)]) == 1
    dispatcher = Dispatcher(settings, make_celery(settings))
    dispatcher.read(block_ms=1_000)
    dispatcher.flush(force=True)
    return dispatcher


def _keys_naming(client: redis.Redis, settings: Settings, *ids: int) -> list[str]:
    """Keys of this deployment whose name ends in one of ``ids`` (``firing:3``, ``deliveries:endpoint:3``...)."""
    found = []
    for key in client.scan_iter(match=settings.redis_key("*"), count=1_000):
        if any(key.endswith(f":{i}") for i in ids):
            found.append(key)
    return found


def test_deleting_a_subscription_or_endpoint_removes_its_redis_state(settings: Settings, owner,
                                                                    redis_client: redis.Redis) -> None:
    keys = RedisKeys(settings)
    records = DeliveryRecords(redis_client, keys)
    with session_factory(settings.database_url)() as session:
        service = SubscriptionService(session, settings, redis_client, owner)
        endpoint = service.create_endpoint(EndpointIn(kind="webhook", target="https://example.com/hook"))
        sid = service.create(SubscriptionIn(name="s", condition=CONDITION, endpoint_ids=[endpoint.id],
                                            policy={"cooldown_s": 3600})).id
        _fire(settings, sid, 1_700_000_060_000)
        alert = _transition(sid, "AAPL", 1_700_000_060_000)
        notification = build_notification({"id": sid, "name": "s", "condition": CONDITION}, [alert],
                                          notification_id([alert["alert_id"]]))
        failed = Attempt(ok=False, retryable=False, latency_ms=1.0, error="HTTP 410")
        records.dead(notification, endpoint.id, "webhook", failed, 1)
        assert {keys.firing(sid), keys.history(sid), keys.counters(sid), keys.key_states(sid),
                keys.delivery_log(sid), keys.endpoint_log(endpoint.id)} <= set(_keys_naming(redis_client, settings,
                                                                                         sid, endpoint.id))
        assert redis_client.exists(keys.decision(sid, alert["alert_id"])) == 1
        assert redis_client.sismember(keys.seen(sid, seen_bucket(alert["evaluated_at"])), alert["alert_id"])

        service.delete(sid)
        service.delete_endpoint(endpoint.id)
    assert _keys_naming(redis_client, settings, sid, endpoint.id) == []
    # The evaluator, not yet reading the new catalog, writes one more transition: the dispatcher cleans up.
    _fire(settings, sid, 1_700_000_120_000)
    assert _keys_naming(redis_client, settings, sid, endpoint.id) == []
    assert redis_client.exists(keys.decision(sid, alert["alert_id"])) == 0
    assert not redis_client.sismember(keys.seen(sid, seen_bucket(alert["evaluated_at"])), alert["alert_id"])
    assert records.dead_letters() == []


def test_a_fresh_database_on_an_old_redis_sees_none_of_the_old_state(settings: Settings, tmp_path: Path,
                                                                    redis_client: redis.Redis) -> None:
    a = settings
    b = settings.model_copy(update={"database_url": f"sqlite:///{tmp_path / 'fresh.db'}", "deployment_id": None})
    assert a.deployment != b.deployment and a.redis_prefix == b.redis_prefix
    policy = {"cooldown_s": 3600}

    def subscribe(s: Settings):
        user, token = new_user(s, email="same@example.com")
        with session_factory(s.database_url)() as session:
            service = SubscriptionService(session, s, redis_client, user)
            endpoint = service.create_endpoint(EndpointIn(kind="email", target="ops@example.com"))
            return token, service.create(SubscriptionIn(name="s", condition=CONDITION, endpoint_ids=[endpoint.id],
                                                        policy=policy)).id

    _token_a, sid_a = subscribe(a)
    _fire(a, sid_a, 1_700_000_060_000)
    records_a = DeliveryRecords(redis_client, RedisKeys(a))
    assert [e["outcome"] for e in records_a.log(sid_a)] == []  # queued, not yet attempted: log it by hand
    records_a.suppressed(sid_a, _transition(sid_a, "AAPL", 1), "cool-down", pipe := redis_client.pipeline(), pipe)
    pipe.execute()

    token_b, sid_b = subscribe(b)
    assert sid_b == sid_a  # the same id in the other database
    with api_client(b, token_b) as api:
        assert api.get(f"/api/subscriptions/{sid_b}/alerts").json()["alerts"] == []
        assert api.get(f"/api/subscriptions/{sid_b}/firing").json()["firing"] == {}
        assert api.get(f"/api/subscriptions/{sid_b}/deliveries").json()["deliveries"] == []

    # B's first alert, a minute after A's, within A's cool-down: notified, not suppressed by A's policy state.
    _fire(b, sid_b, 1_700_000_120_000)
    [entry] = list(DeliveryRecords(redis_client, RedisKeys(b)).log(sid_b)) or [None]
    assert entry is None, f"B's first alert was suppressed: {entry}"
    decision = redis_client.get(RedisKeys(b).decision(sid_b, _transition(sid_b, "AAPL", 1_700_000_120_000)["alert_id"]))
    assert '"reason": null' in decision
    # The catalogs are apart too: each evaluator reads its own deployment's.
    assert redis_client.exists(RedisKeys(a).catalog_changes, RedisKeys(b).catalog_changes) == 2
