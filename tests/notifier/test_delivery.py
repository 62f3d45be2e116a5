"""Deliveries through a real Celery worker (Redis broker) to a real HTTP receiver and SMTP server."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import redis
from celery import Celery
from sqlalchemy import text

from core.redis_schema import RedisKeys
from core.settings import Settings
from devstack.mailsink import MailSink
from devstack.patience import patient
from devstack.receiver import WebhookReceiver
from devstack.services import free_port, start_redis
from evaluator.spark.sink import RedisAlertSink
from evaluator.transition import alert_id
from notifier.app import DELIVER_TASK, make_celery
from notifier.deliveries import DeliveryRecords, binding, enqueue, publish
from notifier.dispatcher import Dispatcher
from notifier.notification import build_notification, notification_id
from notifier.outbox import Outbox
from subscriptions.db import session_factory
from subscriptions.models import Endpoint
from subscriptions.routing import EndpointRoute
from subscriptions.schemas import EndpointIn, SubscriptionIn
from subscriptions.service import SubscriptionService
from tests.processes import running, worker_args
from tests.users import api_client, new_user

pytestmark = pytest.mark.e2e


@pytest.fixture
def service(settings: Settings, redis_client: redis.Redis, owner) -> Iterator[SubscriptionService]:
    with session_factory(settings.database_url)() as session:
        yield SubscriptionService(session, settings, redis_client, owner)


def _subscription(service: SubscriptionService, endpoints: list[int], name: str = "volume", **policy: object) -> int:
    data = SubscriptionIn(name=name, condition="SUM(volume) OVER 1m > 100", endpoint_ids=endpoints, policy=policy)
    return service.create(data).id


def _transition(subscription_id: int, key: str, state: str, evaluated_at: int) -> dict:
    return {"alert_id": alert_id(subscription_id, key, state, evaluated_at), "subscription_id": subscription_id,
            "key": key, "state": state, "value": 150.0 if state == "firing" else 50.0,
            "window_start": evaluated_at - 60_000, "window_end": evaluated_at, "evaluated_at": evaluated_at}


def _notification(subscription_id: int, key: str = "AAPL") -> dict:
    alert = _transition(subscription_id, key, "firing", 1_700_000_060_000)
    info = {"id": subscription_id, "name": "volume", "condition": "SUM(volume) OVER 1m > 100"}
    return build_notification(info, [alert], notification_id([alert["alert_id"]]))


def _eventually(check: Callable[[], object], timeout_s: float = 60.0) -> object:
    deadline = time.monotonic() + patient(timeout_s)
    while time.monotonic() < deadline:
        if result := check():
            return result
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout_s}s: {check.__doc__ or check}")


@contextmanager
def worker(settings: Settings, log_dir: Path) -> Iterator:
    with running(settings, log_dir, ("worker", worker_args())) as (process,):
        yield process


def _outcomes(records: DeliveryRecords, subscription_id: int) -> list[str]:
    return [e["outcome"] for e in reversed(records.log(subscription_id))]


def test_receiver_failing_n_times_gets_exactly_one_delivery(settings, service, redis_client, tmp_path) -> None:
    receiver = WebhookReceiver(fail_first=3, fail_status=503)
    endpoint = service.create_endpoint(EndpointIn(kind="webhook", target=receiver.url))
    subscription_id = _subscription(service, [endpoint.id])
    records = DeliveryRecords(redis_client, RedisKeys(settings))
    notification = _notification(subscription_id)
    celery = make_celery(settings)
    try:
        with worker(settings, tmp_path / "logs"):
            celery.send_task(DELIVER_TASK, args=(notification, endpoint.id))
            celery.send_task(DELIVER_TASK, args=(notification, endpoint.id))  # a redelivered copy, concurrently
            receiver.wait_for(lambda r: True)
            _eventually(lambda: _outcomes(records, subscription_id).count("delivered"))
            time.sleep(1.5)  # give the copy time to (not) send again
    finally:
        receiver.close()
    assert receiver.attempts == 4 and len(receiver.received) == 1
    assert _outcomes(records, subscription_id) == ["retry", "retry", "retry", "delivered"]
    retry = records.log(subscription_id)[-1]
    assert retry["status_code"] == 503 and retry["error"] == "HTTP 503" and retry["latency_ms"] >= 0
    # Each copy numbers its own attempts from 1 (a copy that finds the other's claim waits, uncounted): usually
    # one copy makes all four, but under load the copy may win the claim between the other's retries.
    numbers = Counter(entry["attempt"] for entry in records.log(subscription_id))
    assert retry["attempt"] == 1 and sum(numbers.values()) == 4 and numbers[1] <= 2, numbers
    assert all(numbers[n] >= numbers[n + 1] for n in range(1, 5)), numbers  # runs 1..k per copy, no gaps


@pytest.mark.slow  # fault injection (SIGKILL): run in CI
def test_worker_killed_mid_delivery_redelivers_without_duplicate(settings, service, redis_client, tmp_path) -> None:
    # The first request hangs for a while and is then refused: the worker dies while it waits.
    receiver = WebhookReceiver(fail_first=1, slow_first=1, slow_s=3)
    endpoint = service.create_endpoint(EndpointIn(kind="webhook", target=receiver.url))
    subscription_id = _subscription(service, [endpoint.id])
    records = DeliveryRecords(redis_client, RedisKeys(settings))
    celery = make_celery(settings)
    try:
        with worker(settings, tmp_path / "logs") as process:
            celery.send_task(DELIVER_TASK, args=(_notification(subscription_id), endpoint.id))
            _eventually(lambda: receiver.attempts == 1)
            process.kill()
        assert receiver.received == [] and _outcomes(records, subscription_id) == []
        with worker(settings, tmp_path / "logs-restarted"):
            [got] = receiver.wait_for(lambda r: True, timeout_s=90)
            _eventually(lambda: _outcomes(records, subscription_id) == ["delivered"])
            time.sleep(1.5)
    finally:
        receiver.close()
    assert receiver.attempts == 2 and len(receiver.received) == 1
    assert got.json["notification_id"] == _notification(subscription_id)["notification_id"]


def test_refused_delivery_is_dead_lettered_and_replayed_from_the_web_app(settings, service, redis_client,
                                                                         owner_account, tmp_path) -> None:
    receiver = WebhookReceiver(fail_first=1, fail_status=410)  # a 4xx: final, no retries
    endpoint = service.create_endpoint(EndpointIn(kind="webhook", target=receiver.url))
    subscription_id = _subscription(service, [endpoint.id])
    records = DeliveryRecords(redis_client, RedisKeys(settings))
    celery = make_celery(settings)
    try:
        with worker(settings, tmp_path / "logs"), api_client(settings, new_user(settings, role="operator")[1]) as api:
            celery.send_task(DELIVER_TASK, args=(_notification(subscription_id), endpoint.id))
            _eventually(lambda: records.dead_letters())
            [letter] = api.get("/api/dead-letters").json()
            assert letter["status_code"] == 410 and letter["endpoint_id"] == endpoint.id
            assert receiver.attempts == 1 and receiver.received == []

            assert api.post("/api/dead-letters/nope:1/replay").status_code == 404
            assert api.post(f"/api/dead-letters/{letter['id']}/replay").json() == {"replayed": [letter["id"]]}
            receiver.wait_for(lambda r: True)
            assert api.get("/api/dead-letters").json() == []
            with api_client(settings, owner_account[1]) as subscriber:  # the delivery log is the owner's
                log = _eventually(lambda: [e for e in subscriber.get(f"/api/subscriptions/{subscription_id}/deliveries")
                                           .json()["deliveries"] if e["outcome"] == "delivered"])
            assert log[0]["status_code"] == 204 and log[0]["keys"] == ["AAPL"]
    finally:
        receiver.close()
    assert _outcomes(records, subscription_id) == ["dead", "delivered"]


def test_alert_policy_groups_cools_down_mutes_and_reminds(settings, service, redis_client, tmp_path) -> None:
    receiver = WebhookReceiver()
    sink = MailSink()
    settings = settings.model_copy(update={"smtp_port": sink.bound_port})
    hook = service.create_endpoint(EndpointIn(kind="webhook", target=receiver.url)).id
    mail = service.create_endpoint(EndpointIn(kind="email", target="ops@example.com")).id
    grouped = _subscription(service, [hook, mail], "grouped", cooldown_s=600)
    single = _subscription(service, [hook], "single", group=False, send_resolved=False)
    muted = _subscription(service, [hook], "muted", muted_until=datetime.now(UTC) + timedelta(hours=1))
    t1, t2, t3 = 1_700_000_060_000, 1_700_000_061_000, 1_700_000_062_000
    RedisAlertSink(settings).write([
        _transition(grouped, "AAPL", "firing", t1), _transition(grouped, "MSFT", "firing", t1),
        _transition(single, "X", "firing", t1), _transition(single, "Y", "firing", t1),
        _transition(muted, "Z", "firing", t1),
        _transition(grouped, "AAPL", "resolved", t2), _transition(single, "X", "resolved", t2),
        _transition(grouped, "AAPL", "firing", t3),  # flapping within the cool-down
    ])
    records = DeliveryRecords(redis_client, RedisKeys(settings))
    dispatcher = Dispatcher(settings)
    try:
        with running(settings, tmp_path / "logs", ("worker", worker_args())):
            dispatcher.read(block_ms=100)
            time.sleep(settings.dispatcher_group_wait_ms / 1000)
            dispatcher.flush()
            receiver.wait_for(lambda r: True, count=4)
            sink.wait_for(2)

            # MSFT stays firing; its re-notify interval (never shorter than the cool-down) passes.
            service.update(grouped, SubscriptionIn(name="grouped", condition="SUM(volume) OVER 1m > 100",
                                                   endpoint_ids=[hook], policy={"cooldown_s": 600, "renotify_s": 60}))
            redis_client.hset(RedisKeys(settings).key_states(grouped), "MSFT",
                              '{"notified_at": %f, "open": true}' % (time.time() - 601))
            with session_factory(settings.database_url)() as session:
                assert dispatcher.remind(session) == 1
                assert dispatcher.remind(session) == 0  # not again before the interval
            receiver.wait_for(lambda r: r.json["reminder"])
            time.sleep(1)
    finally:
        receiver.close()
        sink.close()

    hooks = sorted((r.json["subscription_name"], r.json["state"], r.json["reminder"],
                    tuple(a["key"] for a in r.json["alerts"])) for r in receiver.received)
    assert hooks == [
        ("grouped", "firing", False, ("AAPL", "MSFT")),  # one notification for the evaluation
        ("grouped", "firing", True, ("MSFT",)),  # the reminder
        ("grouped", "resolved", False, ("AAPL",)),
        ("single", "firing", False, ("X",)),
        ("single", "firing", False, ("Y",)),
    ]
    assert sorted(m["Subject"] for m in sink.messages) == [
        "[Tocsin] FIRING: grouped (AAPL, MSFT)", "[Tocsin] RESOLVED: grouped (AAPL)"]
    reasons = {(e["keys"][0], e["state"]): e["reason"] for sub in (grouped, single, muted)
               for e in records.log(sub) if e["outcome"] == "suppressed"}
    assert reasons == {("AAPL", "firing"): "cool-down", ("X", "resolved"): "send-resolved is off",
                       ("Z", "firing"): "muted"}
    assert redis_client.xpending(RedisKeys(settings).alerts_stream, "notifier")["pending"] == 0


def test_test_alert_goes_through_the_real_delivery_path(settings, tmp_path) -> None:
    from notifier.channels.webhook import SIGNATURE_HEADER, verify

    receiver = WebhookReceiver()
    _user, token = new_user(settings)
    try:
        with worker(settings, tmp_path / "logs"), api_client(settings, token) as api:
            endpoint = api.post("/api/endpoints", json={"kind": "webhook", "target": receiver.url}).json()
            queued = api.post(f"/api/endpoints/{endpoint['id']}/test").json()
            [got] = receiver.wait_for(lambda r: True)
            log = _eventually(lambda: api.get(f"/api/endpoints/{endpoint['id']}/deliveries").json()["deliveries"])
    finally:
        receiver.close()
    assert got.json["test"] is True and got.json["notification_id"] == queued["notification_id"]
    assert [a["key"] for a in got.json["alerts"]] == ["TEST"] and got.json["subscription_id"] is None
    assert verify(endpoint["secret"], got.headers[SIGNATURE_HEADER], got.body)
    assert log[0]["outcome"] == "delivered" and log[0]["notification_id"] == queued["notification_id"]


def _send(celery, notification: dict, endpoint, outbox: Outbox | None = None) -> None:
    """Queue a delivery as the dispatcher does, bound to the endpoint as it is now, noted in ``outbox``; without
    one, as a task already queued (the outbox's own tests are in tests/notifier/test_outbox.py)."""
    bound = binding(EndpointRoute.of(endpoint))
    if outbox is None:
        publish(celery, notification, endpoint.id, bound, None)
    else:
        enqueue(celery, outbox, notification, endpoint.id, bound)


def _log_of(records: DeliveryRecords, subscription_id: int, outcome: str) -> list[dict]:
    return [e for e in records.log(subscription_id) if e["outcome"] == outcome]


def test_a_retrying_delivery_of_a_deleted_endpoint_never_reaches_the_next_endpoint_with_its_id(
        settings, service, redis_client, tmp_path) -> None:
    old = WebhookReceiver(fail_first=10**6, fail_status=503)
    new = WebhookReceiver()
    endpoint = service.create_endpoint(EndpointIn(kind="webhook", target=old.url))
    endpoint_id = endpoint.id
    subscription_id = _subscription(service, [endpoint_id])
    records = DeliveryRecords(redis_client, RedisKeys(settings))
    settings = settings.model_copy(update={"delivery_max_retries": 1000})
    try:
        with worker(settings, tmp_path / "logs"):
            _send(make_celery(settings), _notification(subscription_id), endpoint)
            _eventually(lambda: old.attempts >= 2)  # failing and retrying
            service.update(subscription_id, SubscriptionIn(name="volume", condition="SUM(volume) OVER 1m > 100",
                                                           endpoint_ids=[]))
            service.delete_endpoint(endpoint_id)
            # Another user's endpoint, forced to the deleted one's id.
            other, _ = new_user(settings)
            with session_factory(settings.database_url)() as session:
                theirs = SubscriptionService(session, settings, redis_client, other).create_endpoint(
                    EndpointIn(kind="webhook", target=new.url))
                session.execute(text("update endpoints set id = :old where id = :new"),
                                {"old": endpoint_id, "new": theirs.id})
                session.commit()
            [drop] = _eventually(lambda: _log_of(records, subscription_id, "dropped"))
            time.sleep(1.5)  # time for a stray retry to (not) arrive
    finally:
        old.close()
        new.close()
    assert new.attempts == 0 and new.received == []
    assert drop["reason"] in {"endpoint deleted", "endpoint owner changed"} and drop["endpoint_id"] == endpoint_id
    # The drop is not written under the endpoint id (the old attempts are removed with the endpoint, elsewhere).
    assert all(e["outcome"] == "retry" for e in records.endpoint_log(endpoint_id))
    assert records.dead_letters() == []


def test_a_delivery_queued_before_a_secret_rotation_is_dropped(settings, service, redis_client, tmp_path) -> None:
    receiver = WebhookReceiver(fail_first=2, fail_status=503)
    endpoint = service.create_endpoint(EndpointIn(kind="webhook", target=receiver.url))
    subscription_id = _subscription(service, [endpoint.id])
    records = DeliveryRecords(redis_client, RedisKeys(settings))
    try:
        with worker(settings.model_copy(update={"delivery_backoff_base_s": 1, "delivery_backoff_max_s": 1}),
                    tmp_path / "logs"):
            _send(make_celery(settings), _notification(subscription_id), endpoint)
            _eventually(lambda: receiver.attempts >= 1)
            service.rotate_secret(endpoint.id)
            [drop] = _eventually(lambda: _log_of(records, subscription_id, "dropped"))
    finally:
        receiver.close()
    assert receiver.received == []
    assert drop["reason"] == "endpoint changed since enqueue (secret rotated)"


def test_retry_after_nan_is_retried_not_lost(settings, service, redis_client, tmp_path) -> None:
    receiver = WebhookReceiver(fail_first=2, fail_status=503, retry_after="nan")
    endpoint = service.create_endpoint(EndpointIn(kind="webhook", target=receiver.url))
    subscription_id = _subscription(service, [endpoint.id])
    records = DeliveryRecords(redis_client, RedisKeys(settings))
    try:
        with worker(settings, tmp_path / "logs"):
            _send(make_celery(settings), _notification(subscription_id), endpoint)
            receiver.wait_for(lambda r: True)
            _eventually(lambda: _log_of(records, subscription_id, "delivered"))
    finally:
        receiver.close()
    assert _outcomes(records, subscription_id) == ["retry", "retry", "delivered"]


def test_a_subscription_name_with_line_breaks_still_gets_its_email(settings, service, redis_client,
                                                                    tmp_path) -> None:
    sink = MailSink()
    settings = settings.model_copy(update={"smtp_port": sink.bound_port})
    endpoint = service.create_endpoint(EndpointIn(kind="email", target="ops@example.com"))
    subscription_id = _subscription(service, [endpoint.id])
    notification = {**_notification(subscription_id), "subscription_name": "volume\r\nBcc: victim@example.com"}
    records = DeliveryRecords(redis_client, RedisKeys(settings))
    try:
        with worker(settings, tmp_path / "logs"):
            _send(make_celery(settings), notification, endpoint)
            [message] = sink.wait_for(1)
            _eventually(lambda: _log_of(records, subscription_id, "delivered"))
    finally:
        sink.close()
    assert message["Subject"] == "[Tocsin] FIRING: volume Bcc: victim@example.com (AAPL)"
    assert message["Bcc"] is None


def test_an_unexpected_failure_is_recorded_retried_and_dead_lettered(settings, service, redis_client,
                                                                     tmp_path) -> None:
    sink = MailSink()
    settings = settings.model_copy(update={"smtp_port": sink.bound_port, "delivery_max_retries": 2})
    endpoint = service.create_endpoint(EndpointIn(kind="email", target="ops@example.com"))
    subscription_id = _subscription(service, [endpoint.id])
    broken = _notification(subscription_id)
    broken["alerts"][0]["value"] = "not a number"  # the e-mail template cannot format it
    records = DeliveryRecords(redis_client, RedisKeys(settings))
    try:
        with worker(settings, tmp_path / "logs"):
            _send(make_celery(settings), broken, endpoint)
            [letter] = _eventually(lambda: records.dead_letters())
    finally:
        sink.close()
    assert _outcomes(records, subscription_id) == ["retry", "retry", "dead"]
    assert letter["error"].startswith("internal error: ValueError") and letter["attempt"] == 3
    assert sink.messages == []


def test_a_redelivered_copy_of_a_dead_lettered_delivery_does_not_run_again(settings, service, redis_client,
                                                                           tmp_path) -> None:
    # A retry held past the visibility timeout comes back as a second copy; the first copy's
    # delivery already ended in a dead letter, so the copy must do nothing.
    refusing, sentinel = WebhookReceiver(fail_first=10**6, fail_status=410), WebhookReceiver()
    endpoint = service.create_endpoint(EndpointIn(kind="webhook", target=refusing.url))
    other = service.create_endpoint(EndpointIn(kind="webhook", target=sentinel.url))
    subscription_id = _subscription(service, [endpoint.id, other.id])
    records = DeliveryRecords(redis_client, RedisKeys(settings))
    celery = make_celery(settings)
    try:
        with running(settings, tmp_path / "logs", ("worker", worker_args(concurrency=1))):
            _send(celery, _notification(subscription_id), endpoint)
            _eventually(lambda: records.dead_letters())
            _send(celery, _notification(subscription_id), endpoint)  # the redelivered copy
            _send(celery, _notification(subscription_id), other)  # one thread, FIFO: arrives after the copy ran
            sentinel.wait_for(lambda r: True)
    finally:
        refusing.close()
        sentinel.close()
    assert refusing.attempts == 1 and len(records.dead_letters()) == 1
    assert _outcomes(records, subscription_id) == ["dead", "delivered"]


def test_a_malformed_task_is_dead_lettered_with_its_reason(settings, service, redis_client, tmp_path) -> None:
    receiver = WebhookReceiver()
    endpoint = service.create_endpoint(EndpointIn(kind="webhook", target=receiver.url))
    subscription_id = _subscription(service, [endpoint.id])
    records = DeliveryRecords(redis_client, RedisKeys(settings))
    celery = make_celery(settings)
    no_id = {k: v for k, v in _notification(subscription_id).items() if k != "notification_id"}
    no_state = {k: v for k, v in _notification(subscription_id, "MSFT").items() if k != "state"}
    malformed = [((no_id, endpoint.id), {}), ((), {}), (("not a notification", endpoint.id), {}),
                 ((no_state, endpoint.id), {}), ((_notification(subscription_id, "X"), "1"), {}),
                 ((_notification(subscription_id, "Y"), endpoint.id), {"surprise": 1})]
    try:
        with worker(settings, tmp_path / "logs"):
            for args, kwargs in malformed:
                celery.send_task(DELIVER_TASK, args=args, kwargs=kwargs)
            letters = _eventually(lambda: len(records.dead_letters()) == len(malformed) and records.dead_letters())
            _send(celery, _notification(subscription_id), endpoint)  # the worker goes on delivering
            receiver.wait_for(lambda r: True)
    finally:
        receiver.close()
    reasons = sorted(letter["error"] for letter in letters)
    assert reasons == sorted([
        "malformed task: notification has no notification_id", "malformed task: notification is NoneType, not an object",
        "malformed task: notification is str, not an object", "malformed task: notification has no state",
        "malformed task: endpoint_id '1' is not an id", "malformed task: unexpected arguments ['surprise']"])
    assert "delivery_malformed" in (tmp_path / "logs" / "worker.log").read_text()
    assert receiver.attempts == 1


@contextmanager
def _delivering(settings: Settings, service: SubscriptionService,
                tmp_path: Path) -> Iterator[tuple[Celery, Endpoint, int, WebhookReceiver]]:
    """A worker that has delivered one notification (AAPL) to a fresh receiver: up and delivering."""
    receiver = WebhookReceiver()
    endpoint = service.create_endpoint(EndpointIn(kind="webhook", target=receiver.url))
    subscription_id = _subscription(service, [endpoint.id])
    celery = make_celery(settings)
    try:
        with worker(settings, tmp_path / "logs"):
            _send(celery, _notification(subscription_id, "AAPL"), endpoint)
            receiver.wait_for(lambda r: True)
            yield celery, endpoint, subscription_id, receiver
    finally:
        receiver.close()


class _RecordsApart:
    """The delivery records in a Redis of their own (empty each time it starts), so a test can take it away while
    the broker stays."""

    def __init__(self, settings: Settings, tmp_path: Path) -> None:
        self.port, self.data = free_port(), tmp_path / "store"
        self.server = start_redis(self.port, self.data)
        self.settings = settings.model_copy(update={"redis_url": f"redis://127.0.0.1:{self.port}/0",
                                                    "celery_broker_url": settings.redis_url,
                                                    "delivery_store_wait_s": 0.2})

    def stop(self) -> None:
        self.server.stop()

    def start(self) -> None:
        self.server = start_redis(self.port, self.data)

    def outcomes(self, subscription_id: int) -> list[str]:
        return _outcomes(DeliveryRecords(redis.Redis.from_url(self.settings.redis_url, decode_responses=True),
                                         RedisKeys(self.settings)), subscription_id)


@pytest.mark.slow  # fault injection (Redis stopped), ~10 s: run in CI
def test_a_delivery_that_cannot_reach_redis_is_put_back_and_delivered_once_redis_answers(
        settings, service, tmp_path) -> None:
    store = _RecordsApart(settings, tmp_path)
    try:
        with _delivering(store.settings, service, tmp_path) as (celery, endpoint, subscription_id, receiver):
            store.stop()
            _send(celery, _notification(subscription_id, "MSFT"), endpoint)  # its claim cannot be written
            time.sleep(3)
            assert len(receiver.received) == 1, "nothing is sent while its delivery cannot be recorded"
            store.start()
            receiver.wait_for(lambda r: True, timeout_s=30, count=2)
            _eventually(lambda: store.outcomes(subscription_id) == ["delivered"])
            time.sleep(1)
    finally:
        store.stop()
    assert [r.json["alerts"][0]["key"] for r in receiver.received] == ["AAPL", "MSFT"]
    log = (tmp_path / "logs" / "worker.log").read_text()
    assert "redis_outage" in log  # once per outage, not Celery's warning and traceback per delivery put back
    assert "StoreAway" not in log and "Traceback" not in log


@pytest.mark.slow  # fault injection (Redis stopped), ~10 s: run in CI
def test_a_delivery_whose_records_redis_loses_after_sending_waits_to_record_it_and_is_not_sent_again(
        settings, service, tmp_path) -> None:
    """Redis gone between the receiver's answer and the delivery's records, and back empty (a Redis Cluster node
    without replica lost in that moment, as in ``test_node_loss``): the task was put back with neither its final
    mark nor its claim written, and sent again once Redis answered (failed before: MSFT received twice). Now the
    attempt waits in its thread for Redis to take its records."""
    store = _RecordsApart(settings, tmp_path)
    try:
        with _delivering(store.settings, service, tmp_path) as (celery, endpoint, subscription_id, receiver):
            def lose_the_store(got) -> None:
                if got.json["alerts"][0]["key"] == "MSFT":
                    store.stop()  # before the receiver answers: the worker's records after the send find no Redis

            receiver.on_receive = lose_the_store
            _send(celery, _notification(subscription_id, "MSFT"), endpoint)
            receiver.wait_for(lambda r: True, timeout_s=30, count=2)
            time.sleep(2)  # the worker finds Redis away (several tries at 0.2 s)
            store.start()  # empty: the claim and the first delivery's marks are gone
            _eventually(lambda: store.outcomes(subscription_id) == ["delivered"])
            time.sleep(1)  # a copy put back would be sent by now
    finally:
        store.stop()
    assert [r.json["alerts"][0]["key"] for r in receiver.received] == ["AAPL", "MSFT"]
    log = (tmp_path / "logs" / "worker.log").read_text()
    assert "redis_outage" in log and "Traceback" not in log


@pytest.mark.slow  # fault injection (the broker refuses), ~10 s: run in CI
def test_a_delivery_whose_broker_refuses_its_retry_is_put_back_not_lost(settings, service, redis_client,
                                                                       tmp_path) -> None:
    """Celery's ``Task.retry`` turned a refused publish into ``Reject(requeue=False)``: with the broker out of
    memory the message came back only after the visibility timeout (~18 min), or was removed if the broker took
    writes again in between (failed before: not delivered within 30 s). Now it is put back once the broker takes
    writes. Its own Redis here, so the test can fill the broker's memory while the records stay."""
    port = free_port()
    broker_redis = start_redis(port, tmp_path / "broker")
    settings = settings.model_copy(update={"celery_broker_url": f"redis://127.0.0.1:{port}/0",
                                           "delivery_store_wait_s": 2.0})
    broker = redis.Redis(port=port)
    try:
        with _delivering(settings, service, tmp_path) as (celery, endpoint, subscription_id, receiver):
            held = _notification(subscription_id, "MSFT")
            sending = RedisKeys(settings).sending(held["notification_id"], endpoint.id)
            redis_client.set(sending, "another copy", ex=60)  # so the delivery is sent again later: a retry
            celery.send_task(DELIVER_TASK, args=(held, endpoint.id), kwargs=binding(EndpointRoute.of(endpoint)),
                             queue=celery.conf.tocsin_lanes["alerts"], countdown=3)
            time.sleep(1.5)  # the worker holds it until it is due
            broker.config_set("maxmemory", 1)  # noeviction: every write that needs memory is refused
            time.sleep(2.5)  # it ran at 3 s and could not publish its retry
            broker.config_set("maxmemory", 0)
            redis_client.delete(sending)
            receiver.wait_for(lambda r: True, timeout_s=30, count=2)
    finally:
        broker_redis.stop()
    assert [r.json["alerts"][0]["key"] for r in receiver.received] == ["AAPL", "MSFT"]
    assert "redis_outage" in (tmp_path / "logs" / "worker.log").read_text()
