"""The delivery lines (``notifier.order``) on a Redis Cluster: every script's keys in one slot, the wake keys a
leaving delivery names inside its script too (``tests/notifier/test_order_lines.py`` has the same on one Redis)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis

from core.redis_schema import RedisKeys
from core.settings import Settings
from notifier.order import DeliveryOrder
from tests.notifier import test_order_lines as lines


@pytest.mark.parametrize("check", [
    lines.test_a_later_notification_waits_for_the_earlier_one_and_is_woken_when_it_leaves,
    lines.test_a_grouped_notification_waits_for_every_one_of_its_keys,
    lines.test_what_follows_a_dead_letter_goes_and_the_dead_letter_replayed_after_it_is_superseded,
])
def test_the_lines_keep_their_rules_on_a_cluster(cluster_settings: Settings, cluster_client: redis.Redis,
                                                 check: Callable[[DeliveryOrder], None]) -> None:
    check(DeliveryOrder(cluster_client, RedisKeys(cluster_settings), cluster_settings))


def test_the_dispatcher_numbers_on_a_cluster(cluster_settings: Settings) -> None:
    lines.test_the_dispatcher_numbers_each_keys_notified_transitions_and_keeps_the_number(cluster_settings)
