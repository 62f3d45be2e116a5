"""PagerDuty Events API v2: one event per alert, trigger on firing and resolve on resolution, same ``dedup_key``.

Each alert of a notification becomes one event, because PagerDuty keeps one
incident per ``dedup_key`` and Tocsin's unit of "something is wrong" is a
(subscription, key) episode: a grouped notification of five keys opens five
incidents, and the resolution of each key closes its own. The ``dedup_key`` is
the alert id of the firing that opened the episode (``episode_id``, tracked by
the dispatcher in ``notifier.policy.KeyState``), so the resolve, whose own alert
id differs, closes the same incident; a reminder re-triggers it (PagerDuty
de-duplicates it into the open incident).

The routing key is the endpoint's secret (required, stored sealed by the vault,
never shown again, never logged); the target is the Events API URL,
``https://events.pagerduty.com/v2/enqueue`` unless a proxy or a test receiver is
allowed (``TOCSIN_WEBHOOK_ALLOW_HOSTS``). PagerDuty answers 202; 429 and 5xx are
retried (the whole attempt: events already accepted are de-duplicated), 400 is final.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any, ClassVar

from core.settings import Settings
from notifier.attempt import Attempt
from notifier.channels import EndpointView, register
from notifier.channels.webhook import WebhookLimits, check_url, json_body, post_json
from notifier.notification import STALE_RESOLVED, Notification
from notifier.rendering import message, noted
from subscriptions.channel_kinds import EndpointKind
from subscriptions.templating import number

EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"
SUMMARY_LIMIT = 1024  # PagerDuty's limit of payload.summary
SEVERITIES = ("critical", "error", "warning", "info")
RESOLVING = ("resolved", STALE_RESOLVED)  # an alert's end, and a stale stream's (``notification.stale_notice``)


def default_summary(values: dict[str, Any]) -> str:
    alert = values["alert"]
    return f"{values['subscription']['name']}: {alert['key']} = {number(alert['value'])} ({values['subscription']['condition']})"


def _timestamp(ms: Any) -> str:
    at = ms / 1000 if isinstance(ms, int | float) and not isinstance(ms, bool) else time.time()
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds")


def pagerduty_events(notification: dict[str, Any], routing_key: str, template: str | None,
                     settings: Settings) -> tuple[list[dict[str, Any]], str | None]:
    """The events of ``notification``, one per alert, and the template's failure if it failed on any."""
    events: list[dict[str, Any]] = []
    failures: list[str] = []
    # One render per alert: a template that is slow (each render is bounded, not free) is dropped for the
    # default once the renders of this notification have taken the time of one HTTP attempt.
    rendering_until = time.monotonic() + settings.webhook_total_timeout_s
    for alert in notification["alerts"]:
        dedup_key = alert.get("episode_id") or alert["alert_id"]
        if alert.get("state") in RESOLVING:
            events.append({"routing_key": routing_key, "event_action": "resolve", "dedup_key": dedup_key})
            continue
        if template is not None and time.monotonic() > rendering_until:
            failures.append("message template too slow for the number of alerts; the default summary was sent")
            template = None
        summary = message({**notification, "alerts": [alert]}, template, settings, "text", default_summary,
                          SUMMARY_LIMIT)
        if summary.error:
            failures.append(summary.error)
            template = None  # it failed once: the rest get the default, not the same failure again
        events.append({
            "routing_key": routing_key,
            "event_action": "trigger",
            "dedup_key": dedup_key,
            "client": "Tocsin",
            "payload": {
                "summary": summary.text,
                "source": str(alert["key"]),
                "severity": settings.pagerduty_severity,
                "timestamp": _timestamp(alert.get("evaluated_at")),
                "group": str(notification["subscription_name"])[:255],
                "class": "test" if notification.get("test") else "tocsin-alert",
                "custom_details": {
                    "subscription_id": notification.get("subscription_id"),
                    "subscription": notification["subscription_name"],
                    "condition": notification["condition"],
                    "key": alert["key"], "value": alert.get("value"),
                    "window_start": alert.get("window_start"), "window_end": alert.get("window_end"),
                    "reminder": bool(notification.get("reminder")),
                    "notification_id": notification["notification_id"],
                    "sequence": alert.get("sequence"),
                },
            },
        })
    return events, failures[0] if failures else None


class PagerDutyChannel:
    """Events API v2: trigger and resolve incidents keyed by the alert's episode."""

    kind: ClassVar[EndpointKind] = EndpointKind(
        name="pagerduty", label="PagerDuty", check_target=check_url, has_secret=True, position=50,
        placeholder=EVENTS_URL, secret_required=True, secret_label="routing key",
        help=f"The Events API v2 URL ({EVENTS_URL}) and, as the secret, the integration's routing key. Each alert "
             "triggers an incident keyed by its episode; its resolution resolves the same incident.",
        template_use="each event's summary (plain text, at most 1024 characters)", template_escape="text",
    )

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.limits = WebhookLimits.from_settings(settings)

    @classmethod
    def payload_preview(cls, notification: dict[str, Any], template: str | None, settings: Settings) -> dict:
        """What the receiver gets for ``notification`` (the endpoints page's preview)."""
        return pagerduty_events(notification, "<routing key>", template, settings)[0][0]

    @classmethod
    def longest_attempt_s(cls, settings: Settings) -> float:
        return settings.pagerduty_attempt_timeout_s + settings.webhook_total_timeout_s  # the last event may start late

    def send(self, notification: Notification, endpoint: EndpointView) -> Attempt:
        started = time.perf_counter()
        if not endpoint.secret:
            return Attempt(False, False, 0.0, error="no routing key: recreate the endpoint with one")
        events, failure = pagerduty_events(notification.to_json(), endpoint.secret, endpoint.template, self.settings)
        attempt = Attempt(True, False, 0.0)
        for number_sent, event in enumerate(events):
            if time.perf_counter() - started > self.settings.pagerduty_attempt_timeout_s:
                return noted(Attempt(False, True, (time.perf_counter() - started) * 1000, attempt.status_code,
                                     f"{number_sent} of {len(events)} events sent within "
                                     f"{self.settings.pagerduty_attempt_timeout_s:g} s; all are sent again"), failure)
            attempt = post_json(endpoint.target, json_body(event), {"User-Agent": "Tocsin/1"}, self.limits)
            if not attempt.ok:
                where = f"event {number_sent + 1} of {len(events)} ({event['event_action']}): "
                return noted(Attempt(False, attempt.retryable, (time.perf_counter() - started) * 1000,
                                     attempt.status_code, where + (attempt.error or ""), attempt.retry_after_s), failure)
        return noted(Attempt(True, False, (time.perf_counter() - started) * 1000, attempt.status_code), failure)


register(PagerDutyChannel)
