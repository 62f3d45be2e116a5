"""What a subscriber receives: one notification carrying one or more alerts of one subscription.

The id of a notification is derived from its alerts, so the same alerts always
make the same notification: receivers de-duplicate on it (``Idempotency-Key``,
``Message-ID``) and the worker marks it delivered per endpoint.

:class:`Notification` is the contract between whoever enqueues a delivery (the
dispatcher, the test-alert button, the watchdog) and the delivery task: its
:meth:`~Notification.to_json` object is what Celery carries, what a webhook
receives and what a dead letter keeps; the task reads it back with
:meth:`~Notification.from_json`, which names what is wrong with anything else.
Fields it does not declare (a newer producer's, a benchmark's timestamp) and
fields a producer left out travel through as they came: receivers get exactly
what was enqueued.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from subscriptions.templating import state_label

ALERT_FIELDS = ("alert_id", "key", "state", "value", "window_start", "window_end", "evaluated_at")


class MalformedNotificationError(ValueError):
    """Not a notification; the message says why, in the words of the dead letter it becomes."""


class AlertLine(BaseModel):
    """One alert of a notification, as the transition stream reported it."""

    model_config = ConfigDict(frozen=True, strict=True, extra="allow")

    alert_id: str
    key: str
    state: str | None = None
    # The evaluator's number, passed through as given: a value a channel cannot format fails that attempt
    # (recorded, retried, dead-lettered), it does not make the whole notification malformed.
    value: JsonValue = None
    # The alert id of the firing that opened this key's episode (``notifier.policy.KeyState``): a firing's
    # own id, and what its resolution carries. Only on the dispatcher's notifications; absent elsewhere
    # (test alerts, the watchdog), where the alert id names the episode.
    episode_id: str | None = None
    # "crossing" for a crossing (a one-off event, ``CROSSES ABOVE x``: nothing resolves it); absent for the edges
    # of a state (firing/resolved), so their alerts read as before crossings existed.
    kind: str | None = None
    # The alert's place among its (subscription, key)'s notifications, growing by one for each notified
    # transition or reminder of the key (``notifier.order``): each endpoint gets them in this order, and a
    # receiver can order on it too. Only on the dispatcher's notifications, like ``episode_id``.
    sequence: int | None = None
    # True on a resolution sent although nothing recorded that its firing was notified: the key's policy state was
    # lost (a Redis node that came back empty) and a firing left open for ever is worse than a resolve not needed
    # (``notifier.policy``). Its ``episode_id`` is unknown then. Absent otherwise.
    state_unknown: bool | None = None
    window_start: int | float | None = None
    window_end: int | float | None = None
    evaluated_at: int | float | None = None


class Notification(BaseModel):
    """The notification a delivery task delivers: typed, immutable, the same JSON both ways."""

    model_config = ConfigDict(frozen=True, strict=True, extra="allow")

    notification_id: str = Field(min_length=1)
    subscription_id: int | None  # None: not a subscription's (test alerts, the watchdog)
    subscription_name: str
    condition: str
    state: str
    reminder: bool = False
    evaluated_at: int | float | None
    created_at: int | float
    alerts: tuple[AlertLine, ...] = Field(min_length=1, strict=False)  # a JSON list, not strictly a tuple
    # Set on some notifications only, and only then present in their JSON:
    test: bool = False  # the "send test alert" button's: travels in the tests lane
    operator: bool = False  # the watchdog's, to operators
    watchdog: dict[str, Any] | None = None  # the watchdog's incident: rule, since, detail
    stale: dict[str, Any] | None = None  # a stale-stream notice's: stream, since, detail (:func:`stale_notice`)

    def to_json(self) -> dict[str, Any]:
        """The JSON object (a dict of JSON values) Celery carries and receivers get: the fields that were given."""
        return self.model_dump(mode="json", exclude_unset=True)

    @classmethod
    def from_json(cls, data: object) -> Notification:
        """The notification in ``data``, or :class:`MalformedNotificationError` saying what is wrong."""
        if not isinstance(data, dict):
            raise MalformedNotificationError(f"notification is {type(data).__name__}, not an object")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise MalformedNotificationError(_reason(exc)) from None

    @property
    def keys(self) -> list[str]:
        return [alert.key for alert in self.alerts]

    def summary(self) -> str:
        return summary(self.to_json())


# The reasons the delivery task gave before this contract existed; they name dead letters, so they stay.
_REASONS = {"notification_id": "notification has no notification_id",
            "subscription_id": "notification has no valid subscription_id",
            "state": "notification has no state", "alerts": "notification has no alerts with keys"}


def _reason(error: ValidationError) -> str:
    first = error.errors()[0]
    field = str(first["loc"][0]) if first["loc"] else ""
    if field in _REASONS:
        return _REASONS[field]
    where = ".".join(str(part) for part in first["loc"])
    return f"notification field {where}: {first['msg']}"[:500]


def notification_id(alert_ids: Iterable[str], reminder_at: float | None = None) -> str:
    material = "|".join(sorted(alert_ids))
    if reminder_at is not None:  # a reminder repeats alerts already sent: it is a new notification
        material += f"|reminder@{reminder_at:.3f}"
    return hashlib.sha256(material.encode()).hexdigest()[:32]


def make_notification(subscription: dict, alerts: list[dict], notification: str, reminder: bool = False,
                      **marks: Any) -> Notification:
    """The notification of ``alerts`` (same subscription and state) of ``subscription`` (id, name, condition)."""
    ordered = sorted(alerts, key=lambda a: a["key"])
    return Notification(
        notification_id=notification,
        subscription_id=subscription["id"],
        subscription_name=subscription["name"],
        condition=subscription["condition"],
        state=ordered[0]["state"],
        reminder=reminder,
        evaluated_at=max(a["evaluated_at"] for a in ordered),
        created_at=time.time(),
        alerts=tuple(AlertLine.model_validate({f: a.get(f) for f in ALERT_FIELDS}
                                              | ({"episode_id": a["episode_id"]} if a.get("episode_id") else {})
                                              | ({"kind": a["kind"]} if a.get("kind", "state") != "state" else {})
                                              | ({"sequence": a["sequence"]} if a.get("sequence") is not None else {})
                                              | ({"state_unknown": True} if a.get("state_unknown") else {}))
                     for a in ordered),
        **marks,
    )


def build_notification(subscription: dict, alerts: list[dict], notification: str, reminder: bool = False) -> dict:
    """:func:`make_notification` as its JSON object (for callers that store or compare payloads)."""
    return make_notification(subscription, alerts, notification, reminder).to_json()


def test_notification(endpoint_id: int, now_ms: int) -> Notification:
    """A made-up firing alert for the "send test alert" button: a fresh id each time, marked ``test``."""
    alert_id = f"test-{uuid.uuid4().hex}"
    alert = {"alert_id": alert_id, "key": "TEST", "state": "firing", "value": 0.0,
             "window_start": now_ms - 60_000, "window_end": now_ms, "evaluated_at": now_ms}
    info = {"id": None, "name": f"Test alert for endpoint #{endpoint_id}", "condition": "test"}
    return make_notification(info, [alert], notification_id([alert_id]), test=True)


STALE, STALE_RESOLVED = "stale", "stale_resolved"


def stale_notice(subscription: dict, stream: str, state: str, since: float, detail: str, now: float) -> Notification:
    """A subscription's notice that its stream's evaluation went ``stale`` (or, ``stale_resolved``, is fresh again).

    Not an alert: no key of the subscription changed state, so it has no ``sequence`` and no place in the
    alerts' delivery lines (a notice must not wait behind a stuck alert, nor supersede one). Its one line's key
    is the stream; the end carries the start's alert id as its ``episode_id`` (PagerDuty resolves that incident).
    Its id derives from the subscription, stream, start and state: one notice per endpoint, however often queued.
    """
    since_ms, now_ms = int(since * 1000), int(now * 1000)
    opened = f"stale:{subscription['id']}:{stream}:{since_ms}"
    alert: dict[str, Any] = {"alert_id": opened if state == STALE else f"{opened}:resolved", "key": stream,
                             "state": state, "value": None, "window_start": since_ms, "window_end": now_ms,
                             "evaluated_at": now_ms}
    if state != STALE:
        alert["episode_id"] = opened
    marks = {"stream": stream, "since": since, "detail": detail, **({"resolved_at": now} if state != STALE else {})}
    return make_notification(subscription, [alert], notification_id([alert["alert_id"]]), stale=marks)


def summary(notification: dict) -> str:
    """One line for subjects and logs: ``FIRING: name (AAPL, MSFT +3)``."""
    keys = [a["key"] for a in notification["alerts"]]
    shown = ", ".join(keys[:3]) + (f" +{len(keys) - 3}" if len(keys) > 3 else "")
    return f"{state_label(notification)}: {notification['subscription_name']} ({shown})"
