"""The notifier's typed view of subscriptions (subscriptions.routing), on a real database."""

from __future__ import annotations

import redis

from core.settings import Settings
from notifier.deliveries import binding
from notifier.tasks import load_endpoint
from subscriptions.db import session_factory
from subscriptions.models import User
from subscriptions.policy import AlertPolicy
from subscriptions.routing import EndpointRoute, Route, endpoint_route, routes, routes_with_reminders
from subscriptions.schemas import EndpointIn, SubscriptionIn
from subscriptions.service import SubscriptionService

CONDITION = "SUM(volume) OVER 1m > 100"


def _create(service: SubscriptionService, name: str, endpoint_ids: list[int], active: bool = True,
            **policy: object) -> int:
    data = SubscriptionIn(name=name, condition=CONDITION, endpoint_ids=endpoint_ids, active=active, policy=policy)
    return service.create(data).id


def test_a_route_carries_what_the_dispatcher_needs(settings: Settings, redis_client: redis.Redis, owner: User) -> None:
    with session_factory(settings.database_url)() as session:
        service = SubscriptionService(session, settings, redis_client, owner)
        hook = service.create_endpoint(EndpointIn(kind="webhook", target="https://a.example/hook"))
        mail = service.create_endpoint(EndpointIn(kind="email", target="ops@example.com"))
        grouped = _create(service, "grouped", [hook.id, mail.id], cooldown_s=600, group=False)
        paused = _create(service, "paused", [], active=False)
        deleted = _create(service, "deleted", [hook.id])
        service.delete(deleted)

    with session_factory(settings.database_url)() as session:
        found = routes(session, [grouped, paused, deleted])
    assert set(found) == {grouped, paused}, "a deleted subscription has no route; a paused one has"
    route = found[grouped]
    assert route == Route(grouped, owner.id, "grouped", CONDITION, True, AlertPolicy(cooldown_s=600, group=False),
                          (EndpointRoute(hook.id, owner.id, "webhook", "https://a.example/hook", hook.secret_encrypted),
                           EndpointRoute(mail.id, owner.id, "email", "ops@example.com", None)))
    assert hook.secret is not None and hook.secret not in repr(route), "the route never holds a plaintext secret"
    assert found[paused].active is False and found[paused].endpoints == ()


def test_only_active_subscriptions_that_renotify_have_reminders(settings: Settings, redis_client: redis.Redis,
                                                                 owner: User) -> None:
    with session_factory(settings.database_url)() as session:
        service = SubscriptionService(session, settings, redis_client, owner)
        reminding = _create(service, "reminding", [], renotify_s=3600)
        _create(service, "quiet", [])
        _create(service, "paused", [], active=False, renotify_s=3600)
        also = _create(service, "also", [], renotify_s=60, cooldown_s=10)
        with session_factory(settings.database_url)() as reader:
            assert routes(reader, []) == {}
            due = routes_with_reminders(reader)
    assert [(r.subscription_id, r.policy.renotify_s) for r in due] == [(reminding, 3600), (also, 60)]


def test_the_dispatcher_binds_a_delivery_as_the_worker_checks_it(settings: Settings, redis_client: redis.Redis,
                                                                  owner: User) -> None:
    """Enqueueing and the worker's check bind through one function over one typed view: rotation included."""
    with session_factory(settings.database_url)() as session:
        service = SubscriptionService(session, settings, redis_client, owner)
        hook = service.create_endpoint(EndpointIn(kind="webhook", target="https://a.example/hook")).id
        mail = service.create_endpoint(EndpointIn(kind="email", target="ops@example.com")).id
    for endpoint_id in (hook, mail):
        view = load_endpoint(settings, endpoint_id)
        assert view is not None and view.generation == binding(_route(settings, endpoint_id))["generation"]
    before = binding(_route(settings, hook))
    with session_factory(settings.database_url)() as session:
        SubscriptionService(session, settings, redis_client, owner).rotate_secret(hook)
    after = binding(_route(settings, hook))
    assert after["generation"] != before["generation"]
    rotated = load_endpoint(settings, hook)
    assert rotated is not None and rotated.generation == after["generation"] and rotated.secret
    with session_factory(settings.database_url)() as session:
        assert endpoint_route(session, 987_654_321) is None


def _route(settings: Settings, endpoint_id: int) -> EndpointRoute:
    with session_factory(settings.database_url)() as session:
        route = endpoint_route(session, endpoint_id)
    assert route is not None
    return route
