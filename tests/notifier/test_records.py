"""Delivery records against a real Redis: what a replay does to its dead letter, what a full cap answers."""

from __future__ import annotations

import base64
import json
import threading
import time

import pytest
import redis

from core.redis_schema import RedisKeys, celery_queue_keys
from core.settings import Settings
from devstack.receiver import WebhookReceiver
from notifier.app import DELIVER_TASK, make_celery
from notifier.attempt import Attempt
from notifier.channels import claim_ttl_s
from notifier.deliveries import Busy, DeliveryRecords, binding
from notifier.notification import Notification, build_notification, notification_id
from notifier.outbox import Outbox
from notifier.tasks import _Delivery
from subscriptions.routing import EndpointRoute
from tests.notifier.test_isolation import _endpoint


def _notification() -> dict:
    alert = {"alert_id": "a1", "key": "AAPL", "state": "firing", "value": 1.0, "window_start": 0,
             "window_end": 60_000, "evaluated_at": 60_000}
    return build_notification({"id": 1, "name": "n", "condition": "c"}, [alert], notification_id(["a1"]))


class _FastWorker:
    """Stands in for Celery: the replayed delivery fails for good again before ``send_task`` returns."""

    def __init__(self, records: DeliveryRecords) -> None:
        self.records = records
        self.conf = type("Conf", (), {"tocsin_lanes": {"alerts": "q", "tests": "q:tests"}})()

    def send_task(self, _name: str, args: tuple, kwargs: dict, queue: str, headers: dict | None = None) -> None:
        notification, endpoint_id = args
        self.records.dead(notification, endpoint_id, "webhook", Attempt(False, False, 1.0, 410, "HTTP 410 again"),
                          1, kwargs)


def test_a_replayed_delivery_that_dies_again_at_once_keeps_its_new_dead_letter(settings: Settings,
                                                                               redis_client: redis.Redis) -> None:
    records = DeliveryRecords(redis_client, RedisKeys(settings))
    notification = _notification()
    records.dead(notification, 7, "webhook", Attempt(False, False, 1.0, 410, "HTTP 410"), 1, {})
    [letter] = records.dead_letters()
    assert records.replay(letter["id"], _FastWorker(records), Outbox(redis_client, RedisKeys(settings), settings))
    [again] = records.dead_letters()  # the replay's own failure is not deleted with the old letter
    assert again["error"] == "HTTP 410 again" and again["id"] == letter["id"]
    assert not records.replay("nope:1", _FastWorker(records), Outbox(redis_client, RedisKeys(settings), settings))


def test_a_full_cap_says_which_and_how_long_its_endpoint_last_took(settings: Settings,
                                                                   redis_client: redis.Redis) -> None:
    records = DeliveryRecords(redis_client, RedisKeys(settings))
    assert records.take_slot(1, 9, "a", 1, 2, 30) is None
    assert records.take_slot(1, 9, "b", 1, 2, 30) == Busy(endpoint_full=True)  # no attempt of it has ended yet
    records.free_slot(1, 9, "a", 0.0234)
    assert records.take_slot(1, 9, "c", 1, 2, 30) is None
    assert records.take_slot(1, 9, "d", 1, 2, 30) == Busy(endpoint_full=True, last_attempt_s=0.023)
    assert records.take_slot(2, 9, "e", 1, 2, 30) is None
    assert records.take_slot(3, 9, "f", 1, 2, 30) == Busy(endpoint_full=False)  # the owner's 2 are taken
    records.free_slot(2, 9, "e", None)  # an attempt that did not end leaves the last time as it was
    records.free_slot(1, 9, "c", None)
    assert records.take_slot(1, 9, "g", 1, 2, 30) is None
    assert records.take_slot(1, 9, "h", 1, 2, 30) == Busy(endpoint_full=True, last_attempt_s=0.023)


def test_deliveries_that_find_an_endpoint_full_line_up_one_slot_of_its_time_apart(settings: Settings,
                                                                                   redis_client: redis.Redis) -> None:
    """Each comes back when a slot should be free for it, not every few hundred ms each: 120 deliveries to a
    receiver answering in 240 ms, looking again and again, kept another tenant's deliveries 1-2 s behind them."""
    records = DeliveryRecords(redis_client, RedisKeys(settings))
    records.free_slot(1, 9, "earlier", 0.2)  # the endpoint answers in 200 ms: a slot's worth is 250 ms at cap 1
    assert records.take_slot(1, 9, "holder", 1, 5, 30) is None
    turns = [records.take_slot(1, 9, token, 1, 5, 30, furthest_turn_s=1.0) for token in "abcde"]
    assert [t.turn_s for t in turns[:4]] == pytest.approx([0.25, 0.5, 0.75, 1.0], abs=0.02)  # type: ignore[union-attr]
    assert turns[4] == Busy(True, 0.2, line_full=True)  # past the furthest turn: no turn, the line is that long
    records.free_slot(2, 9, "earlier", 0.2)
    assert records.take_slot(2, 9, "holder", 2, 5, 30) is None
    assert records.take_slot(2, 9, "holder2", 2, 5, 30) is None
    assert records.take_slot(2, 9, "x", 2, 5, 30, furthest_turn_s=1.0).turn_s == pytest.approx(  # type: ignore[union-attr]
        0.125, abs=0.02)  # two slots: one frees every 125 ms
    waiter = records.take_slot(2, 9, "w", 2, 5, 30, wait_s=0.5, furthest_turn_s=1.0)
    assert waiter == Busy(True, 0.2, waiting=True)  # one waiting in its thread takes no turn


def test_a_line_spaces_out_behind_old_holds_and_starts_again_past_the_furthest_turn(
        settings: Settings, redis_client: redis.Redis) -> None:
    """Found in review: a receiver that holds some requests to the deadline and answers the others at once kept
    the last attempt time at ~1 ms, so the line's turns came 10 ms apart and one queued delivery looked ~90 times
    a second; and a line ahead of the Redis clock by more than the furthest turn (a clock stepped back) gave no
    delivery a turn until its key expired."""
    records = DeliveryRecords(redis_client, RedisKeys(settings))
    records.free_slot(1, 9, "earlier", 0.001)  # the endpoint's last attempt answered in 1 ms
    assert records.take_slot(1, 9, "held", 1, 5, 30) is None
    time.sleep(0.4)  # ... while this one is held
    busy = records.take_slot(1, 9, "a", 1, 5, 30, furthest_turn_s=5.0)
    assert busy is not None and busy.turn_s is not None and busy.turn_s >= 0.4 * 1.25
    redis_client.set(RedisKeys(settings).endpoint_turn(9, 1), (int(redis_client.time()[0]) + 60) * 1000)
    busy = records.take_slot(1, 9, "b", 1, 5, 30, furthest_turn_s=5.0)
    assert busy is not None and busy.turn_s is not None and busy.turn_s < 5.0


def test_a_zero_wait_setting_never_has_a_thread_wait_even_for_an_instant_endpoint(settings: Settings,
                                                                                 redis_client: redis.Redis) -> None:
    records = DeliveryRecords(redis_client, RedisKeys(settings))
    records.free_slot(1, 9, "earlier", 0.0)  # answered in under half a millisecond: 0 ms on record
    assert records.take_slot(1, 9, "holder", 1, 5, 30) is None
    busy = records.take_slot(1, 9, "a", 1, 5, 30, wait_s=0.0, furthest_turn_s=5.0)
    assert busy is not None and not busy.waiting and busy.turn_s is not None  # in the line, not in a thread


def test_a_waiter_holds_an_owner_slot_so_waiting_threads_count_against_the_owner_cap(
        settings: Settings, redis_client: redis.Redis) -> None:
    """Found in review: threads waiting for a quick endpoint held no slot, so one tenant's flood held them all."""
    records = DeliveryRecords(redis_client, RedisKeys(settings))
    owner_set = RedisKeys(settings).inflight_owner(9)
    assert records.take_slot(1, 9, "a", 1, 3, 30) is None
    records.free_slot(1, 9, "a", 0.2)
    assert records.take_slot(1, 9, "b", 1, 3, 30, wait_s=0.5) is None  # sending
    assert records.take_slot(1, 9, "c", 1, 3, 30, wait_s=0.5) == Busy(True, 0.2, waiting=True)
    assert records.take_slot(1, 9, "c", 1, 3, 30, wait_s=0.5) == Busy(True, 0.2, waiting=True)  # still its one hold
    assert records.take_slot(1, 9, "d", 1, 3, 30, wait_s=0.5) == Busy(True, 0.2, waiting=True)
    assert redis_client.zcard(owner_set) == 3  # one sending, two waiting: the owner's cap
    assert records.take_slot(1, 9, "e", 1, 3, 30, wait_s=0.5) == Busy(True, 0.2)  # no slot to wait in
    assert records.take_slot(2, 9, "f", 1, 3, 30, wait_s=0.5) == Busy(False)  # another endpoint: the owner is full
    assert records.take_slot(1, 9, "g", 1, 3, 30, wait_s=0.3) == Busy(True, 0.2)  # 2 x 0.2 s > 0.3 s
    records.free_slot(1, 9, "b", 0.2)
    assert records.take_slot(1, 9, "c", 1, 3, 30, wait_s=0.5) is None  # the waiter gets the endpoint slot
    assert redis_client.zcard(owner_set) == 2  # in the hold it had (c), and d still waiting
    records.free_slot(1, 9, "d", None)  # d gives up
    assert redis_client.zcard(owner_set) == 1


def test_a_waiting_delivery_gets_the_slot_its_holder_frees_before_a_newcomer(settings: Settings,
                                                                            redis_client: redis.Redis) -> None:
    """The in-thread wait (notifier.tasks) takes the slot within its poll of it being freed, so a delivery that
    arrives just after the free finds it taken (given back to the queue instead, it lost to newcomers)."""
    settings = settings.model_copy(update={"delivery_endpoint_concurrency": 1, "delivery_owner_concurrency": 2,
                                           "delivery_busy_wait_s": 0.5})
    records = DeliveryRecords(redis_client, RedisKeys(settings))
    records.free_slot(1, 9, "earlier", 0.2)  # the endpoint answers in 200 ms
    assert records.take_slot(1, 9, "holder", 1, 2, 30) is None
    delivery = _Delivery(None, settings, records, Notification.from_json(_notification()), 1,  # type: ignore[arg-type]
                         {"owner_id": 9, "generation": None}, 1, 0)
    got: list[Busy | None] = []
    waiter = threading.Thread(target=lambda: got.append(delivery.take_slot(9, "waiter")))
    waiter.start()
    time.sleep(0.2)
    records.free_slot(1, 9, "holder", 0.2)
    time.sleep(0.05)  # a newcomer, 50 ms after the free
    newcomer = records.take_slot(1, 9, "newcomer", 1, 2, 30, wait_s=0.5)
    waiter.join(5)
    assert got == [None], "the waiter did not get the freed slot"
    assert newcomer == Busy(True, 0.2, waiting=True)  # the slot is the waiter's now; the newcomer waits in turn


def test_a_waiter_that_gives_up_frees_the_owner_slot_it_waited_in(settings: Settings,
                                                                  redis_client: redis.Redis) -> None:
    settings = settings.model_copy(update={"delivery_endpoint_concurrency": 1, "delivery_owner_concurrency": 2,
                                           "delivery_busy_wait_s": 0.5})
    records = DeliveryRecords(redis_client, RedisKeys(settings))
    records.free_slot(1, 9, "earlier", 0.1)
    assert records.take_slot(1, 9, "holder", 1, 2, 30) is None
    delivery = _Delivery(None, settings, records, Notification.from_json(_notification()), 1,  # type: ignore[arg-type]
                         {"owner_id": 9, "generation": None}, 1, 0)
    started = time.monotonic()
    assert delivery.take_slot(9, "waiter") == Busy(True, 0.1, waiting=True)  # gave up after 2 x 100 ms
    assert 0.15 < time.monotonic() - started < 2.0
    assert redis_client.zrange(RedisKeys(settings).inflight_owner(9), 0, -1) == ["holder"]


def _published(redis_client: redis.Redis, settings: Settings) -> list[dict]:
    """The delivery kwargs of the messages on the alert lane's broker queue, oldest first (Celery protocol 2;
    the Redis transport pushes on the left)."""
    queue, _ = celery_queue_keys(settings)
    return [json.loads(base64.b64decode(json.loads(raw)["body"]))[1]
            for raw in reversed(redis_client.lrange(queue, 0, -1))]


def test_a_turn_in_the_line_does_not_double_a_later_delay(settings: Settings, redis_client: redis.Redis) -> None:
    """A turn is a place, not a failed look: a delivery that had taken three turns and then found its owner full
    waited 16 s (2 s busy delay doubled three times), not 1-3 s. Through a real publish to the real broker."""
    settings = settings.model_copy(update={"delivery_endpoint_concurrency": 1, "delivery_owner_concurrency": 2,
                                           "delivery_busy_wait_s": 0.0, "delivery_busy_delay_s": 2.0})
    receiver = WebhookReceiver()
    try:
        endpoint = _endpoint(settings, redis_client, receiver.url)
    finally:
        receiver.close()
    celery = make_celery(settings)

    def publish_only(*_: object, **__: object) -> None:
        """Only published to here, never run: the test reads the broker's queue."""

    task = celery.task(bind=True, name=DELIVER_TASK)(publish_only)
    records = DeliveryRecords(redis_client, RedisKeys(settings))
    records.free_slot(endpoint.id, endpoint.owner_id, "earlier", 0.2)
    hold_s = claim_ttl_s(settings)  # as every attempt holds its slot
    assert records.take_slot(endpoint.id, endpoint.owner_id, "holder", 1, 2, hold_s) is None

    def run(deferrals: int) -> str:
        return _Delivery(task, settings, records, Notification.from_json(_notification()), endpoint.id,
                         binding(EndpointRoute.of(endpoint)), 1, deferrals).run()

    assert run(3) == "deferred"  # the endpoint full: a turn
    records.free_slot(endpoint.id, endpoint.owner_id, "holder", 0.2)
    for other in (1, 2):  # the owner full, with other endpoints
        assert records.take_slot(endpoint.id + other, endpoint.owner_id, f"elsewhere{other}", 1, 2, hold_s) is None
    assert run(3) == "deferred"  # the owner full: a look in vain
    assert [kwargs["deferrals"] for kwargs in _published(redis_client, settings)] == [3, 4]
