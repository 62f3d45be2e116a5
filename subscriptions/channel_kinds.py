"""The endpoint kinds users may create: what each channel declares about its endpoints.

Why a registry down here: an endpoint is validated and stored by ``subscriptions``
(API schema, service, pages), but a channel's code lives in ``notifier/channels/``,
which ``subscriptions`` may not import. So each channel module declares its
:class:`EndpointKind` next to its sender and registers both with one line
(``notifier.channels.register``); that puts the kind in this table, which is all
``subscriptions`` and ``web`` read. The table is filled when ``notifier.channels``
is imported, as the web app and the worker do at start; asking it before then is
an error that says so, never a silently empty list.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class EndpointKind:
    """One channel's endpoints, as users create and see them."""

    name: str  # stored in ``endpoints.kind`` and sent by the API: never rename one in use
    label: str  # what people read ("e-mail")
    check_target: Callable[[str], str]  # the target as stored, or ValueError with a message for the form
    has_secret: bool  # a signing secret is generated (unless given), shown once and rotatable
    placeholder: str  # an example target for the form
    help: str  # one sentence for the form: what the target is, what the receiver gets
    position: int = 100  # where lists show it, lowest first; the first is the form's default
    secret_required: bool = False  # the user must give the secret (a PagerDuty routing key): never generated
    secret_label: str = "signing secret"  # what the form and errors call the secret
    template_use: str | None = None  # what a message template renders for this kind ("the message text"); None: none
    template_escape: str = "text"  # how values are escaped in its templates (``subscriptions.templating.ESCAPES``)

    @property
    def rotatable(self) -> bool:
        """Whether Tocsin can make a new secret (a generated one; a key the user gave is theirs to change)."""
        return self.has_secret and not self.secret_required


class UnknownKindError(ValueError):
    """Not a registered kind (a ValueError, so pydantic reports it on the field)."""


MAX_KIND_LENGTH = 16  # the width of ``endpoints.kind``
_KINDS: dict[str, EndpointKind] = {}


def register_kind(kind: EndpointKind) -> EndpointKind:
    """Add a kind; registering another under a taken name, or one too long to store, is a programming error."""
    if not 0 < len(kind.name) <= MAX_KIND_LENGTH:
        raise ValueError(f"endpoint kind {kind.name!r}: a name of 1 to {MAX_KIND_LENGTH} characters is stored")
    if _KINDS.get(kind.name, kind) is not kind:
        raise ValueError(f"endpoint kind {kind.name!r} is registered twice")
    _KINDS[kind.name] = kind
    return kind


def unregister_kind(name: str) -> None:
    _KINDS.pop(name, None)


def endpoint_kinds() -> list[EndpointKind]:
    """Every kind, by position then name (the form lists them so; the first is the default)."""
    if not _KINDS:
        raise RuntimeError("no endpoint kinds registered: import notifier.channels first (the web app and the "
                           "worker do)")
    return sorted(_KINDS.values(), key=lambda kind: (kind.position, kind.name))


def endpoint_kind(name: str) -> EndpointKind:
    kinds = {kind.name: kind for kind in endpoint_kinds()}
    if name not in kinds:
        names = [repr(known) for known in kinds]
        raise UnknownKindError(f"must be {', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else f"must be {names[0]}")
    return kinds[name]


def secret_kinds() -> list[str]:
    """The names of the kinds whose endpoints have a secret Tocsin generates (and can rotate)."""
    return [kind.name for kind in endpoint_kinds() if kind.rotatable]
