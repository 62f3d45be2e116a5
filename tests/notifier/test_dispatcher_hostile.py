"""Hostile conditions for the dispatcher (real Redis, real dispatcher processes, a real broker Redis).

Nothing may stop or silence it: a poison entry costs that entry only, and a broker outage delays
deliveries without killing the process (its entries stay pending and are claimed back).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
import redis

from core.redis_schema import NOTIFIER_GROUP, RedisKeys, celery_queue_keys
from core.settings import Settings
from devstack.patience import patient
from devstack.services import free_port, python_module, start_redis
from evaluator.spark.sink import RedisAlertSink
from notifier.app import make_celery
from notifier.dispatcher import Dispatcher
from tests.notifier.test_dispatcher_claims import _subscription
from tests.notifier.test_dispatcher_poison import _transition
from tests.processes import running, worker_args
from tests.rediscluster.test_delivery import DISPATCHER, Deployment, _deployment, _eventually, _settled


def test_entries_that_parse_but_cannot_be_dispatched_are_dead_lettered(settings: Settings,
                                                                      redis_client: redis.Redis) -> None:
    """Nesting past the recursion limit, and a subscription id no database holds: dead letters, not a crash loop."""
    keys = RedisKeys(settings)
    dispatcher = Dispatcher(settings, make_celery(settings))
    huge = {**_transition(1, 1_700_000_060_000), "subscription_id": 2**64}
    poison = [{"alert": "[" * 100_000}, {"alert": json.dumps(huge)},
              {"alert": json.dumps({**huge, "subscription_id": -5})}]
    for fields in poison:
        redis_client.xadd(keys.alerts_stream, fields)
    assert RedisAlertSink(settings).write([_transition(987_654, 1_700_000_060_000)]) == 1

    assert dispatcher.read(block_ms=1_000) == 1  # only the good one is buffered
    dispatcher.flush(force=True)

    reasons = [fields["reason"] for _, fields in redis_client.xrange(keys.alerts_dead)]
    assert len(reasons) == len(poison), reasons
    assert reasons[0].startswith("RecursionError")
    assert "subscription_id" in reasons[1] and "subscription_id" in reasons[2]
    assert redis_client.xpending(keys.alerts_stream, NOTIFIER_GROUP)["pending"] == 0


@pytest.fixture
def info_logs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The dispatcher's ``dispatcher_started`` is an info line; the suite's children log at WARNING."""
    monkeypatch.setenv("TOCSIN_LOG_LEVEL", "INFO")


def _wait(predicate, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + patient(timeout_s)
    while not predicate():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.1)


def test_a_broker_outage_does_not_kill_the_dispatcher(settings: Settings, redis_client: redis.Redis, owner,
                                                      tmp_path: Path, info_logs: None) -> None:
    port = free_port()
    broker = start_redis(port, tmp_path / "broker", tmp_path / "broker.log")
    settings = settings.model_copy(update={"celery_broker_url": f"redis://127.0.0.1:{port}/0",
                                           "dispatcher_claim_idle_ms": 500, "dispatcher_claim_interval_s": 0.2,
                                           "dispatcher_group_wait_ms": 0})
    sid = _subscription(settings, redis_client, owner)
    queue = celery_queue_keys(settings)[0]
    log = tmp_path / "logs" / "dispatcher.log"
    try:
        with running(settings, tmp_path / "logs", ("dispatcher", python_module("notifier.dispatcher"))) as [proc]:
            _wait(lambda: b"dispatcher_started" in log.read_bytes() or proc.process.poll() is not None,
                  "the dispatcher to start")
            assert proc.process.poll() is None, log.read_text()[-3_000:]
            broker.stop()
            assert RedisAlertSink(settings).write([_transition(sid, 1_700_000_060_000)]) == 1
            _wait(lambda: b"dispatch_failed" in log.read_bytes() or proc.process.poll() is not None,
                  "the dispatcher to try the broker")
            assert proc.process.poll() is None, log.read_text()[-3_000:]  # alive, the entry still pending
            assert redis_client.xpending(RedisKeys(settings).alerts_stream, NOTIFIER_GROUP)["pending"] == 1
            broker = start_redis(port, tmp_path / "broker", tmp_path / "broker.log")
            back = redis.Redis(port=port, decode_responses=True)
            _wait(lambda: redis_client.xpending(RedisKeys(settings).alerts_stream, NOTIFIER_GROUP)["pending"] == 0,
                  "the entry to be claimed back and dispatched")
            assert back.llen(queue) >= 1  # enqueued (a retry that raced the outage may enqueue twice: the worker drops it)
            assert proc.process.poll() is None
    finally:
        broker.stop()


@pytest.mark.e2e
@pytest.mark.slow  # fault injection (SIGSTOP, then SIGCONT), ~12 s: run in CI
def test_a_stalled_dispatcher_resumed_after_its_entries_were_claimed_sends_nothing_twice(settings: Settings,
                                                                                         tmp_path: Path) -> None:
    """A reads an evaluation and is SIGSTOPped holding it; B claims A's entries and delivers them, then the next.

    A resumes and, told to stop, dispatches what it still holds (its last flush): the stored decisions and
    the worker's delivered marks keep every alert delivered once.
    """
    for deployment in _deployment(settings.model_copy(update={"redis_partitions": 2}), n=3):
        _stall_claim_and_resume(deployment, tmp_path)


def _stall_claim_and_resume(d: Deployment, tmp_path: Path) -> None:
    quick_claims = {"dispatcher_claim_idle_ms": 1_000, "dispatcher_claim_interval_s": 0.3}
    a = d.settings.model_copy(update={"dispatcher_consumer": "a", "dispatcher_group_wait_ms": 600_000,
                                      **quick_claims})
    b = d.settings.model_copy(update={"dispatcher_consumer": "b", **quick_claims})
    logs = tmp_path / "logs"
    queue, unacked = celery_queue_keys(d.settings)
    broker = redis.Redis.from_url(d.settings.broker_url, decode_responses=True)
    with running(d.settings, logs, ("worker", worker_args())), \
            running(a, logs, ("dispatcher-a", DISPATCHER)) as [stalled]:
        first = d.fire(1_700_000_060_000)
        _eventually(lambda: d.pending("a") == len(first), "A read the first evaluation")
        os.kill(stalled.process.pid, signal.SIGSTOP)
        try:
            with running(b, logs, ("dispatcher-b", DISPATCHER)):
                _eventually(_settled(d, first), "B claimed A's entries and delivered them")
                second = d.fire(1_700_000_120_000)
                _eventually(_settled(d, first + second), "B delivered the next evaluation")
        finally:
            os.kill(stalled.process.pid, signal.SIGCONT)
        stalled.stop()  # SIGTERM: A's last flush dispatches the first evaluation again
        assert b"Traceback" not in (logs / "dispatcher-a.log").read_bytes()
        _eventually(lambda: broker.llen(queue) == 0 and broker.hlen(unacked) == 0, "the worker drained its queue")
    assert d.delivered() == Counter(dict.fromkeys(first + second, 1))


def test_a_stream_lost_with_its_group_is_read_again(settings: Settings, redis_client: redis.Redis, owner,
                                                     tmp_path: Path, info_logs: None) -> None:
    """A Redis restarted without its data loses the stream and its group; the sink writes a new stream.

    Before, the dispatcher died on NOGROUP (a restart made the group again); now that a failed round no longer
    stops it, it must make the group itself, or it would live on reading nothing.
    """
    settings = settings.model_copy(update={"dispatcher_group_wait_ms": 0})
    sid = _subscription(settings, redis_client, owner)
    stream = RedisKeys(settings).alerts_stream
    log = tmp_path / "logs" / "dispatcher.log"
    with running(settings, tmp_path / "logs", ("dispatcher", python_module("notifier.dispatcher"))) as [proc]:
        _wait(lambda: b"dispatcher_started" in log.read_bytes() or proc.process.poll() is not None, "the dispatcher to start")
        assert redis_client.delete(stream) == 1
        assert RedisAlertSink(settings).write([_transition(sid, 1_700_000_060_000)]) == 1
        _wait(lambda: redis_client.llen(celery_queue_keys(settings)[0]) == 1 or proc.process.poll() is not None,
              "the new stream's entry to be dispatched")
        assert proc.process.poll() is None, log.read_text()[-3_000:]
        assert b"consumer_group_missing" in log.read_bytes()


def test_a_failed_round_is_counted_and_the_loop_goes_on(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """What no longer stops the dispatcher must still show: tocsin_dispatcher_failed_rounds_total."""
    from prometheus_client import REGISTRY

    dispatcher = Dispatcher(settings, make_celery(settings))
    rounds: list[int] = []

    def run_once() -> None:
        rounds.append(1)
        if len(rounds) == 1:
            raise RuntimeError("a bug, or the broker away")
        dispatcher.running = False

    monkeypatch.setattr(dispatcher, "run_once", run_once)
    monkeypatch.setattr(signal, "signal", lambda *_: None)  # the test process keeps its own SIGTERM handling
    monkeypatch.setattr(time, "sleep", lambda _: None)
    before = REGISTRY.get_sample_value("tocsin_dispatcher_failed_rounds_total") or 0.0
    dispatcher.run()
    assert len(rounds) == 2
    assert REGISTRY.get_sample_value("tocsin_dispatcher_failed_rounds_total") == before + 1


def test_an_entry_whose_dispatch_always_fails_is_dead_lettered_after_max_deliveries(
        settings: Settings, redis_client: redis.Redis, owner) -> None:
    """A subscription whose routing raises every time (its stored policy no longer validates) was claimed back and
    tried again forever, and, routed in one batch with the others, it failed theirs too."""
    from prometheus_client import REGISTRY
    from sqlalchemy import update

    from subscriptions.db import session_factory
    from subscriptions.models import Subscription

    settings = settings.model_copy(update={"dispatcher_claim_idle_ms": 1, "dispatcher_max_deliveries": 3,
                                           "dispatcher_group_wait_ms": 0})
    keys = RedisKeys(settings)
    bad, good = _subscription(settings, redis_client, owner), _subscription(settings, redis_client, owner)
    with session_factory(settings.database_url)() as session:
        session.execute(update(Subscription).where(Subscription.id == bad).values(policy={"cooldown_s": -1}))
        session.commit()
    dispatcher = Dispatcher(settings, make_celery(settings))
    assert RedisAlertSink(settings).write([_transition(bad, 1_700_000_060_000),
                                           _transition(good, 1_700_000_060_000)]) == 2
    before = REGISTRY.get_sample_value("tocsin_dispatcher_undeliverable_total") or 0.0
    assert dispatcher.read(block_ms=1_000) == 2
    failures = 0
    for _ in range(10):  # the dispatcher's rounds: claim, flush
        try:
            dispatcher.flush(force=True)
        except ValueError:  # pydantic's ValidationError: the bad subscription's routing
            failures += 1
        if redis_client.xpending(keys.alerts_stream, NOTIFIER_GROUP)["pending"] == 0:
            break
        time.sleep(0.01)
        dispatcher.claim()
    assert redis_client.xpending(keys.alerts_stream, NOTIFIER_GROUP)["pending"] == 0, "still retried"
    assert failures == 3  # the first read and two claims; the third claim gave up on it
    [(_, letter)] = redis_client.xrange(keys.alerts_dead)
    assert json.loads(json.loads(letter["entry"])["alert"])["subscription_id"] == bad
    assert letter["reason"].startswith("not dispatched after 3 deliveries (dispatcher_max_deliveries 3): "
                                       "ValidationError"), letter["reason"]
    assert REGISTRY.get_sample_value("tocsin_dispatcher_undeliverable_total") == before + 1
    assert redis_client.llen(celery_queue_keys(settings)[0]) == 1  # the good subscription's, once, at the first go


def test_an_outage_puts_the_group_back_without_counting_a_delivery(settings: Settings, redis_client: redis.Redis,
                                                                   owner, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bounding deliveries must not dead-letter alerts for a broker outage: the group waits in the buffer."""
    from kombu.exceptions import OperationalError

    settings = settings.model_copy(update={"dispatcher_claim_idle_ms": 1, "dispatcher_max_deliveries": 2})
    keys = RedisKeys(settings)
    sid = _subscription(settings, redis_client, owner)
    dispatcher = Dispatcher(settings, make_celery(settings))
    assert RedisAlertSink(settings).write([_transition(sid, 1_700_000_060_000)]) == 1
    assert dispatcher.read(block_ms=1_000) == 1

    def broker_down(*_: object) -> None:
        raise OperationalError("the broker is down")

    with monkeypatch.context() as patched:
        patched.setattr(dispatcher, "enqueue", broker_down)
        for _ in range(5):
            with pytest.raises(OperationalError):
                dispatcher.flush(force=True)
            time.sleep(0.01)
            dispatcher.claim()
    # XAUTOCLAIM took the held entry at each claim (idle past the claim time) and counted a delivery: put back.
    [pending] = redis_client.xpending_range(keys.alerts_stream, NOTIFIER_GROUP, min="-", max="+", count=10)
    assert pending["times_delivered"] == 1 and len(dispatcher.buffer) == 1
    dispatcher.flush(force=True)
    assert redis_client.xpending(keys.alerts_stream, NOTIFIER_GROUP)["pending"] == 0
    assert redis_client.xlen(keys.alerts_dead) == 0
    assert redis_client.llen(celery_queue_keys(settings)[0]) == 1
