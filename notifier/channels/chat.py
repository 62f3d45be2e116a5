"""What the chat receivers (Slack, Teams) share: one JSON body per notification, POSTed to the webhook URL.

Each receiver module declares its :class:`~subscriptions.channel_kinds.EndpointKind` and how its body is
built (``build``: the payload and the template's failure, if it failed); sending goes through the
webhook's machinery (``post_json``: SSRF guard, deadline, retry classification, ``Retry-After``), and a
template failure is noted on the attempt so the delivery log says why the default message went out.
This module registers no channel.
"""

from __future__ import annotations

from typing import Any, ClassVar

from core.settings import Settings
from notifier.attempt import Attempt
from notifier.channels import EndpointView
from notifier.channels.webhook import WebhookLimits, json_body, post_json
from notifier.notification import Notification
from notifier.rendering import noted
from subscriptions.channel_kinds import EndpointKind


class ChatChannel:
    """A receiver whose request is one JSON body built from the notification and the endpoint's template."""

    kind: ClassVar[EndpointKind]

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.limits = WebhookLimits.from_settings(settings)

    @staticmethod
    def build(notification: dict[str, Any], template: str | None, settings: Settings) -> tuple[dict, str | None]:
        """The request body for ``notification``, and the template's failure if it failed."""
        raise NotImplementedError

    @classmethod
    def payload_preview(cls, notification: dict[str, Any], template: str | None, settings: Settings) -> dict:
        """What the receiver gets for ``notification`` (the endpoints page's preview)."""
        return cls.build(notification, template, settings)[0]

    @classmethod
    def longest_attempt_s(cls, settings: Settings) -> float:
        return settings.webhook_total_timeout_s

    def send(self, notification: Notification, endpoint: EndpointView) -> Attempt:
        payload, failure = self.build(notification.to_json(), endpoint.template, self.settings)
        return noted(post_json(endpoint.target, json_body(payload), {"User-Agent": "Tocsin/1"}, self.limits), failure)
