"""Slack-compatible incoming webhooks: ``text`` (mrkdwn) and ``blocks``, POSTed to the webhook URL.

The payload Slack documents for incoming webhooks (also taken by Mattermost and
Rocket.Chat): ``text`` is the message and the notification's fallback, ``blocks``
its layout - one ``section`` of mrkdwn and a ``context`` line (the notification's id and each alert's
``sequence``: ``notifier.rendering.context_line``). The endpoint's
template, if any, renders the text (values escaped for mrkdwn: ``&``, ``<`` and
``>``, so a key can neither mention ``<!channel>`` nor make a link). Slack answers
200 ``ok``; 429 (with ``Retry-After``) and 5xx are retried, other 4xx
(``invalid_payload``, ``no_service``) are final.
"""

from __future__ import annotations

from typing import Any, ClassVar

from core.settings import Settings
from notifier.channels import register
from notifier.channels.chat import ChatChannel
from notifier.channels.webhook import check_url
from notifier.rendering import context_line, cut, message
from subscriptions.channel_kinds import EndpointKind
from subscriptions.templating import ESCAPES, ms_time, number

SECTION_TEXT_LIMIT = 3000  # Slack's limit of a section block's text
TEXT_LIMIT = 4000  # Slack's advice for ``text`` (it cuts longer messages at 40,000)
ALERTS_SHOWN = 10
_escape = ESCAPES["slack"]


def default_text(values: dict[str, Any]) -> str:
    """``*FIRING: name (AAPL, MSFT)*`` then one line per alert (the first ten)."""
    lines = [f"*{_escape(values['title'])}*", f"`{_escape(values['subscription']['condition'])}`"]
    for alert in values["alerts"][:ALERTS_SHOWN]:
        lines.append(f"• *{_escape(alert['key'])}*: {number(alert['value'])} "
                     f"(window {ms_time(alert['window_start'])} to {ms_time(alert['window_end'])})")
    if values["alert_count"] > ALERTS_SHOWN:
        lines.append(f"… and {values['alert_count'] - ALERTS_SHOWN} more")
    return "\n".join(lines)


def slack_payload(notification: dict[str, Any], template: str | None, settings: Settings) -> tuple[dict, str | None]:
    """The request body for ``notification``, and the template's failure if it failed."""
    text = message(notification, template, settings, "slack", default_text, TEXT_LIMIT)
    blocks = [
        {"type": "section", "text": {"type": "mrkdwn", "text": cut(text.text, SECTION_TEXT_LIMIT)}},
        {"type": "context", "elements": [{"type": "mrkdwn",
                                          "text": cut(_escape(context_line(notification)), SECTION_TEXT_LIMIT)}]},
    ]
    return {"text": text.text, "blocks": blocks}, text.error


class SlackChannel(ChatChannel):
    """A Slack (or Slack-compatible) incoming webhook."""

    kind: ClassVar[EndpointKind] = EndpointKind(
        name="slack", label="Slack", check_target=check_url, has_secret=False, position=30,
        placeholder="https://hooks.slack.com/services/T000/B000/XXXX",
        help="A Slack incoming-webhook URL (or a Slack-compatible one: Mattermost, Rocket.Chat). Each notification "
             "is one message: text in mrkdwn plus blocks.",
        template_use="the message text (mrkdwn; values are escaped)", template_escape="slack",
    )

    build = staticmethod(slack_payload)


register(SlackChannel)
