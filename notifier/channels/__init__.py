"""Delivery channels as plug-ins: one module per channel, found by being in this package.

A channel module (``webhook.py``, ``email.py``, ...) holds everything about its
channel: a class with the :class:`Channel` shape - its :class:`EndpointKind`
(kind name, label, target check, secret or not, form help) and ``send`` - and
one line, ``register(TheChannel)``, at its end. Importing this package imports
every module in it, so a new channel is one new file and nothing else.

The two halves of a declaration go to two registries because of the layers:
the sender stays here, in the notifier, while the endpoint kind goes to
:mod:`subscriptions.channel_kinds`, below, where the API schema, the service and
the pages read it without importing the notifier.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from core.settings import Settings
from notifier.attempt import Attempt
from notifier.notification import Notification
from subscriptions.channel_kinds import EndpointKind, endpoint_kind, endpoint_kinds, register_kind, unregister_kind
from subscriptions.templating import MessageTemplateError, TemplateLimits, compile_template, sample_notification, variables

# The web app reads the kinds from here: importing it is what fills the registry.
__all__ = ["Channel", "EndpointKind", "EndpointView", "Preview", "channel_for", "channels", "claim_ttl_s", "endpoint_kinds",
           "preview", "register", "unregister"]


@dataclass(frozen=True)
class EndpointView:
    """An endpoint as a channel sees it: read-only, loaded once per attempt (``notifier.tasks.load_endpoint``)."""

    kind: str
    target: str
    secret: str | None = field(repr=False)  # the signing secret in plaintext: kept out of logs and reprs
    owner_id: int
    generation: str  # what the delivery was bound to (``notifier.deliveries.binding``)
    id: int
    template: str | None = None  # the endpoint's message template (``notifier.rendering``); None: the default


class Channel(Protocol):
    """One way to deliver: built with the settings for each attempt, then asked to send once."""

    kind: ClassVar[EndpointKind]  # declared on the class: the registry reads it before any instance exists

    def __init__(self, settings: Settings) -> None: ...

    @classmethod
    def longest_attempt_s(cls, settings: Settings) -> float:
        """An upper bound of one ``send``: a delivery's claim must outlive it."""
        ...

    def send(self, notification: Notification, endpoint: EndpointView) -> Attempt:
        """One attempt; never raises for the receiver's sake (an exception is recorded as an internal error)."""
        ...


_CHANNELS: dict[str, type[Channel]] = {}


def register(channel: type[Channel]) -> type[Channel]:
    """Make a channel deliverable and its endpoint kind creatable (the one line each channel module ends with)."""
    register_kind(channel.kind)
    _CHANNELS[channel.kind.name] = channel
    return channel


def unregister(name: str) -> None:
    """Remove a channel and its kind (for tests that register a channel of their own)."""
    _CHANNELS.pop(name, None)
    unregister_kind(name)


def channel_for(kind: str, settings: Settings) -> Channel:
    """The channel that delivers to endpoints of ``kind`` (a kind no channel serves raises ``UnknownKindError``)."""
    endpoint_kind(kind)
    return _CHANNELS[kind](settings)


def channels() -> list[type[Channel]]:
    return list(_CHANNELS.values())


def claim_ttl_s(settings: Settings) -> float:
    """How long a delivery's ``sending`` claim holds: longer than any one attempt can take, over any channel, so a
    claim outlives the attempt that holds it."""
    return max(channel.longest_attempt_s(settings) for channel in channels()) + 5


@dataclass(frozen=True)
class Preview:
    """A template tried on a sample notification, as an endpoint of one kind would send it."""

    ok: bool
    text: str | None  # the rendered message (the kind's own if no template)
    error: str | None = None
    line: int | None = None
    payload: Any = None  # what the receiver would get, if the channel can show it (``payload_preview``)


def preview(kind: str, template: str | None, state: str, settings: Settings) -> Preview:
    """Render ``template`` (None: the default) for an endpoint of ``kind`` against a sample notification.

    Unlike a delivery, a failing template is reported, not replaced by the default. A channel
    shows its payload through an optional ``payload_preview(notification, template, settings)``.
    """
    endpoint = endpoint_kind(kind)
    sample = sample_notification(state)
    text: str | None = None
    if template is not None:
        try:
            text = compile_template(template, TemplateLimits.from_settings(settings),
                                    endpoint.template_escape).render(variables(sample))
        except MessageTemplateError as exc:
            return Preview(False, None, exc.reason, exc.line)
    payload_of = getattr(_CHANNELS.get(kind), "payload_preview", None)
    payload = payload_of(sample, template, settings) if payload_of else None
    if text is None:
        text = _text_of(payload) if payload is not None else None
    return Preview(True, text, payload=payload)


def _text_of(payload: Any) -> str | None:
    """The message text inside a payload (for the preview of a kind's default message)."""
    if isinstance(payload, dict):
        for key in ("text", "summary", "body"):
            if isinstance(payload.get(key), str):
                return payload[key]
    return None


def _load_channel_modules() -> None:
    for module in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        importlib.import_module(f"{__name__}.{module.name}")


_load_channel_modules()
