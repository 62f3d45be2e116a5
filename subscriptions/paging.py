"""Who hears about the platform's own trouble: the operators at their own addresses, and a stale stream's subscribers.

The dead man's switch (``web.watchdog``) pages through the ordinary delivery task, which
delivers to endpoints, so that each page is retried, recorded and dead-lettered like an
alert. An operator account is paged at its own address through an e-mail endpoint it owns
with that address as target: the first such endpoint it has, else one made for it (shown
on its endpoints page like any other, with the deliveries' log). Without any operator
setting, the operators hear of an incident.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import redis
import structlog
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.settings import Settings
from subscriptions.errors import Forbidden
from subscriptions.models import Endpoint, Subscription, User
from subscriptions.routing import EndpointRoute, Route
from subscriptions.schemas import EndpointIn
from subscriptions.service import SubscriptionService
from subscriptions.streams import stream_of

log = structlog.get_logger(__name__)

OPERATOR = "operator"
EMAIL = "email"


def operator_mailboxes(session: Session, settings: Settings, client: redis.Redis) -> list[EndpointRoute]:
    """Every operator account's e-mail endpoint to its own address, made for those that have none."""
    found = []
    for user in session.scalars(select(User).where(User.role == OPERATOR).order_by(User.id)):
        endpoint = session.scalar(select(Endpoint).where(Endpoint.owner_id == user.id, Endpoint.kind == EMAIL,
                                                         Endpoint.target == user.email).order_by(Endpoint.id))
        if endpoint is None:
            try:
                endpoint = SubscriptionService(session, settings, client, user).create_endpoint(
                    EndpointIn(kind=EMAIL, target=user.email))
            except Forbidden as exc:  # at its endpoint limit: the others are still paged
                log.warning("operator_not_paged", user_id=user.id, reason=str(exc))
                continue
        found.append(EndpointRoute.of(endpoint))
    return found


def routes_on_streams(session: Session, streams: Iterable[str]) -> dict[str, list[Route]]:
    """The active subscriptions evaluating each of ``streams``, by stream (a stream nobody watches is absent)."""
    wanted = set(streams)
    found: dict[str, list[Route]] = defaultdict(list)
    if not wanted:
        return found
    for subscription in session.scalars(select(Subscription).where(Subscription.active).order_by(Subscription.id)):
        stream = stream_of(subscription)
        if stream in wanted:
            found[stream].append(Route.of(subscription))
    return found
