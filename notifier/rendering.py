"""A notification's message text for one endpoint: its template if it has one, else the channel's default.

Every channel with a text body (Slack's text, Teams' text block, PagerDuty's summary,
the e-mail body) asks :func:`message` for it. The template language and its limits
are :mod:`subscriptions.templating`; this is where it meets a notification and a
channel: the channel's escaping, its own length limit, and the rule that a
template failing at send time never costs the alert - the channel's default
message goes out instead and :attr:`Message.error` says why, for the delivery log.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

import structlog

from core.settings import Settings
from notifier.attempt import Attempt
from subscriptions.templating import MessageTemplateError, TemplateLimits, compile_template, variables

log = structlog.get_logger(__name__)

Default = Callable[[dict[str, Any]], str]  # the channel's own message, from the template variables


@dataclass(frozen=True)
class Message:
    text: str
    error: str | None = None  # the template failed; ``text`` is the default message


KEYS_LISTED = 10  # keys named in a context line's list (sequences, firings not on record)


def sequences(notification: dict[str, Any]) -> dict[str, int]:
    """Each alert's ``sequence`` by key (``notifier.order``): the alerts that have one (a subscription's)."""
    return {str(alert["key"]): alert["sequence"] for alert in notification["alerts"]
            if alert.get("sequence") is not None}


def unknown_states(notification: dict[str, Any]) -> list[str]:
    """The keys of the alerts resolved without a record of their firing (``state_unknown``, ``notifier.policy``):
    the receiver may never have been told that they fired."""
    return [str(alert["key"]) for alert in notification["alerts"] if alert.get("state_unknown")]


def context_line(notification: dict[str, Any]) -> str:
    """The line under a chat message: ``Tocsin · notification 3f2a… · sequence 7`` (``sequences AAPL 7, MSFT 3``
    for several keys, the first ten), for a reader - or a flow reading the message - to match and order them; then
    the keys resolved without a record of their firing (``· firing not on record: AAPL``), shown whatever the
    endpoint's template says."""
    parts = [f"Tocsin · {'test alert · ' if notification.get('test') else ''}notification {notification['notification_id']}"]
    numbered = list(sequences(notification).items())
    if len(numbered) == 1 and len(notification["alerts"]) == 1:
        parts.append(f"sequence {numbered[0][1]}")
    elif numbered:
        parts.append(f"sequences {_first(f'{key} {sequence}' for key, sequence in numbered)}")
    if unknown := unknown_states(notification):
        parts.append(f"firing not on record: {_first(unknown)}")
    return " · ".join(parts)


def _first(items: Iterable[str]) -> str:
    """The first ``KEYS_LISTED`` of ``items``, comma-separated, and how many more (``+3``)."""
    listed = list(items)
    more = f" +{len(listed) - KEYS_LISTED}" if len(listed) > KEYS_LISTED else ""
    return ", ".join(listed[:KEYS_LISTED]) + more


def cut(text: str, limit: int) -> str:
    """``text`` within ``limit`` characters, marked with ``…`` when cut."""
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


def message(notification: dict[str, Any], template: str | None, settings: Settings, escape: str,
            default: Default, limit: int | None = None) -> Message:
    """The text of ``notification`` (its JSON object) for a channel that escapes values with ``escape``,
    within the channel's ``limit`` (a template's output is also within ``TOCSIN_TEMPLATE_MAX_OUTPUT_CHARS``)."""
    values = variables(notification)
    if template is None:
        return Message(_fit(default(values), limit))
    try:
        text = compile_template(template, TemplateLimits.from_settings(settings), escape).render(values)
    except MessageTemplateError as exc:
        log.warning("message_template_failed", notification=notification.get("notification_id"), error=str(exc))
        return Message(_fit(default(values), limit),
                       f"message template failed ({exc}); the default message was sent"[:500])
    if not text.strip():  # receivers refuse an empty message (PagerDuty's summary, Slack's text)
        return Message(_fit(default(values), limit), "message template rendered nothing; the default message was sent")
    return Message(_fit(text, limit))


def _fit(text: str, limit: int | None) -> str:
    return cut(text, limit) if limit else text


def noted(attempt: Attempt, note: str | None) -> Attempt:
    """``attempt`` with a template failure added to its error: a delivered attempt then records why its
    message was the default one (the delivery log shows it), a failed one keeps its own reason first."""
    if note is None:
        return attempt
    return replace(attempt, error="; ".join(part for part in (attempt.error, note) if part)[:1000])
