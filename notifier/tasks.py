"""Delivery tasks: one webhook POST per (alert, endpoint), retried with backoff, recorded always.

Tasks are acknowledged late and may be redelivered (worker crash, dispatcher
replay), so a delivery is marked done per ``alert id + endpoint`` and a marked
delivery is never sent again.
"""

from __future__ import annotations

import json
import random
import time
from functools import lru_cache

import redis
import structlog
from celery import Task
from prometheus_client import Counter, Histogram

from infra.redis_schema import RedisKeys
from infra.settings import get_settings
from notifier.app import app
from notifier.webhook import DestinationRefused, check_destination, post_webhook
from subscriptions.db import session_scope
from subscriptions.models import Endpoint

log = structlog.get_logger(__name__)

ATTEMPTS = Counter("tocsin_delivery_attempts_total", "Delivery attempts", ["kind", "outcome"])
LATENCY = Histogram("tocsin_delivery_latency_seconds", "Latency of delivery attempts", ["kind"])

ATTEMPT_LOG_LENGTH = 1_000
DELIVERED_MARK_TTL_S = 30 * 24 * 3600


@lru_cache(maxsize=4)
def _redis(url: str) -> redis.Redis:
    """One client (and connection pool) per worker process, not one per task."""
    return redis.Redis.from_url(url)


def backoff_s(retries: int, base_s: float, cap_s: float) -> float:
    """Exponential backoff with full jitter: uniform in [0, min(cap, base * 2^retries)]."""
    return random.uniform(0, min(cap_s, base_s * 2**retries))


def record_attempt(client: redis.Redis, keys: RedisKeys, subscription_id: int, entry: dict) -> None:
    log_key = keys.delivery_log(subscription_id)
    pipe = client.pipeline()
    pipe.lpush(log_key, json.dumps(entry, separators=(",", ":")))
    pipe.ltrim(log_key, 0, ATTEMPT_LOG_LENGTH - 1)
    pipe.hincrby(keys.delivery_stats, entry["outcome"], 1)
    pipe.execute()


@app.task(bind=True, name="tocsin.deliver_webhook", acks_late=True, max_retries=None)
def deliver_webhook(self: Task, alert: dict, endpoint_id: int) -> str:
    settings = get_settings()
    keys = RedisKeys(settings)
    client = _redis(settings.redis_url)
    mark = keys.delivered(alert["alert_id"], endpoint_id)
    if client.exists(mark):
        return "duplicate"
    with session_scope(settings.database_url) as session:
        endpoint = session.get(Endpoint, endpoint_id)
        url, secret = (endpoint.target, endpoint.secret) if endpoint else (None, None)
    entry = {
        "alert_id": alert["alert_id"],
        "endpoint_id": endpoint_id,
        "key": alert["key"],
        "state": alert["state"],
        "attempt": self.request.retries + 1,
        "at": time.time(),
    }
    if url is None:
        record_attempt(client, keys, alert["subscription_id"], {**entry, "outcome": "dead", "error": "endpoint deleted"})
        return "endpoint deleted"
    try:
        check_destination(url, settings.webhook_allow_hosts)
    except DestinationRefused as exc:
        record_attempt(client, keys, alert["subscription_id"], {**entry, "outcome": "dead", "error": str(exc)})
        ATTEMPTS.labels("webhook", "refused").inc()
        return "refused"

    attempt = post_webhook(
        url,
        alert,
        secret,
        idempotency_key=f"{alert['alert_id']}:{endpoint_id}",
        connect_timeout_s=settings.webhook_connect_timeout_s,
        read_timeout_s=settings.webhook_read_timeout_s,
    )
    LATENCY.labels("webhook").observe(attempt.latency_ms / 1000)
    detail = {"status_code": attempt.status_code, "latency_ms": round(attempt.latency_ms, 1), "error": attempt.error}
    if attempt.ok:
        client.set(mark, "1", ex=DELIVERED_MARK_TTL_S)
        record_attempt(client, keys, alert["subscription_id"], {**entry, **detail, "outcome": "delivered"})
        ATTEMPTS.labels("webhook", "delivered").inc()
        return "delivered"
    exhausted = self.request.retries >= settings.webhook_max_retries
    if not attempt.retryable or exhausted:
        record_attempt(client, keys, alert["subscription_id"], {**entry, **detail, "outcome": "dead"})
        client.lpush(keys.dead_letters, json.dumps({"alert": alert, "endpoint_id": endpoint_id, **detail}))
        ATTEMPTS.labels("webhook", "dead").inc()
        log.warning("delivery_dead", alert_id=alert["alert_id"], endpoint_id=endpoint_id, **detail)
        return "dead"
    record_attempt(client, keys, alert["subscription_id"], {**entry, **detail, "outcome": "retry"})
    ATTEMPTS.labels("webhook", "retry").inc()
    delay = attempt.retry_after_s
    if delay is None:
        delay = backoff_s(self.request.retries, settings.webhook_backoff_base_s, settings.webhook_backoff_max_s)
    raise self.retry(countdown=delay)
