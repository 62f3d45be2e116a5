"""Delivery records against a real Redis: what a replay does to its dead letter, what a full cap answers."""

from __future__ import annotations

import redis

from core.redis_schema import RedisKeys
from core.settings import Settings
from notifier.attempt import Attempt
from notifier.deliveries import Busy, DeliveryRecords
from notifier.notification import build_notification, notification_id


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
    assert records.take_slot(1, 9, "d", 1, 2, 30) == Busy(endpoint_full=True, last_attempt_s=0.023)
    assert records.take_slot(2, 9, "e", 1, 2, 30) is None
    assert records.take_slot(3, 9, "f", 1, 2, 30) == Busy(endpoint_full=False)  # the owner's 2 are taken
    records.free_slot(2, 9, "e", None)  # an attempt that did not end leaves the last time as it was
    records.free_slot(1, 9, "c", None)
    assert records.take_slot(1, 9, "g", 1, 2, 30) is None
    assert records.take_slot(1, 9, "h", 1, 2, 30) == Busy(endpoint_full=True, last_attempt_s=0.023)
