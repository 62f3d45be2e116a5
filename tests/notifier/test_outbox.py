"""The outbox (``notifier.outbox``): deliveries queued and not ended, sent again when silent, against a real Redis
and broker; end to end, a delivery whose task the broker lost reaches its receiver."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import pytest
import redis
from prometheus_client import REGISTRY

from core.redis_schema import RedisKeys, celery_queue_keys
from core.settings import Settings
from devstack.receiver import WebhookReceiver
from devstack.services import python_module
from evaluator.spark.sink import RedisAlertSink
from evaluator.transition import alert_id
from notifier.app import make_celery
from notifier.attempt import Attempt
from notifier.deliveries import DeliveryRecords, binding, enqueue, publish
from notifier.dispatcher import Dispatcher
from notifier.notification import Notification, make_notification
from notifier.order import DeliveryOrder
from notifier.outbox import Outbox, silent_after_s
from notifier.resend import resend_silent
from subscriptions.db import session_factory
from subscriptions.routing import EndpointRoute
from subscriptions.schemas import EndpointIn, SubscriptionIn
from subscriptions.service import SubscriptionService
from tests.notifier.test_delivery import _eventually
from tests.processes import running, worker_args

SILENT_S = 0.3  # the unit tests' outbox waits this long for a sign of life
ENDPOINT = 3


def _notification(name: str, sequence: int | None = None) -> Notification:
    alert = {"alert_id": f"{name}-AAPL", "key": "AAPL", "state": "firing", "value": 1.0, "window_start": 0,
             "window_end": 0, "evaluated_at": 0, **({} if sequence is None else {"sequence": sequence})}
    return make_notification({"id": 7, "name": "s", "condition": "c"}, [alert], name)


def _outbox(settings: Settings, client: redis.Redis) -> Outbox:
    outbox = Outbox(client, RedisKeys(settings), settings)
    outbox.silent_after_s = SILENT_S
    return outbox


def _queued(settings: Settings, client: redis.Redis) -> list[tuple[list, dict]]:
    """The alert lane's queued tasks, oldest first: (args, kwargs) of each."""
    messages = [json.loads(raw) for raw in reversed(client.lrange(celery_queue_keys(settings)[0], 0, -1))]
    return [tuple(json.loads(base64.b64decode(m["body"]))[:2]) for m in messages]  # type: ignore[misc]


def test_a_queued_delivery_silent_that_long_is_due_once_and_to_one_taker(settings, redis_client) -> None:
    outbox, other = _outbox(settings, redis_client), _outbox(settings, redis_client)
    payload = _notification("n").to_json()
    outbox.add(payload, ENDPOINT, {"owner_id": 1, "generation": "g"})
    assert outbox.due() == [] and outbox.count() == 1  # not silent yet
    time.sleep(SILENT_S + 0.1)
    [silent] = outbox.due()
    assert (silent.notification_id, silent.endpoint_id) == ("n", ENDPOINT)
    assert silent.task == {"notification": payload, "endpoint_id": ENDPOINT,
                           "kwargs": {"owner_id": 1, "generation": "g"}}
    assert other.due() == [] and outbox.due() == []  # taken: due again only after another silence
    time.sleep(SILENT_S + 0.1)
    assert [s.notification_id for s in other.due()] == ["n"]


def test_signs_of_life_put_it_off_and_its_final_mark_forgets_it(settings, redis_client) -> None:
    outbox = _outbox(settings, redis_client)
    records = DeliveryRecords(redis_client, RedisKeys(settings))
    payload = _notification("n").to_json()
    outbox.add(payload, ENDPOINT, {})
    outbox.alive("n", ENDPOINT, next_run_s=1.0)  # a retry in a second
    time.sleep(SILENT_S + 0.1)
    assert outbox.due() == []
    records.delivered(payload, ENDPOINT, "webhook", Attempt(True, False, 1.0, 204), 1)
    assert outbox.count() == 0
    outbox.alive("n", ENDPOINT)  # a late copy's sign of life does not note an ended delivery again
    assert outbox.count() == 0


def test_a_silent_delivery_is_sent_again_unless_it_ended_is_sending_or_may_still_be_queued(
        settings, redis_client) -> None:
    celery = make_celery(settings)
    keys = RedisKeys(settings)
    outbox, records, order = _outbox(settings, redis_client), DeliveryRecords(redis_client, keys), \
        DeliveryOrder(redis_client, keys, settings)
    # Another delivery in the queue, noted before them (with the deployment's own silence, not due in this test).
    enqueue(celery, Outbox(redis_client, keys, settings), _notification("other").to_json(), 9, {})
    lost, ended, sending = _notification("lost", sequence=1), _notification("ended"), _notification("sending")
    for n in (lost, ended, sending):
        outbox.add(n.to_json(), ENDPOINT, {"owner_id": 1, "generation": "g"})  # their tasks never reach the queue
    order.join(lost, [ENDPOINT])
    redis_client.hset(keys.order_wake(7, ENDPOINT, "lost"), "woken", 2)  # its copies were woken twice
    records.dead(ended.to_json(), ENDPOINT, "webhook", Attempt(False, False, 1.0, 410), 1)
    outbox.add(ended.to_json(), ENDPOINT, {})  # its note outlived its final mark's pipeline (a torn write)
    records.claim("sending", ENDPOINT, 60)
    time.sleep(SILENT_S + 0.1)
    assert resend_silent(settings, celery, outbox, records, order) == 0  # "lost" may be behind "other"
    assert len(_queued(settings, redis_client)) == 1
    redis_client.delete(celery_queue_keys(settings)[0])  # a worker took it
    time.sleep(SILENT_S + 0.1)
    assert resend_silent(settings, celery, outbox, records, order) == 1
    [(args, kwargs)] = _queued(settings, redis_client)
    assert args == [lost.to_json(), ENDPOINT]
    assert kwargs == {"owner_id": 1, "generation": "g", "woken": 2}  # not a stale copy in its line
    noted = set(redis_client.zrange(keys.pending_deliveries, 0, -1))
    assert noted == {f"lost:{ENDPOINT}", f"sending:{ENDPOINT}", "other:9"}  # "ended" forgotten, the rest wait


def test_a_backlog_queued_after_a_lost_delivery_does_not_hold_it_back(settings, redis_client) -> None:
    """The queue is first in, first out: a delivery noted before its oldest message is not in it. Gated on an empty
    queue instead, a lost delivery waited for a backlog that might never drain: silence under load."""
    celery = make_celery(settings)
    keys = RedisKeys(settings)
    outbox, records, order = _outbox(settings, redis_client), DeliveryRecords(redis_client, keys), \
        DeliveryOrder(redis_client, keys, settings)
    lost = _notification("lost")
    outbox.add(lost.to_json(), ENDPOINT, {})  # its task never reaches the queue
    time.sleep(0.01)  # noted in the same millisecond, the two could be in either order: it may be behind
    for i in range(3):  # the backlog behind it, queued and noted after it (not due in this test)
        enqueue(celery, Outbox(redis_client, keys, settings), _notification(f"later{i}").to_json(), 9, {})
    time.sleep(SILENT_S + 0.1)
    assert resend_silent(settings, celery, outbox, records, order) == 1
    assert [args[0]["notification_id"] for args, _ in _queued(settings, redis_client)] == [
        "later0", "later1", "later2", "lost"]
    time.sleep(SILENT_S + 0.1)
    assert resend_silent(settings, celery, outbox, records, order) == 0, "its copy waits behind the backlog now"

    redis_client.delete(celery_queue_keys(settings)[0])
    publish(celery, _notification("unnoted").to_json(), 9, {}, None)  # a task queued without a note says nothing
    time.sleep(SILENT_S + 0.1)
    assert resend_silent(settings, celery, outbox, records, order) == 0, "the queue may hold it: not sent again"


@pytest.mark.slow  # fault injection (a task taken off the broker's queue and lost): run in CI
@pytest.mark.e2e
@pytest.mark.parametrize("resolve_behind", [False, True], ids=["alone", "its-resolve-waiting-in-line"])
def test_an_alert_whose_task_the_broker_lost_reaches_its_receiver(settings, redis_client, owner, tmp_path: Path,
                                                                  resolve_behind: bool) -> None:
    # A worker killed as it took a task off the queue (kombu's BRPOP, before its unacknowledged copy is written)
    # loses it: here the task is taken off the queue by hand, before any worker runs. Behind it in its line, its
    # key's resolve waits for it (notifier.order): the firing is sent again, not let go past as lost.
    settings = settings.model_copy(update={"smtp_timeout_s": 1.0, "webhook_total_timeout_s": 2.0,
                                           "pagerduty_attempt_timeout_s": 1.0, "dispatcher_claim_interval_s": 0.5})
    receiver = WebhookReceiver()
    try:
        with session_factory(settings.database_url)() as session:
            service = SubscriptionService(session, settings, redis_client, owner)
            endpoint = service.create_endpoint(EndpointIn(kind="webhook", target=receiver.url)).id
            subscription = service.create(SubscriptionIn(name="volume", condition="SUM(volume) OVER 1m > 100",
                                                         endpoint_ids=[endpoint])).id
        at = 1_700_000_060_000
        states = ["firing", "resolved"] if resolve_behind else ["firing"]
        rows = [{"alert_id": alert_id(subscription, "AAPL", state, at + 1000 * i), "subscription_id": subscription,
                 "key": "AAPL", "state": state, "value": 150.0, "window_start": at - 60_000, "window_end": at,
                 "evaluated_at": at + 1000 * i} for i, state in enumerate(states)]
        queue = celery_queue_keys(settings)[0]
        with running(settings, tmp_path / "logs", ("dispatcher", python_module("notifier.dispatcher"))):
            RedisAlertSink(settings).write(rows[:1])
            taken = redis_client.brpop([queue], timeout=60)
            assert taken is not None, "the dispatcher queued no delivery"
            lost_at = time.monotonic()
            RedisAlertSink(settings).write(rows[1:])
            with running(settings, tmp_path / "logs", ("worker", worker_args())):
                receiver.wait_for(lambda r: True, timeout_s=silent_after_s(settings) + 60, count=len(rows))
                waited_s = time.monotonic() - lost_at
                time.sleep(1)  # a second copy would come now
        log = (tmp_path / "logs" / "dispatcher.log").read_text()
    finally:
        receiver.close()
    assert [[a["alert_id"] for a in got.json["alerts"]] for got in receiver.received] == [[r["alert_id"]] for r in rows]
    assert waited_s >= silent_after_s(settings) - 1  # sent again once silent that long, not before
    assert '"delivery_resent"' in log
    assert Outbox(redis_client, RedisKeys(settings), settings).count() == 0  # delivered: forgotten


@pytest.mark.slow  # fault injection (SIGKILL): run in CI
@pytest.mark.e2e
def test_a_worker_killed_mid_delivery_costs_its_alert_a_silence_not_the_visibility_timeout(
        settings, redis_client, owner, tmp_path: Path) -> None:
    # The production margin: the broker would hand the killed worker's task back after ~10 minutes.
    settings = settings.model_copy(update={"delivery_visibility_margin_s": 600.0, "smtp_timeout_s": 1.0,
                                           "webhook_total_timeout_s": 2.0, "pagerduty_attempt_timeout_s": 1.0,
                                           "dispatcher_claim_interval_s": 0.5})
    assert silent_after_s(settings) * 10 < settings.delivery_visibility_timeout_s
    receiver = WebhookReceiver(fail_first=1, slow_first=1, slow_s=3)  # the first request hangs: the worker dies in it
    try:
        with session_factory(settings.database_url)() as session:
            service = SubscriptionService(session, settings, redis_client, owner)
            endpoint = service.create_endpoint(EndpointIn(kind="webhook", target=receiver.url))
        notification = _notification("killed").to_json()
        started = time.monotonic()
        with running(settings, tmp_path / "logs", ("dispatcher", python_module("notifier.dispatcher"))):
            with running(settings, tmp_path / "logs", ("worker", worker_args())) as (process,):
                enqueue(make_celery(settings), Outbox(redis_client, RedisKeys(settings), settings), notification,
                        endpoint.id, binding(EndpointRoute.of(endpoint)))
                _eventually(lambda: receiver.attempts == 1)
                process.kill()
            with running(settings, tmp_path / "logs-restarted", ("worker", worker_args())):
                [got] = receiver.wait_for(lambda r: True, timeout_s=silent_after_s(settings) + 60)
                took_s = time.monotonic() - started
                time.sleep(1)
    finally:
        receiver.close()
    assert got.json["notification_id"] == "killed" and len(receiver.received) == 1
    assert took_s < settings.delivery_visibility_timeout_s / 5  # sent again by the outbox, not handed back


def test_the_dispatcher_sends_nothing_again_until_a_silence_after_its_start(settings, redis_client) -> None:
    # A worker holding a delivery it sent while Redis was away records it once Redis is back; a dispatcher (re)started
    # meanwhile, or one that saw the outage, waits a silence before sending anything again (its claim has expired).
    dispatcher = Dispatcher(settings.model_copy(update={"dispatcher_claim_interval_s": 0.0}))
    dispatcher.outbox.silent_after_s = SILENT_S
    dispatcher.outbox.add(_notification("n").to_json(), ENDPOINT, {})
    time.sleep(SILENT_S + 0.1)
    dispatcher.run_once()
    assert _queued(settings, redis_client) == [] and dispatcher.resend_from > time.monotonic() + SILENT_S
    assert REGISTRY.get_sample_value("tocsin_deliveries_pending") == 1  # counted while quiet too
    dispatcher.resend_from = time.monotonic()  # a silence later
    dispatcher.run_once()
    assert [args[0]["notification_id"] for args, _ in _queued(settings, redis_client)] == ["n"]


def test_a_task_that_is_not_a_delivery_is_queued_without_a_note(settings, redis_client) -> None:
    # A malformed task's dead letter, replayed: the worker dead-letters it again, with its reason; there is no
    # delivery (notification id, endpoint) to note, and the replay must not fail for it.
    records = DeliveryRecords(redis_client, RedisKeys(settings))
    letter = records.malformed({"notification": {"alerts": "nope"}, "endpoint_id": None}, "no notification id")
    outbox = _outbox(settings, redis_client)
    assert records.replay(letter, make_celery(settings), outbox)
    assert len(_queued(settings, redis_client)) == 1 and outbox.count() == 0
