"""Sends again the queued deliveries that went silent (``notifier.outbox``); the dispatcher runs it every
``dispatcher_claim_interval_s``."""

from __future__ import annotations

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
from notifier.outbox import Outbox

log = structlog.get_logger(__name__)

RESENT = Counter("tocsin_delivery_resent_total",
                 "Queued deliveries sent again after showing no sign of life (a message the broker lost)")
PENDING = Gauge("tocsin_deliveries_pending", "Deliveries queued and not ended yet (the outbox's notes)")


def resend_silent(settings: Settings, celery: Celery, outbox: Outbox, records: DeliveryRecords,
                  order: DeliveryOrder) -> int:
    """Publish again each delivery past due that did not end, is not sending and cannot still be queued; returns how
    many were sent."""
    silent = outbox.due()
    if not silent:
        return 0
    queued: dict[str, int] = {}  # per lane, read once a round
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
        if lane not in queued:
            queued[lane] = int(broker.llen(celery_queue_keys(settings, lane)[0]))
        if queued[lane]:
            continue  # it may be waiting in the queue behind the others
        # In lines, the copy carries its lines' current wake-up count: not taken for a stale copy (notifier.order).
        try:
            woken = order.woken_count(Notification.from_json(payload), endpoint_id)
        except MalformedNotificationError:  # no lines: the worker dead-letters it, with its reason
            woken = 0
        publish(celery, payload, endpoint_id, {**task["kwargs"], "woken": woken})
        RESENT.inc()
        log.warning("delivery_resent", notification=nid, endpoint_id=endpoint_id, silent_s=outbox.silent_after_s)
        sent += 1
    return sent
