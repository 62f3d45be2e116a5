"""A resolution whose key has no policy state at all (lost with a Redis node that came back empty) is sent, marked
``state_unknown``; one whose firing was recorded as held back is not; the subscription's own policy still applies.

The policy rules on their own, then the dispatcher's decisions against a real Redis, the delivery lines, and one
alert through a real dispatcher, Celery worker and webhook receiver (issue 31; the node loss itself on a Redis
Cluster: ``tests/rediscluster/test_node_loss.py``).
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import redis

from core.redis_schema import RedisKeys
from core.settings import Settings
from devstack.receiver import WebhookReceiver
from evaluator.spark.sink import RedisAlertSink
from notifier.deliveries import DeliveryRecords
from notifier.dispatcher import Dispatcher
from notifier.notification import make_notification
from notifier.order import DeliveryOrder
from notifier.policy import NOTIFY, UNKNOWN, KeyState, decide
from subscriptions.db import session_factory
from subscriptions.policy import AlertPolicy
from subscriptions.schemas import EndpointIn, SubscriptionIn
from subscriptions.service import SubscriptionService
from tests.notifier.test_delivery import _eventually, _transition
from tests.processes import running, worker_args

T0 = 1_800_000_000.0
SUBSCRIPTION = 7
INFO = {"id": SUBSCRIPTION, "name": "s", "condition": "c"}
ENDPOINT = 3


def _lose(client: redis.Redis, keys: RedisKeys, subscription_id: int, alert_keys: list[str]) -> None:
    """What a Redis node that comes back empty takes of a subscription: its policy state, sequences and lines."""
    doomed = [keys.key_states(subscription_id), keys.sequences(subscription_id)]
    for key in alert_keys:
        doomed += [keys.order_line(subscription_id, ENDPOINT, key), keys.order_state(subscription_id, ENDPOINT, key)]
    client.delete(*doomed)


# -- the rule ------------------------------------------------------------------------------------------------------


def test_a_resolution_of_an_unknown_state_is_notified_and_one_recorded_as_held_back_is_not() -> None:
    assert KeyState.from_dict(None) == UNKNOWN and not UNKNOWN.known
    reason, state = decide(AlertPolicy(), UNKNOWN, "resolved", T0)
    assert reason is NOTIFY and state == KeyState(None, False, None)  # known from now on, closed
    muted = AlertPolicy(muted_until=datetime.fromtimestamp(T0 + 60, UTC))
    _, held = decide(muted, UNKNOWN, "firing", T0)  # recorded: fired while muted
    assert held.known and not held.open
    assert decide(AlertPolicy(), held, "resolved", T0 + 61)[0] == "its firing was not notified"


def test_the_subscriptions_policy_still_applies_to_a_resolution_of_an_unknown_state() -> None:
    assert decide(AlertPolicy(send_resolved=False), UNKNOWN, "resolved", T0)[0] == "send-resolved is off"
    muted = AlertPolicy(muted_until=datetime.fromtimestamp(T0 + 60, UTC))
    assert decide(muted, UNKNOWN, "resolved", T0)[0] == "muted"


# -- the dispatcher's decisions ------------------------------------------------------------------------------------


def _alert(alert_id: str, key: str, state: str) -> dict:
    return {"alert_id": alert_id, "key": key, "state": state, "value": 1.0, "window_start": 0, "window_end": 0,
            "evaluated_at": 0}


def test_the_dispatcher_sends_a_resolution_whose_state_was_lost_marked_and_numbered_above_the_lost_ones(
        settings: Settings, redis_client: redis.Redis) -> None:
    dispatcher = Dispatcher(settings)
    keys = RedisKeys(settings)
    firing = _alert("f1", "AAPL", "firing")
    assert dispatcher.decide(SUBSCRIPTION, AlertPolicy(), [firing])["f1"] is not None
    assert firing["sequence"] == 1 and "state_unknown" not in firing
    _lose(redis_client, keys, SUBSCRIPTION, ["AAPL"])
    resolved = _alert("r1", "AAPL", "resolved")
    nid = dispatcher.decide(SUBSCRIPTION, AlertPolicy(), [resolved])["r1"]
    assert nid is not None, "the resolution of a firing that was delivered before its state was lost is suppressed"
    assert resolved["state_unknown"] is True and "episode_id" not in resolved
    assert resolved["sequence"] > firing["sequence"]  # its counter starts again above what was handed out
    sent = make_notification(INFO, [resolved], nid).to_json()
    assert sent["alerts"][0]["state_unknown"] is True
    assert "state_unknown" not in make_notification(INFO, [firing], "n").to_json()["alerts"][0]  # only there
    reread = _alert("r1", "AAPL", "resolved")  # re-handled after a restart: the same decision, the same mark
    assert dispatcher.decide(SUBSCRIPTION, AlertPolicy(), [reread])["r1"] == nid
    assert reread["state_unknown"] is True and reread["sequence"] == resolved["sequence"]
    # The key is known again: its next episode is decided as ever, numbered on from there.
    again = _alert("f2", "AAPL", "firing")
    dispatcher.decide(SUBSCRIPTION, AlertPolicy(), [again])
    assert again["sequence"] == resolved["sequence"] + 1 and "state_unknown" not in again
    assert json.loads(redis_client.hget(keys.key_states(SUBSCRIPTION), "AAPL"))["open"] is True


def test_the_dispatcher_still_suppresses_a_resolution_whose_firing_was_recorded_as_held_back(
        settings: Settings, redis_client: redis.Redis) -> None:
    dispatcher = Dispatcher(settings)
    muted = AlertPolicy(muted_until=datetime.now(UTC) + timedelta(hours=1))
    assert dispatcher.decide(SUBSCRIPTION, muted, [_alert("f1", "AAPL", "firing")])["f1"] is None
    resolved = _alert("r1", "AAPL", "resolved")
    assert dispatcher.decide(SUBSCRIPTION, AlertPolicy(), [resolved])["r1"] is None  # the mute is over by now
    assert "state_unknown" not in resolved
    log = DeliveryRecords(redis_client, RedisKeys(settings)).log(SUBSCRIPTION)
    assert [(e["state"], e["reason"]) for e in log] == [("resolved", "its firing was not notified"),
                                                        ("firing", "muted")]


def test_send_resolved_off_and_silences_still_hold_back_a_resolution_of_an_unknown_state(
        settings: Settings, redis_client: redis.Redis) -> None:
    dispatcher = Dispatcher(settings)
    off = _alert("r1", "AAPL", "resolved")
    assert dispatcher.decide(SUBSCRIPTION, AlertPolicy(send_resolved=False), [off])["r1"] is None
    silenced = _alert("r2", "MSFT", "resolved")
    assert dispatcher.decide(SUBSCRIPTION, AlertPolicy(), [silenced], lambda _key, _now: 42)["r2"] is None
    log = DeliveryRecords(redis_client, RedisKeys(settings)).log(SUBSCRIPTION)
    assert {e["keys"][0]: e["reason"] for e in log} == {"AAPL": "send-resolved is off", "MSFT": "silenced by #42"}
    assert "state_unknown" not in off and "state_unknown" not in silenced


def test_a_firing_still_in_flight_from_before_the_loss_never_follows_its_resolution(
        settings: Settings, redis_client: redis.Redis) -> None:
    """The loss took the key's delivery line too: the firing, still queued, joins the new line when it comes. The
    resolution is numbered above it, so the firing either goes first or, once the resolution went, is superseded -
    never delivered after it (it would reopen for ever what was closed)."""
    dispatcher = Dispatcher(settings)
    keys = RedisKeys(settings)
    order = DeliveryOrder(redis_client, keys, settings)
    firing = _alert("f1", "AAPL", "firing")
    fired = make_notification(INFO, [firing], dispatcher.decide(SUBSCRIPTION, AlertPolicy(), [firing])["f1"] or "")
    order.join(fired, [ENDPOINT])  # enqueued, not delivered yet (a receiver failing, retries)
    _lose(redis_client, keys, SUBSCRIPTION, ["AAPL"])
    resolved = _alert("r1", "AAPL", "resolved")
    closing = make_notification(INFO, [resolved], dispatcher.decide(SUBSCRIPTION, AlertPolicy(), [resolved])["r1"]
                                or "")
    order.join(closing, [ENDPOINT])
    assert order.turn(closing, ENDPOINT, "{}", 0).wait_s is None  # alone in the new line: it goes
    order.leave(closing, ENDPOINT)
    assert order.turn(fired, ENDPOINT, "{}", 0).superseded_by == resolved["sequence"]


# -- delivered ---------------------------------------------------------------------------------------------------


@pytest.mark.e2e
def test_a_resolution_whose_state_was_lost_reaches_the_receiver_marked_and_logged(
        settings: Settings, redis_client: redis.Redis, owner, tmp_path: Path) -> None:
    receiver, chat = WebhookReceiver(), WebhookReceiver()
    keys = RedisKeys(settings)
    try:
        with session_factory(settings.database_url)() as session:
            service = SubscriptionService(session, settings, redis_client, owner)
            hook = service.create_endpoint(EndpointIn(kind="webhook", target=receiver.url)).id
            slack = service.create_endpoint(EndpointIn(kind="slack", target=chat.url)).id
            sid = service.create(SubscriptionIn(name="lost", condition="SUM(volume) OVER 1m > 100",
                                                endpoint_ids=[hook, slack])).id
        dispatcher = Dispatcher(settings)
        sink = RedisAlertSink(settings)
        with running(settings, tmp_path / "logs", ("worker", worker_args())):
            sink.write([_transition(sid, "AAPL", "firing", 1_700_000_060_000)])
            dispatcher.read(block_ms=100)
            time.sleep(settings.dispatcher_group_wait_ms / 1000)
            dispatcher.flush()
            receiver.wait_for(lambda r: r.json["state"] == "firing")
            redis_client.delete(keys.key_states(sid), keys.sequences(sid))  # lost with its node
            sink.write([_transition(sid, "AAPL", "resolved", 1_700_000_120_000)])
            dispatcher.read(block_ms=100)
            time.sleep(settings.dispatcher_group_wait_ms / 1000)
            dispatcher.flush()
            [got] = receiver.wait_for(lambda r: r.json["state"] == "resolved")
            [posted] = chat.wait_for(lambda r: r.json["text"].startswith("*RESOLVED"))
            records = DeliveryRecords(redis_client, keys)

            def both_resolutions_logged() -> list[dict] | None:
                found = [e for e in records.log(sid) if e["outcome"] == "delivered" and e["state"] == "resolved"]
                return found if len(found) == 2 else None
            logged = _eventually(both_resolutions_logged)
    finally:
        receiver.close()
        chat.close()
    [alert] = got.json["alerts"]
    assert alert["state_unknown"] is True and alert["key"] == "AAPL"
    assert posted.json["blocks"][-1]["elements"][0]["text"].endswith(" · firing not on record: AAPL")
    assert [e["state_unknown"] for e in logged] == [["AAPL"], ["AAPL"]]  # the webhook's delivery and Slack's
    assert all("state_unknown" not in e for e in records.log(sid) if e["state"] == "firing")


def test_a_group_put_back_for_an_outage_is_still_decided_before_the_later_groups_of_its_keys(
        settings: Settings, redis_client: redis.Redis, owner, monkeypatch: pytest.MonkeyPatch) -> None:
    """A firing whose dispatch met an outage goes back to the buffer ahead of its key's resolution, read with it:
    decided after it, the resolution would find no state (sent as ``state_unknown``) and the firing would open
    what nothing closes."""
    keys = RedisKeys(settings)
    with session_factory(settings.database_url)() as session:
        service = SubscriptionService(session, settings, redis_client, owner)
        hook = service.create_endpoint(EndpointIn(kind="webhook", target="http://127.0.0.1:9/")).id
        sid = service.create(SubscriptionIn(name="flap", condition="SUM(volume) OVER 1m > 100",
                                            endpoint_ids=[hook])).id
    firing, resolved = (_transition(sid, "AAPL", "firing", 1_700_000_060_000),
                        _transition(sid, "AAPL", "resolved", 1_700_000_120_000))
    RedisAlertSink(settings).write([firing, resolved])
    dispatcher = Dispatcher(settings)
    dispatcher.read(block_ms=100)
    real, calls = dispatcher.dispatch, []

    def outage_once(*args: object) -> None:
        calls.append(args)
        if len(calls) == 1:
            raise redis.ConnectionError("Redis away")
        real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(dispatcher, "dispatch", outage_once)
    with pytest.raises(redis.ConnectionError):
        dispatcher.flush(force=True)
    dispatcher.flush(force=True)
    decided = {t["state"]: json.loads(redis_client.get(keys.decision(sid, t["alert_id"])) or "{}")
               for t in (firing, resolved)}
    assert decided["firing"]["sequence"] == 1 and decided["resolved"]["sequence"] == 2, decided
    assert "state_unknown" not in decided["resolved"]
    assert decided["resolved"]["episode"] == firing["alert_id"]
