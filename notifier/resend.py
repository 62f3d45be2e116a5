"""Sends again the queued deliveries that went silent (``notifier.outbox``); the dispatcher runs it every
``dispatcher_claim_interval_s``."""

from __future__ import annotations

from dataclasses import dataclass

import redis
import structlog
from celery import Celery
from prometheus_client import Counter, Gauge

from core.redis_client import broker_client
from core.redis_schema import celery_queue_keys
from core.settings import Settings
from notifier.app import lane_of
from notifier.deliveries import DeliveryRecords, publish
from notifier.notification import MalformedNotificationError, Notification
from notifier.order import DeliveryOrder
from notifier.outbox import Outbox, Silent, noted_ms_of

log = structlog.get_logger(__name__)

RESENT = Counter("tocsin_delivery_resent_total",
                 "Queued deliveries sent again after showing no sign of life (a message the broker lost)")
PENDING = Gauge("tocsin_deliveries_pending", "Deliveries queued and not ended yet (the outbox's notes)")


@dataclass(frozen=True)
class QueueHead:
    """What a lane's queue says about the deliveries that went silent: whether it holds messages, and when the oldest
    one's delivery was noted (``None``: not said). The Redis transport's queues are first in, first out, so a
    delivery noted before the oldest message still queued was taken off the queue, or never reached it."""

    empty: bool
    oldest_noted_ms: int | None

    @classmethod
    def read(cls, broker: redis.Redis, settings: Settings, lane: str) -> QueueHead:
        oldest = broker.lindex(celery_queue_keys(settings, lane)[0], -1)  # pushed on the left, taken from the right
        return cls(oldest is None, None if oldest is None else noted_ms_of(oldest))

    def may_hold(self, delivery: Silent, silent_after_s: float) -> bool:
        """Whether ``delivery``'s last message may still wait in this queue: it was last noted no later than a
        silence before the due time it had (a put back moves that later still)."""
        if self.empty:
            return False
        if self.oldest_noted_ms is None:
            return True  # the oldest message does not say (a task queued un-noted): the queue may hold anything
        return delivery.due_ms - round(silent_after_s * 1000) >= self.oldest_noted_ms


def resend_silent(settings: Settings, celery: Celery, outbox: Outbox, records: DeliveryRecords,
                  order: DeliveryOrder) -> int:
    """Publish again each delivery past due that did not end, is not sending and cannot still be queued; returns how
    many were sent."""
    silent = outbox.due()
    if not silent:
        return 0
    heads: dict[str, QueueHead] = {}  # per lane, read once a round
    broker: redis.Redis = broker_client(settings)
    sent = 0
    for delivery in silent:
        nid, endpoint_id, task = delivery.notification_id, delivery.endpoint_id, delivery.task
        if records.finished(nid, endpoint_id):
            outbox.forget(nid, endpoint_id)  # ended: nothing to wait for (its final mark forgot it, unless torn)
            continue
        if task is None:  # its note lost its task (a torn write): nothing to send it with; said, not silent
            outbox.forget(nid, endpoint_id)
            log.error("delivery_silent_without_task", notification=nid, endpoint_id=endpoint_id)
            continue
        if records.sending(nid, endpoint_id):
            continue  # a copy is sending right now: alive (due again later)
        payload = task["notification"]
        lane = lane_of(payload)
        if lane not in heads:
            heads[lane] = QueueHead.read(broker, settings, lane)
        if heads[lane].may_hold(delivery, outbox.silent_after_s):
            continue  # it may be waiting in the queue behind older messages: looked at again a silence later
        # In lines, the copy carries its lines' current wake-up count: not taken for a stale copy (notifier.order).
        try:
            woken = order.woken_count(Notification.from_json(payload), endpoint_id)
        except MalformedNotificationError:  # no lines: the worker dead-letters it, with its reason
            woken = 0
        publish(celery, payload, endpoint_id, {**task["kwargs"], "woken": woken}, delivery.taken_ms)
        RESENT.inc()
        log.warning("delivery_resent", notification=nid, endpoint_id=endpoint_id, silent_s=outbox.silent_after_s)
        sent += 1
    return sent
