"""Subscription and endpoint operations, scoped to their owner, and publishing the catalog to the evaluator.

Every change bumps the catalog version in the same transaction; after commit just
that change (the subscription's spec, or its removal) is appended to the catalog's
change log in Redis at that version (``core.catalog_log``), in time proportional to
the change. A change whose predecessor is not there yet waits for it a moment
(``catalog_gap_wait_s``: two processes may commit v and v+1 and publish out of order);
one that still cannot be appended, or finds a newer version there (Redis lost its data,
or a writer died between commit and publication), publishes the whole catalog from the
database under a new version instead. Every ``catalog_snapshot_every`` changes the
snapshot for new readers is rewritten from the old one and the log, so its cost is
amortised over the changes.
"""

from __future__ import annotations

import json
import secrets
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime
from typing import Any, cast

import redis
import structlog
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from core.catalog_log import Appended, CatalogLog
from core.redis_schema import RedisKeys, seen_bucket
from core.settings import Settings
from core.streams import StreamSchema
from evaluator.catalog import Catalog, CatalogChange, rewritten_snapshot
from evaluator.spec import Condition, SubscriptionSpec
from evaluator.streams import StreamShape, refusal
from subscriptions.accounts import lock_owner
from subscriptions.channel_kinds import UnknownKindError, endpoint_kind, secret_kinds
from subscriptions.errors import FieldError, Forbidden, NotFound
from subscriptions.language import ConditionError, Filtered, check_window, combine_keys, format_condition, parse_filtered
from subscriptions.models import CatalogVersion, Endpoint, Subscription, User
from subscriptions.policy import AlertPolicy
from subscriptions.schemas import EndpointIn, SubscriptionIn
from subscriptions.streams import StreamService
from subscriptions.templating import MessageTemplateError, TemplateLimits, check_template

log = structlog.get_logger("subscriptions")

_GAP_POLLS = 50  # how many times a change looks for its predecessor within catalog_gap_wait_s


def publish_catalog(client: redis.Redis, keys: RedisKeys, catalog: Catalog) -> bool:
    """Publish ``catalog`` whole for the evaluator unless Redis already holds a newer version."""
    return CatalogLog(client, keys).publish_snapshot(catalog.version, catalog.encode())


def subscription_spec(subscription: Subscription) -> SubscriptionSpec:
    """What the evaluator is told of a subscription: its stream and filters travel in its condition, its key
    list (the ``keys`` field and the condition's ``key IN``, combined when saved) in ``keys``."""
    return SubscriptionSpec(
        id=subscription.id,
        condition=Condition.from_dict(subscription.condition_spec),
        keys=frozenset(subscription.keys) if subscription.keys is not None else None,
        text=subscription.condition,
    )


class CatalogPublisher:
    """The versioned catalog of every user's active subscriptions, as the evaluator reads it."""

    def __init__(self, session: Session, settings: Settings, redis_client: redis.Redis) -> None:
        self.session = session
        self.settings = settings
        self.redis = redis_client
        self.keys = RedisKeys(settings)
        self.log = CatalogLog(redis_client, self.keys, settings.catalog_snapshot_every)

    def _bump(self, at_least: int = 0) -> int:
        """A new catalog version in the session's transaction; the row lock orders concurrent writers."""
        row = self.session.get(CatalogVersion, 1, with_for_update=True)
        if row is None:
            row = CatalogVersion(id=1, version=0)
            self.session.add(row)
        row.version = max(row.version, at_least) + 1
        self.session.flush()
        return row.version

    def commit_change(self, subscription: Subscription, removed: bool = False) -> None:
        """Commit the session's change to ``subscription`` with a new catalog version, then publish that change."""
        version = self._bump()
        if not removed:
            subscription.catalog_version = version  # its page tells the shards that have read it (web.admission)
        if subscription.active and not removed:
            change = CatalogChange(version, upserts=(subscription_spec(subscription),))
        else:
            change = CatalogChange(version, removals=(subscription.id,))
        self.session.commit()
        self.publish_change(change)

    def publish_change(self, change: CatalogChange) -> None:
        """Append ``change`` to the log (waiting a moment for its predecessor), else publish the whole catalog."""
        payload = change.encode()
        deadline = time.monotonic() + self.settings.catalog_gap_wait_s
        status, snapshot_version = self.log.append(change.version, payload)
        while status is Appended.GAP and time.monotonic() < deadline:
            time.sleep(self.settings.catalog_gap_wait_s / _GAP_POLLS)
            status, snapshot_version = self.log.append(change.version, payload)
        if status is not Appended.APPENDED:
            log.info("catalog_change_not_appended", version=change.version, outcome=status.name)
            self.resnapshot()
            return
        since = change.version - snapshot_version
        if since >= self.settings.catalog_snapshot_every and since % self.settings.catalog_snapshot_every == 0:
            self.rewrite_snapshot()

    def rewrite_snapshot(self) -> bool:
        """Bring the snapshot forward by the log (no database read): what new or lagging readers start from."""
        read = self.log.read_with_snapshot()
        version, snapshot = rewritten_snapshot(read.snapshot, read.entries)
        return version > read.snapshot_version and self.log.publish_snapshot(version, snapshot, rewrite=True)

    def resnapshot(self) -> bool:
        """Publish the whole catalog from the database under a version newer than any Redis holds.

        The version is bumped so the read is consistent on every database (the row lock, a write
        transaction on SQLite) and so the snapshot is newer than every change published before it.
        """
        version = self._bump(at_least=self.log.version())
        catalog = self.catalog(version)
        self.session.commit()
        return self.publish(catalog)

    def catalog(self, version: int) -> Catalog:
        """Every active subscription, read from the database: O(subscriptions), for whole snapshots only."""
        active = self.session.scalars(select(Subscription).where(Subscription.active).order_by(Subscription.id))
        return Catalog(version, tuple(subscription_spec(s) for s in active))

    def publish(self, catalog: Catalog) -> bool:
        return publish_catalog(self.redis, self.keys, catalog)

    def republish(self) -> bool:
        """At start-up: publish the whole catalog when Redis does not hold the database's version (it lost its
        data, missed a change, or the database was reset)."""
        row = self.session.get(CatalogVersion, 1)
        version = row.version if row else 0
        self.session.rollback()  # end the read: resnapshot locks the row afresh
        if version == self.log.version():
            return False
        return self.resnapshot()


def _drop_dead_letters(client: redis.Redis, keys: RedisKeys, pipe: redis.client.Pipeline,
                       matches: Callable[[dict], bool]) -> None:
    """Queue, in ``pipe``, the removal of the dead letters ``matches`` picks, with their final-outcome marks."""
    letters = {letter_id: letter for letter_id, raw in client.hscan_iter(keys.dead_letters, count=500)
               if matches(letter := json.loads(raw))}
    if letters:
        pipe.hdel(keys.dead_letters, *letters)
        marks = [keys.delivered(letter["notification"]["notification_id"], letter["endpoint_id"])
                 for letter in letters.values() if letter.get("notification", {}).get("notification_id")]
        for mark in marks:  # one key per DEL: a Redis Cluster's pipelines take no other
            pipe.delete(mark)


def forget_subscription(client: redis.Redis, keys: RedisKeys, subscription_id: int) -> None:
    """Remove every piece of Redis state keyed by a deleted subscription's id.

    Its firing set, history, counters, policy state, sequences and delivery log; the ids of the alerts in its
    history in the sink's seen sets, and their decision marks; and its dead letters (replaying one would deliver an alert of a
    subscription that no longer exists). Its delivery lines (``notifier.order``), keyed by endpoint and key
    too, expire 30 days after their last use. The evaluator forgets its own firing state when the next
    catalog lacks the id; ids are never reused, so nothing can inherit any of it.
    """
    history = keys.history(subscription_id)
    decisions: list[str] = []
    seen: dict[str, list[str]] = defaultdict(list)  # the sink's seen sets: the ids to remove from each
    entries = cast("list[tuple[object, dict[Any, Any]]]", client.xrange(history))  # a sync client: a list, never None
    for _, fields in entries:
        alert = json.loads(fields.get("alert") or fields[b"alert"])
        seen[keys.seen(subscription_id, seen_bucket(int(alert["evaluated_at"])))].append(alert["alert_id"])
        decisions.append(keys.decision(subscription_id, alert["alert_id"]))
    pipe = client.pipeline(transaction=False)
    for key in (keys.firing(subscription_id), keys.key_states(subscription_id), keys.sequences(subscription_id), history,
                keys.counters(subscription_id), keys.delivery_log(subscription_id), *decisions):
        pipe.delete(key)  # one key per DEL: a Redis Cluster's pipelines take no other
    for key, ids in seen.items():
        pipe.srem(key, *ids)
    _drop_dead_letters(client, keys, pipe,
                       lambda letter: letter["notification"].get("subscription_id") == subscription_id)
    pipe.execute()


def forget_endpoint(client: redis.Redis, keys: RedisKeys, endpoint_id: int) -> None:
    """Remove a deleted endpoint's delivery log and dead letters.

    Its ``delivered``/``sending`` marks are left to expire: they are keyed by notification, finding
    them would scan the keyspace, and as ids are never reused they can match nothing new. Queued
    deliveries to it are dropped by the worker, which finds no endpoint.
    """
    pipe = client.pipeline(transaction=False)
    pipe.delete(keys.endpoint_log(endpoint_id))
    _drop_dead_letters(client, keys, pipe, lambda letter: letter["endpoint_id"] == endpoint_id)
    pipe.execute()


def checked_condition(text: str, settings: Settings, stream: StreamSchema | None = None) -> Filtered:
    """Parse a condition on ``stream`` (``trades`` when None) and check it against what the evaluator keeps
    (pane width, horizon); with the keys its ``key IN`` lists."""
    filtered = parse_filtered(text, stream)
    check_window(filtered.condition, settings.pane_ms, settings.max_window_ms, settings.quantile_max_window_ms,
                 settings.tuple_max_events)
    # What the evaluator would leave out (and so never alert on) is refused here, not stored silently.
    why = refusal(filtered.condition, StreamShape.of(stream) if stream is not None else None)
    if why is not None:
        raise ConditionError(f"the evaluator cannot evaluate it: {why}")
    return filtered


def stream_schema(session: Session, settings: Settings, name: str) -> StreamSchema:
    """The declared schema of stream ``name``, or a FieldError on ``stream`` naming the streams there are."""
    streams = StreamService(session, settings)
    try:
        return streams.schema_of(streams.get(name))
    except NotFound:
        names = ", ".join(s.name for s in streams.streams())
        raise FieldError("stream", f"no stream named {name!r}; the streams are {names}") from None


class SubscriptionService:
    """One user's subscriptions and endpoints. Every query is filtered by owner."""

    def __init__(self, session: Session, settings: Settings, redis_client: redis.Redis, owner: User) -> None:
        self.session = session
        self.settings = settings
        self.redis = redis_client
        self.owner = owner
        self.keys = RedisKeys(settings)
        self.catalogs = CatalogPublisher(session, settings, redis_client)

    def _count(self, model: type[Endpoint] | type[Subscription]) -> int:
        return self.session.scalar(select(func.count()).select_from(model).where(model.owner_id == self.owner.id)) or 0

    # -- endpoints -----------------------------------------------------------------

    def create_endpoint(self, data: EndpointIn) -> Endpoint:
        lock_owner(self.session, self.owner.id)  # the count and the insert are one step: no parallel overshoot
        if self._count(Endpoint) >= self.settings.user_max_endpoints:
            raise Forbidden(f"limit reached: at most {self.settings.user_max_endpoints} endpoints per user")
        kind = endpoint_kind(data.kind)
        secret = data.secret or (secrets.token_urlsafe(32) if kind.has_secret else None)
        endpoint = Endpoint(owner_id=self.owner.id, kind=data.kind, target=data.target,
                            template=self._template(data.template))
        endpoint.set_secret(self.settings, secret)
        self.session.add(endpoint)
        self.session.commit()
        if kind.secret_required:  # the user's own key (a routing key): stored sealed, never shown back
            endpoint.secret = None
        return endpoint

    def _template(self, template: str | None) -> str | None:
        """The template as stored, once the sandbox accepts it (422 on ``template`` with the line, if not)."""
        if template is None:
            return None
        try:
            check_template(template, TemplateLimits.from_settings(self.settings))
        except MessageTemplateError as exc:
            raise FieldError("template", str(exc)) from None
        return template

    def set_template(self, endpoint_id: int, template: str | None) -> Endpoint:
        """A new message template (None: the channel's own message); deliveries already queued use it too."""
        endpoint = self.get_endpoint(endpoint_id)
        try:
            kind = endpoint_kind(endpoint.kind)
        except UnknownKindError as exc:  # stored, but no channel serves it any more
            raise FieldError("kind", str(exc)) from None
        if template is not None and kind.template_use is None:
            raise FieldError("template", f"{kind.label} endpoints take no message template")
        endpoint.template = self._template(template)
        self.session.commit()
        return endpoint

    def list_endpoints(self) -> list[Endpoint]:
        return list(self.session.scalars(
            select(Endpoint).where(Endpoint.owner_id == self.owner.id).order_by(Endpoint.id)))

    def get_endpoint(self, endpoint_id: int) -> Endpoint:
        endpoint = self.session.get(Endpoint, endpoint_id)
        if endpoint is None or endpoint.owner_id != self.owner.id:
            raise NotFound(f"endpoint {endpoint_id} not found")
        return endpoint

    def rotate_secret(self, endpoint_id: int) -> Endpoint:
        """A new signing secret for an endpoint of a kind that signs; the old one stops working at once."""
        endpoint = self.get_endpoint(endpoint_id)
        if endpoint.kind not in secret_kinds():
            raise FieldError("kind", f"only {' and '.join(secret_kinds())} endpoints have a secret Tocsin can rotate")
        endpoint.set_secret(self.settings, secrets.token_urlsafe(32))
        self.session.commit()
        return endpoint

    def delete_endpoint(self, endpoint_id: int) -> None:
        self.session.delete(self.get_endpoint(endpoint_id))
        self.session.commit()
        forget_endpoint(self.redis, self.keys, endpoint_id)

    # -- subscriptions ---------------------------------------------------------------

    def _condition(self, text: str, stream: StreamSchema) -> Filtered:
        try:
            return checked_condition(text, self.settings, stream)
        except ConditionError as exc:
            raise FieldError("condition", str(exc)) from None

    def _endpoints(self, ids: list[int]) -> list[Endpoint]:
        found = list(self.session.scalars(
            select(Endpoint).where(Endpoint.id.in_(ids), Endpoint.owner_id == self.owner.id))) if ids else []
        missing = sorted(set(ids) - {e.id for e in found})
        if missing:
            raise NotFound(f"endpoints not found: {missing}")
        return found

    def create(self, data: SubscriptionIn) -> Subscription:
        lock_owner(self.session, self.owner.id)
        if self._count(Subscription) >= self.settings.user_max_subscriptions:
            raise Forbidden(f"limit reached: at most {self.settings.user_max_subscriptions} subscriptions per user")
        subscription = Subscription(owner_id=self.owner.id)
        self._assign(subscription, data)
        self.session.add(subscription)
        self.catalogs.commit_change(subscription)
        return subscription

    def update(self, subscription_id: int, data: SubscriptionIn) -> Subscription:
        subscription = self.get(subscription_id)
        self._assign(subscription, data)
        self.catalogs.commit_change(subscription)
        return subscription

    def _assign(self, subscription: Subscription, data: SubscriptionIn) -> None:
        filtered = self._condition(data.condition, stream_schema(self.session, self.settings, data.stream))
        condition = filtered.condition
        if condition.rank is not None:
            self._check_ranks(subscription.id)
        limit = self.settings.subscription_max_keys
        if data.keys is not None and len(data.keys) > limit:  # every evaluator worker holds the whole catalog
            raise FieldError("keys", f"at most {limit} keys per subscription (null watches every key)")
        try:
            keys = combine_keys(data.keys, filtered.keys, condition.key_prefix)  # key IN (...) restricts the keys too: those in both
        except ConditionError as exc:
            raise FieldError("keys", str(exc)) from None
        if keys is not None and len(keys) > limit:
            raise FieldError("condition", f"at most {limit} keys per subscription (key IN lists {len(keys)})")
        subscription.name = data.name
        subscription.condition = format_condition(condition)
        subscription.condition_spec = condition.to_dict()
        subscription.keys = keys
        subscription.active = data.active
        subscription.policy = data.policy.model_dump(mode="json")
        subscription.endpoints = self._endpoints(data.endpoint_ids)

    def _check_ranks(self, subscription_id: int | None) -> None:
        """Forbidden if the user has ``user_max_ranks`` rank subscriptions besides this one (None: a new one)."""
        lock_owner(self.session, self.owner.id)  # the count and the write are one step: no parallel overshoot
        specs = self.session.execute(select(Subscription.id, Subscription.condition_spec)
                                     .where(Subscription.owner_id == self.owner.id)).all()
        ranks = sum(1 for sid, spec in specs if sid != subscription_id and (spec or {}).get("rank"))
        if ranks >= self.settings.user_max_ranks:
            raise Forbidden(f"limit reached: at most {self.settings.user_max_ranks} rank subscriptions (IN TOP / "
                            "BOTTOM k) per user")

    def set_active(self, subscription_id: int, active: bool) -> Subscription:
        subscription = self.get(subscription_id)
        subscription.active = active
        self.catalogs.commit_change(subscription)
        return subscription

    def set_muted(self, subscription_id: int, until: datetime | None) -> Subscription:
        """Mute notifications until ``until`` (None unmutes); evaluation goes on, so nothing is missed."""
        subscription = self.get(subscription_id)
        policy = AlertPolicy.model_validate(subscription.policy or {})
        subscription.policy = policy.model_copy(update={"muted_until": until}).model_dump(mode="json")
        self.session.commit()  # the evaluator does not read policies: no new catalog
        return subscription

    def delete(self, subscription_id: int) -> None:
        subscription = self.get(subscription_id)
        self.session.delete(subscription)
        self.catalogs.commit_change(subscription, removed=True)
        forget_subscription(self.redis, self.keys, subscription_id)

    def get(self, subscription_id: int) -> Subscription:
        subscription = self.session.get(Subscription, subscription_id)
        if subscription is None or subscription.owner_id != self.owner.id:
            raise NotFound(f"subscription {subscription_id} not found")
        return subscription

    def list(self) -> list[Subscription]:
        return list(self.session.scalars(
            select(Subscription).where(Subscription.owner_id == self.owner.id).order_by(Subscription.id)))
