"""Local stand-ins for Slack, Teams and PagerDuty: real HTTP servers that check each payload's documented shape.

Each answers like the service it stands for: a payload of the wrong shape gets
400 (Slack: ``invalid_payload``; PagerDuty: ``Invalid event``), a good one 200
(Slack), 202 (Teams Workflows, PagerDuty). The checks follow the services' docs:

- Slack incoming webhooks: ``text`` (a non-empty string) and optional ``blocks``
  (at most 50; a ``section``'s mrkdwn text at most 3000 characters).
- Teams: ``{"type": "message", "attachments": [{"contentType":
  "application/vnd.microsoft.card.adaptive", "content": {"type": "AdaptiveCard",
  "version": ..., "body": [...]}}]}``, body elements typed.
- PagerDuty Events API v2: ``routing_key`` (32 characters), ``event_action`` in
  trigger|acknowledge|resolve, ``dedup_key`` (at most 255); a trigger's ``payload``
  has ``summary`` (1 to 1024), ``source``, ``severity`` in critical|error|warning|info,
  an ISO 8601 ``timestamp`` and an object ``custom_details``. Incidents are kept by
  ``dedup_key``: a trigger opens one (or joins the open one), a resolve closes it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from devstack.receiver import Received, WebhookReceiver

ADAPTIVE = "application/vnd.microsoft.card.adaptive"


def slack_errors(body: Any) -> list[str]:
    errors = []
    if not isinstance(body, dict) or not isinstance(body.get("text"), str) or not body["text"].strip():
        return ["text must be a non-empty string"]
    blocks = body.get("blocks", [])
    if not isinstance(blocks, list) or len(blocks) > 50:
        errors.append("blocks must be a list of at most 50")
    for block in blocks if isinstance(blocks, list) else []:
        if block.get("type") == "section":
            text = block.get("text", {})
            if text.get("type") not in {"mrkdwn", "plain_text"} or not 0 < len(text.get("text", "")) <= 3000:
                errors.append("a section's text must be mrkdwn or plain_text of 1 to 3000 characters")
        elif block.get("type") == "context":
            if not block.get("elements") or any(e.get("type") not in {"mrkdwn", "plain_text", "image"}
                                                 for e in block["elements"]):
                errors.append("a context needs elements of text or images")
        else:
            errors.append(f"unexpected block type {block.get('type')!r}")
    if set(body) - {"text", "blocks", "attachments", "thread_ts", "mrkdwn", "username", "icon_emoji", "icon_url"}:
        errors.append(f"unexpected fields {sorted(set(body) - {'text', 'blocks'})}")
    return errors


def teams_errors(body: Any) -> list[str]:
    if not isinstance(body, dict) or body.get("type") != "message":
        return ['type must be "message"']
    attachments = body.get("attachments")
    if not isinstance(attachments, list) or len(attachments) != 1:
        return ["attachments must hold one card"]
    [attachment] = attachments
    if attachment.get("contentType") != ADAPTIVE:
        return [f"contentType must be {ADAPTIVE}"]
    card = attachment.get("content", {})
    errors = []
    if card.get("type") != "AdaptiveCard" or not isinstance(card.get("version"), str):
        errors.append("content must be an AdaptiveCard with a version")
    if not isinstance(card.get("body"), list) or not card["body"]:
        errors.append("the card needs a body")
    errors += _element_errors(card.get("body", []))
    return errors


def _element_errors(elements: list) -> list[str]:
    """Adaptive Card elements the Teams channel sends: TextBlock, RichTextBlock of TextRuns, FactSet, Container."""
    errors = []
    for element in elements:
        if element.get("type") == "TextBlock":
            if not isinstance(element.get("text"), str) or not element["text"]:
                errors.append("a TextBlock needs text")
        elif element.get("type") == "RichTextBlock":
            inlines = element.get("inlines")
            if not isinstance(inlines, list) or not inlines or any(
                    run.get("type") != "TextRun" or not isinstance(run.get("text"), str) or not run["text"]
                    for run in inlines):
                errors.append("a RichTextBlock needs inlines: TextRuns with text")
        elif element.get("type") == "FactSet":
            if any(set(fact) != {"title", "value"} or not all(isinstance(v, str) for v in fact.values())
                   for fact in element.get("facts", [])):
                errors.append("facts are {title, value} strings")
        elif element.get("type") == "Container":
            if not isinstance(element.get("items"), list):
                errors.append("a Container needs items")
            else:
                errors += _element_errors(element["items"])
        else:
            errors.append(f"unexpected element {element.get('type')!r}")
    return errors


def pagerduty_errors(body: Any) -> list[str]:
    if not isinstance(body, dict):
        return ["not an object"]
    errors = []
    if not isinstance(body.get("routing_key"), str) or len(body["routing_key"]) != 32:
        errors.append("routing_key must be 32 characters")
    if body.get("event_action") not in {"trigger", "acknowledge", "resolve"}:
        errors.append("event_action must be trigger, acknowledge or resolve")
    if not isinstance(body.get("dedup_key"), str) or not 0 < len(body["dedup_key"]) <= 255:
        errors.append("dedup_key must be 1 to 255 characters")
    if body.get("event_action") == "trigger":
        payload = body.get("payload")
        if not isinstance(payload, dict):
            return [*errors, "a trigger needs a payload"]
        if not isinstance(payload.get("summary"), str) or not 0 < len(payload["summary"]) <= 1024:
            errors.append("payload.summary must be 1 to 1024 characters")
        if not isinstance(payload.get("source"), str) or not payload["source"]:
            errors.append("payload.source is required")
        if payload.get("severity") not in {"critical", "error", "warning", "info"}:
            errors.append("payload.severity must be critical, error, warning or info")
        try:
            datetime.fromisoformat(payload["timestamp"])
        except (KeyError, TypeError, ValueError):
            errors.append("payload.timestamp must be ISO 8601")
        if not isinstance(payload.get("custom_details", {}), dict):
            errors.append("payload.custom_details must be an object")
    return errors


@dataclass
class Incident:
    dedup_key: str
    summary: str
    status: str = "triggered"
    events: int = 1


@dataclass
class ShapeChecked:
    """A receiver answering 400 to what fails ``check`` (and recording why), else ``status``."""

    check: Any
    status: int = 200
    reply: dict | None = None
    rejected: list[tuple[Received, list[str]]] = field(default_factory=list)

    def __call__(self, got: Received) -> tuple[int, dict | None]:
        errors = self.check(got.json)
        if errors:
            self.rejected.append((got, errors))
            return 400, {"status": "invalid", "errors": errors}
        return self.status, self.reply


@dataclass
class PagerDuty:
    """The Events API v2 as far as incidents go: kept by ``dedup_key``."""

    incidents: dict[str, Incident] = field(default_factory=dict)
    rejected: list[tuple[Received, list[str]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, got: Received) -> tuple[int, dict | None]:
        event = got.json
        errors = pagerduty_errors(event)
        if errors:
            self.rejected.append((got, errors))
            return 400, {"status": "invalid event", "message": "Event object is invalid", "errors": errors}
        key = event["dedup_key"]
        with self.lock:
            incident = self.incidents.get(key)
            if event["event_action"] == "trigger":
                if incident is None or incident.status == "resolved":
                    self.incidents[key] = Incident(key, event["payload"]["summary"])
                else:
                    incident.events += 1
            elif incident is not None:
                incident.status = "resolved"
                incident.events += 1
        return 202, {"status": "success", "message": "Event processed", "dedup_key": key}


def receiver(answer: Any, **options: Any) -> WebhookReceiver:
    return WebhookReceiver(answer=answer, **options)
