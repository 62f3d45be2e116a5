"""Declared streams in the database, their Kafka topics, and the publisher tokens scoped to them.

Operators declare streams (API, admin CLI); each maps onto a Kafka topic created
with the stream's partitions and retention (``core.streams.topic_name``). The
built-in ``trades`` stream is declared on first use of a new database and keeps
``settings.events_topic``, so everything reading that topic today is unchanged.

A change to a declared stream goes through ``core.streams.check_compatible`` with
the fields each subscription on the stream uses (:func:`fields_used`); a subscription's stream is
its condition's (:func:`stream_of`, ``trades`` by default).

Every change (and, in each process, the first use and any use after Redis lost the registry or was
down) rewrites the *stream registry* in Redis (:func:`publish_registry`): the evaluator starts, stops
and restarts its per-stream queries from it (docs/evaluator-streams.md). The database is the truth:
Redis being down fails no stream operation; the registry is written again by the next service call
once Redis answers (at most every ``REGISTRY_CHECK_S`` per process).

Publisher tokens are made by operators only: a token publishes to the streams it
names and is refused by every other API (``web.deps``). Like API tokens, only the
SHA-256 is stored and the token is shown once.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta

import structlog
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError, UnknownTopicOrPartitionError
from redis import Redis, RedisError
from sqlalchemy import delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from core.redis_client import make_redis
from core.redis_schema import RedisKeys
from core.series_limit import SeriesLimit
from core.settings import Settings
from core.streams import (
    TRADES,
    Attribute,
    IncompatibleChange,
    StreamSchema,
    check_compatible,
    topic_name,
    trades_schema,
)
from core.timestamps import as_utc
from evaluator.spec import Condition
from subscriptions.accounts import _digest as token_digest
from subscriptions.errors import Conflict, Forbidden, NotFound
from subscriptions.models import PublisherToken, Stream, Subscription, User

log = structlog.get_logger(__name__)

PUBLISHER_PREFIX = "tcp_"  # publisher tokens are recognisable, and told from API tokens (``tcs_``)


class TopicError(RuntimeError):
    """Kafka did not create or delete a stream's topic; nothing was changed in the database."""


def stream_of(subscription: Subscription) -> str:
    """The stream a subscription evaluates: its condition's (``trades`` for conditions saved before streams)."""
    return Condition.from_dict(subscription.condition_spec).stream


def fields_used(subscription: Subscription) -> set[str]:
    """The stream fields a subscription's condition names: attributes it aggregates or compares with, and the
    dimensions its WHERE clause filters on."""
    condition = Condition.from_dict(subscription.condition_spec)
    used = {term.attribute for term in condition.terms if term.attribute}
    if condition.percent_of:
        used.add(condition.percent_of)
    used.update(dimension for dimension, _ in condition.where)
    return used


def _admin(settings: Settings) -> KafkaAdminClient:
    """An admin client that gives up within the request timeout when Kafka is down (an operator is waiting)."""
    try:
        return KafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap,
                                request_timeout_ms=settings.kafka_request_timeout_ms,
                                bootstrap_timeout_ms=settings.kafka_request_timeout_ms)
    except KafkaError as exc:
        raise TopicError(f"Kafka is not reachable at {settings.kafka_bootstrap}: {exc}") from exc


def create_topic(settings: Settings, schema: StreamSchema) -> None:
    """The stream's topic with its partitions and retention (an existing topic is kept as it is), and the
    dead-letter topic its rejects go to."""
    admin = _admin(settings)
    try:
        topic = topic_name(schema.name, settings)
        existing = set(admin.list_topics())
        if topic in existing:
            log.info("stream_topic_exists", stream=schema.name, topic=topic)
        wanted = [NewTopic(topic, schema.partitions, 1, topic_configs={"retention.ms": str(schema.retention_ms)})
                  if name == topic else NewTopic(name, 1, 1)
                  for name in (topic, settings.dead_letter_topic) if name not in existing]
        if wanted:
            with contextlib.suppress(TopicAlreadyExistsError):  # made by another process meanwhile
                admin.create_topics(wanted)
    except KafkaError as exc:
        raise TopicError(f"Kafka refused to create the topic of {schema.name!r}: {exc}") from exc
    finally:
        admin.close()


def delete_topic(settings: Settings, name: str) -> None:
    admin = _admin(settings)
    try:
        admin.delete_topics([topic_name(name, settings)])
    except UnknownTopicOrPartitionError:
        pass
    except KafkaError as exc:
        raise TopicError(f"Kafka refused to delete the topic of {name!r}: {exc}") from exc
    finally:
        admin.close()


REGISTRY_CHECK_S = 5.0  # how often a process checks that Redis still holds the registry (or retries writing it)
REGISTRY_TIMEOUT_S = 0.5  # a Redis that does not answer within this costs a stream operation no more


def publish_registry(client: Redis, keys: RedisKeys, schemas: Iterable[StreamSchema],
                     ids: Mapping[str, int] | None = None) -> int:
    """Rewrite the stream registry (name -> schema JSON, and name -> row id) and bump its version, in one
    transaction; the version. The id tells the evaluator a stream deleted and declared again (same name, new row:
    ids are never reused) from the one it knew, so its query starts clean (``evaluator.spark.registry``)."""
    mapping = {schema.name: schema.model_dump_json() for schema in schemas}
    pipe = client.pipeline(transaction=True)
    pipe.delete(keys.stream_schemas, keys.stream_ids)
    if mapping:
        pipe.hset(keys.stream_schemas, mapping=mapping)  # type: ignore[arg-type]  # str -> str
    if ids:
        pipe.hset(keys.stream_ids, mapping=dict(ids))  # type: ignore[arg-type]  # str -> int
    pipe.incr(keys.streams_version)
    return int(pipe.execute()[-1])


_CLIENTS: dict[tuple[str, bool], Redis] = {}


def _registry_client(settings: Settings) -> Redis:
    """One client per Redis, with short timeouts: a Redis that is down delays a stream operation briefly only."""
    where = (settings.redis_url, settings.redis_cluster)
    if where not in _CLIENTS:
        _CLIENTS[where] = make_redis(settings, socket_timeout=REGISTRY_TIMEOUT_S,
                                     socket_connect_timeout=REGISTRY_TIMEOUT_S)
    return _CLIENTS[where]


#: Per Redis and key space, in this process: whether the registry is known to be written, and when that was checked.
_REGISTRY: dict[tuple[str, str], tuple[bool, float]] = {}



class StreamService:
    """Streams and publisher tokens; every method commits its own change."""

    def __init__(self, session: Session, settings: Settings) -> None:
        self.session = session
        self.settings = settings

    # -- streams -----------------------------------------------------------------------------------------------

    def ensure_builtin(self) -> None:
        """Declare ``trades`` on a database that has no such stream yet (its topic is the events topic), and
        make sure Redis holds the stream registry (see :meth:`sync_registry`)."""
        if self.session.scalar(select(Stream.id).where(Stream.name == TRADES)) is None:
            schema = trades_schema(self.settings)
            self.session.add(Stream(name=TRADES, topic=topic_name(TRADES, self.settings),
                                    schema=schema.model_dump(mode="json")))
            try:
                self.session.commit()
            except IntegrityError:  # another process declared it meanwhile
                self.session.rollback()
        self.sync_registry()

    def publish_registry(self) -> bool:
        """Write every declared stream's schema to the registry; False (logged) when Redis did not answer."""
        streams = list(self.session.scalars(select(Stream).order_by(Stream.name)))
        schemas = [self.schema_of(s) for s in streams]
        space = (self.settings.redis_url, self.settings.redis_key())
        try:
            version = publish_registry(_registry_client(self.settings), RedisKeys(self.settings), schemas,
                                       {s.name: s.id for s in streams})
        except RedisError as exc:
            _REGISTRY[space] = (False, time.monotonic())
            log.warning("stream_registry_not_published", reason=f"{type(exc).__name__}: {exc}",
                        retry_within_s=REGISTRY_CHECK_S)
            return False
        _REGISTRY[space] = (True, time.monotonic())
        log.info("stream_registry_published", version=version, streams=len(schemas))
        return True

    def sync_registry(self) -> None:
        """Publish the registry on this process's first use, after a failed write, or when Redis lost it (checked at
        most every ``REGISTRY_CHECK_S``)."""
        space = (self.settings.redis_url, self.settings.redis_key())
        written, checked = _REGISTRY.get(space, (False, -REGISTRY_CHECK_S))
        if written and time.monotonic() - checked < REGISTRY_CHECK_S:
            return
        if not written and space in _REGISTRY and time.monotonic() - checked < REGISTRY_CHECK_S:
            return  # Redis failed lately: retry later, not on every call
        if written:
            try:
                present = bool(_registry_client(self.settings).exists(RedisKeys(self.settings).streams_version))
            except RedisError:
                present = False
            if present:
                _REGISTRY[space] = (True, time.monotonic())
                return
        self.publish_registry()

    def streams(self) -> list[Stream]:
        self.ensure_builtin()
        return list(self.session.scalars(select(Stream).order_by(Stream.name)))

    def get(self, name: str) -> Stream:
        self.ensure_builtin()
        stream = self.session.scalar(select(Stream).where(Stream.name == name))
        if stream is None:
            raise NotFound(f"no stream named {name!r}")
        return stream

    @staticmethod
    def schema_of(stream: Stream) -> StreamSchema:
        return StreamSchema.model_validate(stream.schema)

    def create(self, schema: StreamSchema) -> Stream:
        """Declare a stream and create its topic (the row is kept only if Kafka made the topic)."""
        self.ensure_builtin()
        if (self.session.scalar(select(func.count()).select_from(Stream)) or 0) >= self.settings.max_streams:
            raise Forbidden(f"limit reached: at most {self.settings.max_streams} streams")
        if self.session.scalar(select(Stream.id).where(Stream.name == schema.name)) is not None:
            raise Conflict(f"a stream named {schema.name!r} exists already")
        stream = Stream(name=schema.name, topic=topic_name(schema.name, self.settings),
                        schema=schema.model_dump(mode="json"))
        self.session.add(stream)
        try:
            self.session.flush()
        except IntegrityError:
            self.session.rollback()
            raise Conflict(f"a stream named {schema.name!r} exists already") from None
        try:
            create_topic(self.settings, schema)
        except TopicError:
            self.session.rollback()
            raise
        self.session.commit()
        log.info("stream_created", stream=schema.name, topic=stream.topic)
        self.publish_registry()
        return stream

    def used_by(self, name: str) -> dict[str, set[str]]:
        """``{"#id name": fields used}`` of every subscription on stream ``name``."""
        subscriptions = self.session.scalars(select(Subscription).order_by(Subscription.id))
        return {f"#{s.id} {s.name}": fields_used(s) for s in subscriptions if stream_of(s) == name}

    def update(self, name: str, schema: StreamSchema) -> Stream:
        """Replace a stream's schema with a compatible one (``IncompatibleChange`` otherwise)."""
        stream = self.get(name)
        if name == TRADES and schema != self.schema_of(stream):
            raise IncompatibleChange("the built-in 'trades' stream's schema is fixed (the evaluator's trades path is "
                                     "built for it): declare a stream of your own for other attributes")
        check_compatible(self.schema_of(stream), schema, self.used_by(name))
        stream.schema = schema.model_dump(mode="json")
        stream.version += 1
        self.session.commit()
        log.info("stream_changed", stream=name, version=stream.version)
        self.publish_registry()
        return stream

    def add_attribute(self, name: str, attribute: Attribute) -> Stream:
        """Add one attribute (it must be optional: producers that do not send it yet stay accepted)."""
        schema = self.schema_of(self.get(name))
        return self.update(name, StreamSchema.model_validate(
            {**schema.model_dump(), "attributes": (*schema.attributes, attribute)}))

    def remove_attribute(self, name: str, attribute: str) -> Stream:
        """Remove one attribute (refused, listing them, while subscriptions use it)."""
        schema = self.schema_of(self.get(name))
        kept = tuple(a for a in schema.attributes if a.name != attribute)
        if len(kept) == len(schema.attributes):
            raise NotFound(f"stream {name!r} has no attribute {attribute!r}")
        return self.update(name, StreamSchema.model_validate({**schema.model_dump(), "attributes": kept}))

    def delete(self, name: str) -> None:
        """Remove a stream no subscription uses, and its topic (records on it are gone)."""
        stream = self.get(name)
        if name == TRADES:
            raise IncompatibleChange("the built-in 'trades' stream cannot be deleted")
        users = sorted(self.used_by(name))
        if users:
            raise IncompatibleChange(f"stream {name!r} is used by subscriptions: {', '.join(users)}", users)
        delete_topic(self.settings, name)
        self.session.delete(stream)
        self.session.commit()
        log.info("stream_deleted", stream=name)
        try:  # a stream declared again under this name starts with no series counted against its limit
            SeriesLimit(_registry_client(self.settings), self.settings).forget(name)
        except RedisError as exc:  # they leave by themselves once older than the horizon
            log.warning("stream_series_not_forgotten", stream=name, reason=f"{type(exc).__name__}: {exc}")
        self.publish_registry()

    # -- publisher tokens --------------------------------------------------------------------------------------

    def create_token(self, name: str, streams: Sequence[str], creator: User | None) -> tuple[str, PublisherToken]:
        """A token that may publish to ``streams`` (shown once) and its row."""
        if not streams:
            raise ValueError("a publisher token needs at least one stream")
        count = self.session.scalar(select(func.count()).select_from(PublisherToken)) or 0
        if count >= self.settings.publisher_max_tokens:
            raise Forbidden(f"limit reached: at most {self.settings.publisher_max_tokens} publisher tokens")
        rows = [self.get(stream) for stream in dict.fromkeys(streams)]
        token = PUBLISHER_PREFIX + secrets.token_urlsafe(32)
        row = PublisherToken(name=name, token_hash=token_digest(token), prefix=token[:10],
                             created_by=creator.id if creator else None, streams=rows)
        self.session.add(row)
        self.session.commit()
        return token, row

    def tokens(self) -> list[PublisherToken]:
        return list(self.session.scalars(select(PublisherToken).order_by(PublisherToken.id)))

    def revoke_token(self, token_id: int) -> None:
        if not self.session.execute(delete(PublisherToken).where(PublisherToken.id == token_id)).rowcount:  # type: ignore[attr-defined]
            raise NotFound(f"publisher token {token_id} not found")
        self.session.commit()

    def publisher(self, token: str) -> PublisherToken | None:
        """The publisher token ``token`` is, if any (its use is noted at most once a minute)."""
        row = self.session.scalar(select(PublisherToken).where(PublisherToken.token_hash == token_digest(token)))
        if row is None:
            return None
        now = datetime.now(UTC)
        if row.last_used_at is None or now - as_utc(row.last_used_at) > timedelta(minutes=1):
            row.last_used_at = now
            self.session.commit()
        return row


def parse_schema(data: dict, settings: Settings) -> StreamSchema:
    """A schema from operator input, with the deployment's defaults for retention and partitions."""
    defaults = {"retention_ms": settings.stream_default_retention_ms, "partitions": settings.event_partitions}
    return StreamSchema.model_validate({**defaults, **{k: v for k, v in data.items() if v is not None}})
