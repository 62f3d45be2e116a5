"""Alerts on a Redis Cluster delivered through real dispatcher and Celery worker processes to a real
receiver, each once: with one dispatcher, with two sharing the group while one is SIGKILLed mid-stream,
and across the window a crash leaves between a dispatcher's enqueueing and its acknowledgement.

The same two-dispatcher test runs on the single Redis (the default), with one partition and with four.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from core.redis_client import broker_client, make_redis
from core.redis_schema import NOTIFIER_GROUP, RedisKeys, celery_queue_keys, seen_bucket
from core.settings import Settings
from devstack.patience import patient
from devstack.receiver import WebhookReceiver
from devstack.services import python_module
from evaluator.spark.sink import RedisAlertSink
from notifier.dispatcher import Dispatcher
from notifier.notification import make_notification
from subscriptions.db import session_factory
from subscriptions.routing import routes
from subscriptions.schemas import EndpointIn, SubscriptionIn
from subscriptions.service import SubscriptionService
from tests.evaluator.spark.test_sink import transition
from tests.processes import running, worker_args
from tests.users import api_client, new_user, sign_in
from web.ops import collect_sample

pytestmark = pytest.mark.e2e

KEYS = ("AAPL", "MSFT", "NVDA")


@dataclass
class Deployment:
    settings: Settings
    client: redis.Redis
    receiver: WebhookReceiver
    subscriptions: list[int]
    token: str
    email: str
    endpoint: int

    def fire(self, at: int) -> list[str]:
        """One evaluation's firing transitions for every subscription and key, through the sink; their ids."""
        batch = [transition(sid, key, "firing", at) for sid in self.subscriptions for key in KEYS]
        assert RedisAlertSink(self.settings).write(batch) == len(batch)
        return [t["alert_id"] for t in batch]

    def delivered(self) -> Counter[str]:
        """How many times the receiver got each alert (an alert id in a delivered notification)."""
        return Counter(a["alert_id"] for r in list(self.receiver.received) for a in r.json["alerts"])

    def pending(self, consumer: str | None = None) -> int:
        total = 0
        for stream in RedisKeys(self.settings).alerts_streams:
            try:
                summary = self.client.xpending(stream, NOTIFIER_GROUP)
            except redis.ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                continue  # no dispatcher has made the group yet
            total += sum(c["pending"] for c in summary["consumers"] if consumer in (None, c["name"]))
        return total


def _eventually(check: Callable[[], object], what: str, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + patient(timeout_s)
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout_s}s: {what}"
        time.sleep(0.05)


def _deployment(settings: Settings, n: int = 6) -> Iterator[Deployment]:
    receiver = WebhookReceiver()
    client = make_redis(settings, decode_responses=True)
    user, token = new_user(settings, role="operator")  # an operator subscribes too, and sees the dashboard
    with session_factory(settings.database_url)() as session:
        service = SubscriptionService(session, settings, client, user)
        hook = service.create_endpoint(EndpointIn(kind="webhook", target=receiver.url)).id
        subscriptions = [service.create(SubscriptionIn(name=f"s{i}", condition="SUM(volume) OVER 1m > 100",
                                                       endpoint_ids=[hook])).id for i in range(n)]
    try:
        yield Deployment(settings, client, receiver, subscriptions, token, user.email, hook)
    finally:
        receiver.close()
        client.close()


@pytest.fixture
def on_cluster(cluster_settings: Settings) -> Iterator[Deployment]:
    yield from _deployment(cluster_settings)


DISPATCHER = python_module("notifier.dispatcher")


def _settled(deployment: Deployment, alerts: list[str]) -> Callable[[], bool]:
    def check() -> bool:
        got = deployment.delivered()
        return all(got[a] for a in alerts) and deployment.pending() == 0
    return check


def test_one_dispatcher_delivers_every_alert_once_and_the_web_app_reads_the_cluster(
        on_cluster: Deployment, tmp_path: Path) -> None:
    d = on_cluster
    settings = d.settings.model_copy(update={"dispatcher_consumer": "only"})
    with running(settings, tmp_path / "logs", ("worker", worker_args()),
                 ("dispatcher", DISPATCHER)):
        first = d.fire(1_700_000_060_000)
        _eventually(_settled(d, first), "every alert delivered and acknowledged")
        second = d.fire(1_700_000_120_000)
        _eventually(_settled(d, first + second), "the second evaluation delivered")
        _eventually(lambda: int(d.client.hget(RedisKeys(settings).delivery_stats, "delivered") or 0)
                    == len(d.receiver.received), "every delivery recorded")
    assert d.delivered() == Counter(dict.fromkeys(first + second, 1))
    assert len(d.receiver.received) == 2 * len(d.subscriptions)  # one grouped notification per evaluation

    sid = d.subscriptions[-1]
    with api_client(settings, d.token) as api:
        alerts = api.get(f"/api/subscriptions/{sid}/alerts").json()["alerts"]
        assert {a["alert_id"] for a in alerts} == {transition(sid, k, "firing", at)["alert_id"] for k in KEYS
                                                   for at in (1_700_000_060_000, 1_700_000_120_000)}
        assert set(api.get(f"/api/subscriptions/{sid}/firing").json()["firing"]) == set(KEYS)
        outcomes = [e["outcome"] for e in api.get(f"/api/subscriptions/{sid}/deliveries").json()["deliveries"]]
        assert outcomes == ["delivered", "delivered"]
    with api_client(settings) as browser:  # the pages read the same keys
        sign_in(browser, d.email)
        pages = {path: browser.get(path) for path in (
            "/", f"/subscriptions/{sid}/firing", f"/subscriptions/{sid}/history", f"/subscriptions/{sid}/deliveries",
            f"/endpoints/{d.endpoint}/deliveries", "/ops", "/ops/dead-letters")}
    assert {path: r.status_code for path, r in pages.items()} == dict.fromkeys(pages, 200)
    assert all(key in pages[f"/subscriptions/{sid}/firing"].text for key in KEYS)
    assert pages[f"/subscriptions/{sid}/deliveries"].text.count("delivered") >= 2
    sample = collect_sample(settings, d.client, None)  # the operators' dashboard: the cluster and Celery's Redis
    assert (sample["delivered"], sample["queued"], sample["transitions"]) == (len(d.receiver.received), 0, 0)

    keys = RedisKeys(settings)  # deleting the subscription forgets its state, marks and decisions on the cluster
    state = [keys.firing(sid), keys.history(sid), keys.counters(sid), keys.key_states(sid), keys.delivery_log(sid),
             *[keys.decision(sid, t["alert_id"]) for t in alerts]]
    seen = [(keys.seen(sid, seen_bucket(t["evaluated_at"])), t["alert_id"]) for t in alerts]
    assert d.client.exists(*state[:5]) == 5 and all(d.client.exists(k) for k in state[5:])
    assert all(d.client.sismember(key, alert) for key, alert in seen)
    with api_client(settings, d.token) as api:
        assert api.delete(f"/api/subscriptions/{sid}").status_code == 204
    assert not any(d.client.exists(k) for k in state) and not any(d.client.sismember(key, a) for key, a in seen)


@pytest.mark.slow  # fault injection (SIGKILL), ~30 s: run in CI
def test_two_dispatchers_deliver_every_alert_once_when_one_is_killed_mid_stream(
        on_cluster: Deployment, tmp_path: Path) -> None:
    _two_dispatchers_one_killed(on_cluster, tmp_path)


@pytest.mark.slow  # fault injection (SIGKILL), ~15 s each: run in CI
@pytest.mark.parametrize("partitions", [1, 4])
def test_two_dispatchers_on_a_single_redis(settings: Settings, partitions: int, tmp_path: Path) -> None:
    for deployment in _deployment(settings.model_copy(update={"redis_partitions": partitions})):
        _two_dispatchers_one_killed(deployment, tmp_path)


def _two_dispatchers_one_killed(d: Deployment, tmp_path: Path) -> None:
    """A holds what it reads (a long group wait) and is SIGKILLed holding it; B claims A's entries once idle.

    Both read the second evaluation, so both hold part of the stream when A dies; B alone reads the third.
    """
    quick_claims = {"dispatcher_claim_idle_ms": 1_500, "dispatcher_claim_interval_s": 0.3}
    a = d.settings.model_copy(update={"dispatcher_consumer": "a", "dispatcher_group_wait_ms": 600_000,
                                      **quick_claims})
    b = d.settings.model_copy(update={"dispatcher_consumer": "b", **quick_claims})
    logs = tmp_path / "logs"
    with running(d.settings, logs, ("worker", worker_args())), running(a, logs, ("dispatcher-a", DISPATCHER)) as [
            killed]:
        first = d.fire(1_700_000_060_000)
        _eventually(lambda: d.pending("a") == len(first), "A read the first evaluation")
        with running(b, logs, ("dispatcher-b", DISPATCHER)):
            second = d.fire(1_700_000_120_000)
            _eventually(lambda: d.pending("a") - len(first) + sum(1 for x in second if d.delivered()[x]) == len(second),
                        "the second evaluation held by A or delivered through B")
            assert d.delivered().keys().isdisjoint(first), "A's entries went out before A died"
            killed.kill()
            third = d.fire(1_700_000_180_000)
            everything = first + second + third
            _eventually(_settled(d, everything), "every alert delivered and acknowledged after A died")
            _eventually(lambda: int(d.client.hget(RedisKeys(d.settings).delivery_stats, "delivered") or 0)
                        == len(d.receiver.received), "every delivery recorded")
    assert d.delivered() == Counter(dict.fromkeys(everything, 1))


def test_an_entry_enqueued_but_not_acknowledged_is_claimed_and_delivered_once(
        on_cluster: Deployment, tmp_path: Path) -> None:
    """The window a crash leaves: A decided and enqueued a notification, then died before acknowledging.

    B claims the entries, finds A's decisions, rebuilds the same notifications; the worker sends each once.
    """
    d = on_cluster
    settings = d.settings.model_copy(update={"dispatcher_claim_idle_ms": 1})
    a = Dispatcher(settings.model_copy(update={"dispatcher_consumer": "a"}))
    b = Dispatcher(settings.model_copy(update={"dispatcher_consumer": "b"}))
    fired = d.fire(1_700_000_060_000)
    assert a.read(block_ms=None) == len(fired)
    with session_factory(settings.database_url)() as session:
        known = routes(session, set(d.subscriptions))
    enqueued = set()
    for key, group in a.buffer.items():  # what A's dispatch does, without its final acknowledgement
        route = known[key[0]]
        alerts = [alert for _, alert in group.entries]
        assigned = a.decide(route.subscription_id, route.policy, alerts)
        for nid in set(assigned.values()):
            assert nid is not None
            a.enqueue(make_notification({"id": route.subscription_id, "name": route.name,
                                         "condition": route.condition}, alerts, nid), route)
            enqueued.add(nid)
    assert d.pending("a") == len(fired)
    time.sleep(0.01)  # past the 1 ms idle time
    assert b.claim() == len(fired) and d.pending("b") == len(fired)
    b.flush(force=True)
    assert d.pending() == 0
    # One worker thread: a copy meets the delivered mark of the other (concurrent copies wait out the other's hold).
    with running(settings, tmp_path / "logs", ("worker", worker_args(concurrency=1))):
        _eventually(lambda: d.delivered().total() >= len(fired), "every alert delivered")
        broker, (queue, unacked) = broker_client(settings), celery_queue_keys(settings)
        _eventually(lambda: broker.llen(queue) == 0 and broker.hlen(unacked) == 0, "both copies of every task handled")
    assert d.delivered() == Counter(dict.fromkeys(fired, 1))
    assert {r.json["notification_id"] for r in d.receiver.received} == enqueued  # B rebuilt A's notifications
    assert int(d.client.hget(RedisKeys(settings).delivery_stats, "delivered") or 0) == len(enqueued)
