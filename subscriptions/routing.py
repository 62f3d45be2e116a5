"""What the notifier may know of subscriptions: where each one's alerts go, as typed values.

The dispatcher turns transitions into notifications; for that it needs, per
subscription, its name and condition (shown in the notification), its alert
policy, and the endpoints it notifies. It reads them here, as frozen values, and
never sees the ORM rows, their JSON columns or the queries behind them, so the
schema can change without touching the notifier.

Ids are never reused (``models.NEVER_REUSE_IDS``): a subscription missing from
:func:`routes` was deleted, and :func:`forget_subscription` removes what the
evaluator wrote for it before it saw the new catalog.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.settings import Settings
from subscriptions import vault
from subscriptions.models import Endpoint, Subscription
from subscriptions.policy import AlertPolicy
from subscriptions.service import forget_subscription

__all__ = ["EndpointRoute", "Route", "endpoint_route", "forget_subscription", "routes", "routes_with_reminders"]


@dataclass(frozen=True)
class EndpointRoute:
    """One endpoint a subscription notifies, as a delivery is bound to it when it is queued."""

    id: int
    owner_id: int
    kind: str
    target: str
    stored_secret: str | None  # as stored (sealed): fingerprinted into the delivery's generation, never sent
    template: str | None = None  # the message template (``subscriptions.templating``); None: the channel's own

    @classmethod
    def of(cls, endpoint: Endpoint) -> EndpointRoute:
        return cls(endpoint.id, endpoint.owner_id, endpoint.kind, endpoint.target, endpoint.secret_encrypted,
                   endpoint.template)

    def signing_secret(self, settings: Settings) -> str | None:
        """The signing secret in plaintext, for the one attempt that signs with it."""
        return vault.reveal(settings, self.stored_secret) if self.stored_secret is not None else None


def endpoint_route(session: Session, endpoint_id: int) -> EndpointRoute | None:
    """One endpoint as it is now (None: deleted; ids are never reused)."""
    endpoint = session.get(Endpoint, endpoint_id)
    return EndpointRoute.of(endpoint) if endpoint is not None else None


@dataclass(frozen=True)
class Route:
    """Where one subscription's alerts go, and under which policy."""

    subscription_id: int
    owner_id: int
    name: str
    condition: str  # canonical text
    active: bool
    policy: AlertPolicy
    endpoints: tuple[EndpointRoute, ...]

    @classmethod
    def of(cls, subscription: Subscription) -> Route:
        return cls(subscription.id, subscription.owner_id, subscription.name, subscription.condition,
                   subscription.active, AlertPolicy.model_validate(subscription.policy or {}),
                   tuple(EndpointRoute.of(endpoint) for endpoint in subscription.endpoints))


def routes(session: Session, subscription_ids: Iterable[int]) -> dict[int, Route]:
    """The routes of these subscriptions, by id; a deleted one is absent. Paused ones are included."""
    wanted = set(subscription_ids)
    if not wanted:
        return {}
    found = session.scalars(select(Subscription).where(Subscription.id.in_(wanted)))
    return {subscription.id: Route.of(subscription) for subscription in found}


def routes_with_reminders(session: Session) -> list[Route]:
    """The active subscriptions whose policy re-notifies keys that stay firing, by id."""
    query = (select(Subscription)
             .where(Subscription.active, Subscription.policy["renotify_s"].as_integer().is_not(None))
             .order_by(Subscription.id))
    return [Route.of(subscription) for subscription in session.scalars(query)]
