"""Delivery records against a real Redis: what a replay does to its dead letter, what a full cap answers."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from core.redis_schema import RedisKeys
from core.settings import Settings
from notifier.attempt import Attempt
from notifier.deliveries import Busy, DeliveryRecords
from notifier.notification import Notification, build_notification, notification_id
from notifier.tasks import _Delivery


def _notification() -> dict:
    alert = {"alert_id": "a1", "key": "AAPL", "state": "firing", "value": 1.0, "window_start": 0,
             "window_end": 60_000, "evaluated_at": 60_000}
    return build_notification({"id": 1, "name": "n", "condition": "c"}, [alert], notification_id(["a1"]))


class _FastWorker:
    """Stands in for Celery: the replayed delivery fails for good again before ``send_task`` returns."""

    def __init__(self, records: DeliveryRecords) -> None:
        self.records = records
        self.conf = type("Conf", (), {"tocsin_lanes": {"alerts": "q", "tests": "q:tests"}})()

    def send_task(self, _name: str, args: tuple, kwargs: dict, queue: str) -> None:
        notification, endpoint_id = args
        self.records.dead(notification, endpoint_id, "webhook", Attempt(False, False, 1.0, 410, "HTTP 410 again"),
                          1, kwargs)


def test_a_replayed_delivery_that_dies_again_at_once_keeps_its_new_dead_letter(settings: Settings,
                                                                               redis_client: redis.Redis) -> None:
    records = DeliveryRecords(redis_client, RedisKeys(settings))
    notification = _notification()
    records.dead(notification, 7, "webhook", Attempt(False, False, 1.0, 410, "HTTP 410"), 1, {})
    [letter] = records.dead_letters()
    assert records.replay(letter["id"], _FastWorker(records))
    [again] = records.dead_letters()  # the replay's own failure is not deleted with the old letter
    assert again["error"] == "HTTP 410 again" and again["id"] == letter["id"]
    assert not records.replay("nope:1", _FastWorker(records))


def test_a_full_cap_says_which_and_how_long_its_endpoint_last_took(settings: Settings,
                                                                   redis_client: redis.Redis) -> None:
    records = DeliveryRecords(redis_client, RedisKeys(settings))
    assert records.take_slot(1, 9, "a", 1, 2, 30) is None
    assert records.take_slot(1, 9, "b", 1, 2, 30) == Busy(endpoint_full=True)  # no attempt of it has ended yet
    records.free_slot(1, 9, "a", 0.0234)
    assert records.take_slot(1, 9, "c", 1, 2, 30) is None
    assert records.take_slot(1, 9, "d", 1, 2, 30) == Busy(endpoint_full=True, last_attempt_s=0.023, line_full=True)
    assert records.take_slot(2, 9, "e", 1, 2, 30) is None
    assert records.take_slot(3, 9, "f", 1, 2, 30) == Busy(endpoint_full=False)  # the owner's 2 are taken
    records.free_slot(2, 9, "e", None)  # an attempt that did not end leaves the last time as it was
    records.free_slot(1, 9, "c", None)
    assert records.take_slot(1, 9, "g", 1, 2, 30) is None
    assert records.take_slot(1, 9, "h", 1, 2, 30) == Busy(endpoint_full=True, last_attempt_s=0.023, line_full=True)


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
    assert records.take_slot(1, 9, "e", 1, 3, 30, wait_s=0.5) == Busy(True, 0.2, line_full=True)  # no slot to wait in
    assert records.take_slot(2, 9, "f", 1, 3, 30, wait_s=0.5) == Busy(False)  # another endpoint: the owner is full
    assert records.take_slot(1, 9, "g", 1, 3, 30, wait_s=0.3) == Busy(True, 0.2, line_full=True)  # 2 x 0.2 s > 0.3 s
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
