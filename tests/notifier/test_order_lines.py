"""The delivery lines of ``notifier.order`` and the sequences the dispatcher gives, against a real Redis.

The worker's use of them is checked end to end in ``test_order.py``; here each rule of a line on its own.
"""

from __future__ import annotations

import json
import time

import pytest
import redis

from core.redis_schema import RedisKeys
from core.settings import Settings
from notifier.dispatcher import Dispatcher
from notifier.notification import Notification, make_notification
from notifier.order import DeliveryOrder, Turn, lost_after_s
from notifier.outbox import silent_after_s
from subscriptions.policy import AlertPolicy

SUBSCRIPTION = {"id": 7, "name": "s", "condition": "c"}
ENDPOINT = 3


def _notification(alert_id: str, state: str, **sequences: int) -> Notification:
    """A notification of subscription 7 with one alert per key, numbered as given."""
    alerts = [{"alert_id": f"{alert_id}-{key}", "key": key, "state": state, "value": 1.0, "window_start": 0,
               "window_end": 0, "evaluated_at": 0, "sequence": sequence} for key, sequence in sequences.items()]
    return make_notification(SUBSCRIPTION, alerts, alert_id)


def _task(notification: Notification) -> str:
    return json.dumps({"notification": notification.to_json(), "endpoint_id": ENDPOINT, "kwargs": {}})


@pytest.fixture
def order(settings: Settings, redis_client: redis.Redis) -> DeliveryOrder:
    return DeliveryOrder(redis_client, RedisKeys(settings), settings)


def test_a_later_notification_waits_for_the_earlier_one_and_is_woken_when_it_leaves(order: DeliveryOrder) -> None:
    firing, resolved = _notification("f", "firing", AAPL=1), _notification("r", "resolved", AAPL=2)
    order.join(firing, [ENDPOINT])
    order.join(resolved, [ENDPOINT])
    waiting = order.turn(resolved, ENDPOINT, _task(resolved), woken=0)
    assert waiting.wait_s is not None and waiting.wait_s > 0
    assert order.turn(firing, ENDPOINT, _task(firing), woken=0).wait_s is None  # its turn
    assert order.turn(resolved, ENDPOINT, _task(resolved), woken=0).wait_s is not None  # until it has left
    [waiter] = order.leave(firing, ENDPOINT)
    assert json.loads(waiter.task)["notification"]["notification_id"] == "r" and waiter.woken == 1
    assert order.turn(resolved, ENDPOINT, _task(resolved), woken=0) == Turn()  # not woken yet: its copy goes on
    order.woken(firing, ENDPOINT, [waiter])  # its new copy published
    assert order.turn(resolved, ENDPOINT, _task(resolved), woken=0).stale  # the copy it was woken from
    assert order.turn(resolved, ENDPOINT, _task(resolved), woken=1) == Turn()  # go
    assert order.leave(resolved, ENDPOINT) == []  # nothing waits behind it


def test_a_notification_behind_another_in_several_lines_is_woken_once(order: DeliveryOrder) -> None:
    first, second = _notification("f", "firing", AAPL=1, MSFT=1), _notification("r", "resolved", AAPL=2, MSFT=2)
    order.join(first, [ENDPOINT])
    order.join(second, [ENDPOINT])
    assert order.turn(second, ENDPOINT, _task(second), 0).wait_s is not None
    assert order.turn(first, ENDPOINT, _task(first), 0) == Turn()
    assert [w.member for w in order.leave(first, ENDPOINT)] == ["r"]


def test_each_endpoint_has_its_own_line(order: DeliveryOrder) -> None:
    firing, resolved = _notification("f", "firing", AAPL=1), _notification("r", "resolved", AAPL=2)
    order.join(firing, [ENDPOINT, 4])
    order.join(resolved, [ENDPOINT, 4])
    assert order.turn(firing, ENDPOINT, _task(firing), 0).wait_s is None
    order.leave(firing, ENDPOINT)
    assert order.turn(resolved, ENDPOINT, _task(resolved), 0).wait_s is None
    assert order.turn(resolved, 4, _task(resolved), 0).wait_s is not None  # its firing is not delivered there yet


def test_a_grouped_notification_waits_for_every_one_of_its_keys(order: DeliveryOrder) -> None:
    aapl, msft = _notification("a", "firing", AAPL=1), _notification("m", "firing", MSFT=1)
    both = _notification("b", "resolved", AAPL=2, MSFT=2)
    for notification in (aapl, msft, both):
        order.join(notification, [ENDPOINT])
    for notification in (aapl, msft):
        assert order.turn(notification, ENDPOINT, _task(notification), 0).wait_s is None  # different keys: at once
    assert order.turn(both, ENDPOINT, _task(both), 0).wait_s is not None
    waiters = order.leave(aapl, ENDPOINT)
    assert [w.woken for w in waiters] == [1]
    order.woken(aapl, ENDPOINT, waiters)
    assert order.turn(both, ENDPOINT, _task(both), 1).wait_s is not None  # MSFT's firing is still ahead
    waiters = order.leave(msft, ENDPOINT)
    assert [w.woken for w in waiters] == [2]
    order.woken(msft, ENDPOINT, waiters)
    assert order.turn(both, ENDPOINT, _task(both), 0).stale
    assert order.turn(both, ENDPOINT, _task(both), 2).wait_s is None


def test_joining_again_after_a_restart_changes_nothing(order: DeliveryOrder) -> None:
    """A restarted dispatcher re-handles a transition: same notification, same sequence, joined again."""
    firing, resolved = _notification("f", "firing", AAPL=1), _notification("r", "resolved", AAPL=2)
    order.join(firing, [ENDPOINT])
    assert order.turn(firing, ENDPOINT, _task(firing), 0).wait_s is None
    order.leave(firing, ENDPOINT)  # delivered
    order.join(firing, [ENDPOINT])  # re-handled after it was delivered: not back in its line
    order.join(resolved, [ENDPOINT])
    order.join(resolved, [ENDPOINT])
    assert order.turn(resolved, ENDPOINT, _task(resolved), 0).wait_s is None


def test_what_follows_a_dead_letter_goes_and_the_dead_letter_replayed_after_it_is_superseded(
        order: DeliveryOrder) -> None:
    firing, resolved = _notification("f", "firing", AAPL=1), _notification("r", "resolved", AAPL=2)
    order.join(firing, [ENDPOINT])
    order.join(resolved, [ENDPOINT])
    assert order.turn(firing, ENDPOINT, _task(firing), 0).wait_s is None
    assert order.leave(firing, ENDPOINT) == []  # dead-lettered
    replayed_early = order.turn(firing, ENDPOINT, _task(firing), 0)  # replayed before the resolve went: in line
    assert replayed_early == Turn()  # go
    assert order.turn(resolved, ENDPOINT, _task(resolved), 0).wait_s is not None  # behind the replay
    [waiter] = order.leave(firing, ENDPOINT)  # dead again
    assert order.turn(resolved, ENDPOINT, _task(resolved), waiter.woken) == Turn()
    order.leave(resolved, ENDPOINT)
    assert order.turn(firing, ENDPOINT, _task(firing), 0).superseded_by == 2  # never after its resolve


def test_a_head_never_seen_again_is_let_go_past_once_a_waiter_saw_it_overdue_that_long(
        settings: Settings, redis_client: redis.Redis) -> None:
    settings = settings.model_copy(update={"delivery_max_retries": 0, "delivery_backoff_base_s": 0.01,
                                           "delivery_visibility_margin_s": 1.0, "webhook_total_timeout_s": 0.1,
                                           "smtp_timeout_s": 0.1, "pagerduty_attempt_timeout_s": 0.1,
                                           "dispatcher_claim_interval_s": 0.1})
    order = DeliveryOrder(redis_client, RedisKeys(settings), settings)
    lost_s = lost_after_s(settings)
    # The outbox sends a silent head again (a dispatcher's round after its silence) before a waiter lets it go.
    assert lost_s > silent_after_s(settings) + settings.dispatcher_claim_interval_s
    lost, resolved = _notification("f", "firing", AAPL=1), _notification("r", "resolved", AAPL=2)
    order.join(lost, [ENDPOINT])  # its task never comes (a broker that lost it, and its note in the outbox too)
    order.join(resolved, [ENDPOINT])
    time.sleep(1)
    assert order.turn(resolved, ENDPOINT, _task(resolved), 0).wait_s is not None  # overdue: noted, from now
    time.sleep(lost_s - 0.5)
    assert order.turn(resolved, ENDPOINT, _task(resolved), 0).wait_s is not None  # not yet that long
    time.sleep(1)
    turn = order.turn(resolved, ENDPOINT, _task(resolved), 0)
    assert turn.wait_s is None and turn.lost == ("f",)
    assert order.turn(lost, ENDPOINT, _task(lost), 0).superseded_by == 2  # were it to come back


def test_a_head_that_announced_its_next_run_is_not_taken_for_lost(settings: Settings,
                                                                    redis_client: redis.Redis) -> None:
    settings = settings.model_copy(update={"delivery_max_retries": 0, "delivery_backoff_base_s": 0.01,
                                           "delivery_visibility_margin_s": 1.0})
    order = DeliveryOrder(redis_client, RedisKeys(settings), settings)
    firing, resolved = _notification("f", "firing", AAPL=1), _notification("r", "resolved", AAPL=2)
    order.join(firing, [ENDPOINT])
    order.join(resolved, [ENDPOINT])
    assert order.turn(firing, ENDPOINT, _task(firing), 0).wait_s is None
    order.expect(firing, ENDPOINT, 4.0)  # a retry in 4 s
    assert order.turn(resolved, ENDPOINT, _task(resolved), 0).wait_s == 0.5  # half the visibility timeout at most
    time.sleep(3)  # longer than the stall that takes a head for lost, but the head's run is still ahead
    turn = order.turn(resolved, ENDPOINT, _task(resolved), 0)
    assert turn.wait_s is not None and turn.lost == ()


def test_the_dispatcher_numbers_each_keys_notified_transitions_and_keeps_the_number(settings: Settings) -> None:
    dispatcher = Dispatcher(settings)  # its decisions, key states and sequences in real Redis
    policy = AlertPolicy(cooldown_s=3600)
    fired = [{"alert_id": "f1", "key": "AAPL", "state": "firing"}, {"alert_id": "f2", "key": "MSFT", "state": "firing"}]
    dispatcher.decide(7, policy, fired)
    assert [a["sequence"] for a in fired] == [1, 1]  # per key
    resolved = {"alert_id": "r1", "key": "AAPL", "state": "resolved"}
    dispatcher.decide(7, policy, [resolved])
    again = {"alert_id": "f3", "key": "AAPL", "state": "firing"}  # within the cool-down: not notified
    dispatcher.decide(7, policy, [again])
    assert resolved["sequence"] == 2 and "sequence" not in again
    reread = {"alert_id": "r1", "key": "AAPL", "state": "resolved"}  # read anew after a restart
    dispatcher.decide(7, policy, [reread])
    assert reread["sequence"] == 2
    last = {"alert_id": "r2", "key": "MSFT", "state": "resolved"}
    dispatcher.decide(7, policy, [last])
    assert last["sequence"] == 2
