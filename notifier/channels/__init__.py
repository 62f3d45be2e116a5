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
from typing import ClassVar, Protocol

from core.settings import Settings
from notifier.attempt import Attempt
from notifier.notification import Notification
from subscriptions.channel_kinds import EndpointKind, endpoint_kind, endpoint_kinds, register_kind, unregister_kind

# The web app reads the kinds from here: importing it is what fills the registry.
__all__ = ["Channel", "EndpointKind", "EndpointView", "channel_for", "channels", "endpoint_kinds", "register",
           "unregister"]


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


def _load_channel_modules() -> None:
    for module in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        importlib.import_module(f"{__name__}.{module.name}")


_load_channel_modules()
