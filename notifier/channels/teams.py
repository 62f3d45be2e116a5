"""Microsoft Teams-compatible incoming webhooks: an Adaptive Card in a ``message`` envelope.

The shape Teams documents for incoming webhooks and for the Workflows ("When a
Teams webhook request is received") that replace them::

    {"type": "message", "attachments": [{"contentType": "application/vnd.microsoft.card.adaptive",
     "contentUrl": null, "content": {"$schema": ..., "type": "AdaptiveCard", "version": "1.4", "body": [...]}}]}

The body is the title, the message (the default one, or the endpoint's template as a Markdown
``TextBlock``, values escaped), the first alerts (key, value and state) and a small line naming the
notification and each alert's ``sequence`` (``notifier.rendering.context_line``). Everything but a
template's text is a ``RichTextBlock``, in which Adaptive Cards interpret no Markdown: a condition like
``COUNT(*) > 5`` or a key like ``db_1`` reads as written. Backslash escapes, which Teams clients can show
literally, appear only where a template's values meet its Markdown, and only before the characters the
card's Markdown subset interprets (the ``markdown`` escape of ``subscriptions.templating``).
Teams answers 200 (connectors) or 202 (Workflows); 429 and 5xx are retried.
"""

from __future__ import annotations

from typing import Any, ClassVar

from core.settings import Settings
from notifier.channels import register
from notifier.channels.chat import ChatChannel
from notifier.channels.webhook import check_url
from notifier.rendering import context_line, message
from subscriptions.channel_kinds import EndpointKind
from subscriptions.templating import ms_time, number, state_label

CARD_VERSION = "1.4"  # what Teams renders on every client (desktop, web, mobile)
CARD_CONTENT_TYPE = "application/vnd.microsoft.card.adaptive"
TEXT_LIMIT = 4000
FACTS_SHOWN = 20


def default_text(values: dict[str, Any]) -> str:
    """The message without a template: plain text, one line per block (:func:`plain`), shown as written."""
    more = values["alert_count"] - FACTS_SHOWN
    return (f"Condition: {values['subscription']['condition']}\n"
            f"Evaluated at {ms_time(values['evaluated_at'])}" + (f"\n{more} more alerts not shown" if more > 0 else ""))


def run(text: str, **style: Any) -> dict[str, Any]:
    return {"type": "TextRun", "text": text, **style}


def plain(*runs: dict[str, Any]) -> dict[str, Any]:
    """A RichTextBlock: Adaptive Cards interpret no Markdown in its TextRuns, so a key, a name or a condition
    (``COUNT(*) > 5``, ``db_1``, ``[x](y)``) reads exactly as written, with no escaping for a client to show."""
    return {"type": "RichTextBlock", "inlines": list(runs)}


def teams_payload(notification: dict[str, Any], template: str | None, settings: Settings) -> tuple[dict, str | None]:
    text = message(notification, template, settings, "markdown", default_text, TEXT_LIMIT)
    firing = notification["state"] == "firing"
    title = f"{state_label(notification)}: {'TEST: ' if notification.get('test') else ''}{notification['subscription_name']}"
    if template is not None and text.error is None:  # the subscriber's Markdown, its values escaped
        body_text: list[dict[str, Any]] = [{"type": "TextBlock", "text": text.text, "wrap": True}]
    else:
        body_text = [plain(run(line)) for line in text.text.splitlines() if line]
    alerts = [plain(run(str(alert["key"]), weight="Bolder"),
                    run(f"  {number(alert.get('value'))} ({alert.get('state')})"))
              for alert in notification["alerts"][:FACTS_SHOWN]]
    card = {
        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
        "type": "AdaptiveCard",
        "version": CARD_VERSION,
        "body": [
            plain(run(title, size="Medium", weight="Bolder", color="Attention" if firing else "Good")),
            *body_text,
            {"type": "Container", "items": alerts},
            plain(run(context_line(notification), size="Small", isSubtle=True)),
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
             "title, message and the alerts.",
        template_use="the card's message text block (Markdown; values are escaped)", template_escape="markdown",
    )

    build = staticmethod(teams_payload)


register(TeamsChannel)
