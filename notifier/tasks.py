"""The delivery task: one notification to one endpoint, retried with backoff, every attempt recorded.

Tasks are acknowledged late and may be redelivered (a worker killed mid-task, a
dispatcher re-handling what it had not acknowledged), so a delivery is marked
done per ``notification id + endpoint`` and a marked delivery is never sent
again. A delivery that exhausts its retries, or is refused for good, goes to the
dead-letter set, from which operators replay it.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from functools import lru_cache

import redis
import structlog
from celery import Task
from celery.signals import worker_ready
from prometheus_client import Counter, Histogram

from infra.metrics import serve_metrics
from infra.redis_schema import RedisKeys
from infra.settings import Settings, get_settings
from notifier.app import DELIVER_TASK, app
from notifier.attempt import Attempt
from notifier.deliveries import DeliveryRecords
from notifier.email import render, send_email
from notifier.webhook import DestinationRefused, check_destination, post_webhook
from subscriptions.db import session_scope
from subscriptions.models import Endpoint

log = structlog.get_logger(__name__)

ATTEMPTS = Counter("tocsin_delivery_attempts_total", "Delivery attempts", ["kind", "outcome"])
LATENCY = Histogram("tocsin_delivery_latency_seconds", "Latency of delivery attempts", ["kind"])


@worker_ready.connect
def _serve_metrics(**_: object) -> None:
    serve_metrics(get_settings().metrics_port_worker)


@lru_cache(maxsize=4)
def _redis(url: str) -> redis.Redis:
    """One client (and connection pool) per worker process, not one per task."""
    return redis.Redis.from_url(url, decode_responses=True)


def backoff_s(retries: int, base_s: float, cap_s: float) -> float:
    """Exponential backoff with full jitter: uniform in [0, min(cap, base * 2^retries)]."""
    return random.uniform(0, min(cap_s, base_s * 2**retries))


@dataclass(frozen=True)
class Target:
    kind: str
    target: str
    secret: str | None


_targets: dict[tuple[str, int], tuple[float, Target | None]] = {}


def endpoint_target(settings: Settings, endpoint_id: int) -> Target | None:
    """The endpoint's channel, address and secret, cached briefly: a lookup costs more than a local POST."""
    key = (settings.database_url, endpoint_id)
    cached = _targets.get(key)
    if cached and time.monotonic() - cached[0] < settings.delivery_endpoint_cache_s:
        return cached[1]
    with session_scope(settings.database_url) as session:
        endpoint = session.get(Endpoint, endpoint_id)
        target = Target(endpoint.kind, endpoint.target, endpoint.signing_secret(settings)) if endpoint else None
    _targets[key] = (time.monotonic(), target)
    return target


def send(endpoint: Target, notification: dict, endpoint_id: int, settings: Settings) -> Attempt:
    """One attempt over the endpoint's channel."""
    if endpoint.kind == "email":
        return send_email(render(notification, settings.smtp_from, endpoint.target, endpoint_id), settings)
    try:
        check_destination(endpoint.target, settings.webhook_allow_hosts)
    except DestinationRefused as exc:
        return Attempt(ok=False, retryable=False, latency_ms=0.0, error=str(exc))
    return post_webhook(
        endpoint.target,
        notification,
        endpoint.secret,
        idempotency_key=f"{notification['notification_id']}:{endpoint_id}",
        connect_timeout_s=settings.webhook_connect_timeout_s,
        read_timeout_s=settings.webhook_read_timeout_s,
    )


def claim_ttl_s(settings: Settings) -> float:
    """Longer than any one attempt can take, so a claim outlives the attempt that holds it."""
    return max(settings.webhook_connect_timeout_s + settings.webhook_read_timeout_s, 2 * settings.smtp_timeout_s) + 5


@app.task(bind=True, name=DELIVER_TASK, acks_late=True, max_retries=None)
def deliver(self: Task, notification: dict, endpoint_id: int) -> str:
    settings = get_settings()
    records = DeliveryRecords(_redis(settings.redis_url), RedisKeys(settings))
    nid = notification["notification_id"]
    claimed, delivered = records.claim(nid, endpoint_id, claim_ttl_s(settings))
    if delivered:
        return "duplicate"
    if not claimed:
        # Another copy is sending right now (or died doing so): look again once it must be done.
        raise self.retry(countdown=claim_ttl_s(settings))
    try:
        return _attempt(self, settings, records, notification, endpoint_id)
    finally:
        records.release(nid, endpoint_id)


def _attempt(task: Task, settings: Settings, records: DeliveryRecords, notification: dict, endpoint_id: int) -> str:
    endpoint = endpoint_target(settings, endpoint_id)
    attempt_no = task.request.retries + 1
    if endpoint is None:
        attempt = Attempt(ok=False, retryable=False, latency_ms=0.0, error="endpoint deleted")
        records.dead(notification, endpoint_id, None, attempt, attempt_no)
        return "dead"

    kind = endpoint.kind
    attempt = send(endpoint, notification, endpoint_id, settings)
    LATENCY.labels(kind).observe(attempt.latency_ms / 1000)
    if attempt.ok:
        records.delivered(notification, endpoint_id, kind, attempt, attempt_no)
        ATTEMPTS.labels(kind, "delivered").inc()
        return "delivered"
    if not attempt.retryable or task.request.retries >= settings.delivery_max_retries:
        records.dead(notification, endpoint_id, kind, attempt, attempt_no)
        ATTEMPTS.labels(kind, "dead").inc()
        log.warning("delivery_dead", notification=notification["notification_id"], endpoint_id=endpoint_id,
                    **attempt.detail())
        return "dead"
    records.attempt(notification, endpoint_id, kind, attempt, attempt_no, "retry")
    ATTEMPTS.labels(kind, "retry").inc()
    delay = attempt.retry_after_s
    if delay is None:
        delay = backoff_s(task.request.retries, settings.delivery_backoff_base_s, settings.delivery_backoff_max_s)
    raise task.retry(countdown=min(delay, settings.delivery_backoff_max_s))
