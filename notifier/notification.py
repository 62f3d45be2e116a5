"""What a subscriber receives: one notification carrying one or more alerts of one subscription.

The id of a notification is derived from its alerts, so the same alerts always
make the same notification: receivers de-duplicate on it (``Idempotency-Key``,
``Message-ID``) and the worker marks it delivered per endpoint.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Iterable

ALERT_FIELDS = ("alert_id", "key", "state", "value", "window_start", "window_end", "evaluated_at")


def notification_id(alert_ids: Iterable[str], reminder_at: float | None = None) -> str:
    material = "|".join(sorted(alert_ids))
    if reminder_at is not None:  # a reminder repeats alerts already sent: it is a new notification
        material += f"|reminder@{reminder_at:.3f}"
    return hashlib.sha256(material.encode()).hexdigest()[:32]


def build_notification(
    subscription: dict,
    alerts: list[dict],
    notification: str,
    reminder: bool = False,
) -> dict:
    """The payload for ``alerts`` (same subscription and state) of ``subscription`` (id, name, condition)."""
    ordered = sorted(alerts, key=lambda a: a["key"])
    return {
        "notification_id": notification,
        "subscription_id": subscription["id"],
        "subscription_name": subscription["name"],
        "condition": subscription["condition"],
        "state": ordered[0]["state"],
        "reminder": reminder,
        "evaluated_at": max(a["evaluated_at"] for a in ordered),
        "created_at": time.time(),
        "alerts": [{f: a.get(f) for f in ALERT_FIELDS} for a in ordered],
    }


def test_notification(endpoint_id: int, now_ms: int) -> dict:
    """A made-up firing alert for the "send test alert" button: a fresh id each time, marked ``test``."""
    alert = {"alert_id": f"test-{uuid.uuid4().hex}", "key": "TEST", "state": "firing", "value": 0.0,
             "window_start": now_ms - 60_000, "window_end": now_ms, "evaluated_at": now_ms}
    info = {"id": None, "name": f"Test alert for endpoint #{endpoint_id}", "condition": "test"}
    return {**build_notification(info, [alert], notification_id([alert["alert_id"]])), "test": True}


def summary(notification: dict) -> str:
    """One line for subjects and logs: ``FIRING: name (AAPL, MSFT +3)``."""
    keys = [a["key"] for a in notification["alerts"]]
    shown = ", ".join(keys[:3]) + (f" +{len(keys) - 3}" if len(keys) > 3 else "")
    label = "STILL FIRING" if notification["reminder"] else notification["state"].upper()
    return f"{label}: {notification['subscription_name']} ({shown})"
