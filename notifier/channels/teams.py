"""Microsoft Teams-compatible incoming webhooks: an Adaptive Card in a ``message`` envelope.

The shape Teams documents for incoming webhooks and for the Workflows ("When a
Teams webhook request is received") that replace them::

    {"type": "message", "attachments": [{"contentType": "application/vnd.microsoft.card.adaptive",
     "contentUrl": null, "content": {"$schema": ..., "type": "AdaptiveCard", "version": "1.4", "body": [...]}}]}

The body is a title ``TextBlock``, the message ``TextBlock`` (the endpoint's
template, values Markdown-escaped, or the default), a ``FactSet`` of the first
alerts and a small ``TextBlock`` naming the notification and each alert's ``sequence``
(``notifier.rendering.context_line``). Teams answers 200 (connectors) or 202 (Workflows); 429 and 5xx are retried.
"""

from __future__ import annotations

from typing import Any, ClassVar

from core.settings import Settings
from notifier.channels import register
from notifier.channels.chat import ChatChannel
from notifier.channels.webhook import check_url
from notifier.rendering import context_line, message
from subscriptions.channel_kinds import EndpointKind
from subscriptions.templating import ESCAPES, ms_time, number, state_label

CARD_VERSION = "1.4"  # what Teams renders on every client (desktop, web, mobile)
CARD_CONTENT_TYPE = "application/vnd.microsoft.card.adaptive"
TEXT_LIMIT = 4000
FACTS_SHOWN = 20
_escape = ESCAPES["markdown"]


def default_text(values: dict[str, Any]) -> str:
    more = values["alert_count"] - FACTS_SHOWN
    return (f"Condition: {_escape(values['subscription']['condition'])}  \n"
            f"Evaluated at {ms_time(values['evaluated_at'])}" + (f"  \n{more} more alerts not shown" if more > 0 else ""))


def teams_payload(notification: dict[str, Any], template: str | None, settings: Settings) -> tuple[dict, str | None]:
    text = message(notification, template, settings, "markdown", default_text, TEXT_LIMIT)
    firing = notification["state"] == "firing"
    facts = [{"title": str(alert["key"]), "value": f"{number(alert.get('value'))} ({alert.get('state')})"}
             for alert in notification["alerts"][:FACTS_SHOWN]]
    title = f"{state_label(notification)}: {'TEST: ' if notification.get('test') else ''}{notification['subscription_name']}"
    card = {
        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
        "type": "AdaptiveCard",
        "version": CARD_VERSION,
        "body": [
            {"type": "TextBlock", "text": _escape(title), "size": "Medium", "weight": "Bolder", "wrap": True,
             "color": "Attention" if firing else "Good"},
            {"type": "TextBlock", "text": text.text, "wrap": True},
            {"type": "FactSet", "facts": facts},
            {"type": "TextBlock", "text": _escape(context_line(notification)), "size": "Small", "isSubtle": True,
             "wrap": True},
        ],
        "msteams": {"width": "Full"},
    }
    payload = {"type": "message",
               "attachments": [{"contentType": CARD_CONTENT_TYPE, "contentUrl": None, "content": card}]}
    return payload, text.error


class TeamsChannel(ChatChannel):
    """A Microsoft Teams incoming webhook or Workflows webhook URL."""

    kind: ClassVar[EndpointKind] = EndpointKind(
        name="teams", label="Microsoft Teams", check_target=check_url, has_secret=False, position=40,
        placeholder="https://example.webhook.office.com/webhookb2/…",
        help="A Teams incoming-webhook (or Workflows webhook) URL. Each notification is one Adaptive Card: "
             "title, message and the alerts as facts.",
        template_use="the card's message text block (Markdown; values are escaped)", template_escape="markdown",
    )

    build = staticmethod(teams_payload)


register(TeamsChannel)
