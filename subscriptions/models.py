"""Persistent users, their subscriptions and delivery endpoints."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import JSON, Boolean, Column, DateTime, ForeignKey, Integer, String, Table, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from core.settings import Settings
from core.text import MAX_NAME_LENGTH
from subscriptions import vault

ROLES = ("user", "operator")

#: Ids of these tables reach Redis keys, queued deliveries and the evaluator's state, so a deleted row's id is
#: never handed out again: AUTOINCREMENT on SQLite (PostgreSQL's sequences never go back).
NEVER_REUSE_IDS = {"sqlite_autoincrement": True}


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    pass


class User(Base):
    """A subscriber. ``operator`` users also see the platform's load and handle dead letters."""

    __tablename__ = "users"
    __table_args__ = NEVER_REUSE_IDS

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    email: Mapped[str] = mapped_column(String(320), unique=True)  # stored lower-cased
    password_hash: Mapped[str] = mapped_column(String(256))
    role: Mapped[str] = mapped_column(String(16), default="user")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    @property
    def is_operator(self) -> bool:
        return self.role == "operator"


class ApiToken(Base):
    """A bearer token for the HTTP API; only its SHA-256 is stored, the token is shown once."""

    __tablename__ = "api_tokens"
    __table_args__ = NEVER_REUSE_IDS

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(MAX_NAME_LENGTH))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))  # the first characters, to tell tokens apart
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    user: Mapped[User] = relationship(lazy="joined")


class WebSession(Base):
    """A browser session: the cookie holds a random token whose SHA-256 is the id, plus its CSRF token."""

    __tablename__ = "web_sessions"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    csrf_token: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    user: Mapped[User] = relationship(lazy="joined")


subscription_endpoints = Table(
    "subscription_endpoints",
    Base.metadata,
    Column("subscription_id", ForeignKey("subscriptions.id", ondelete="CASCADE"), primary_key=True),
    Column("endpoint_id", ForeignKey("endpoints.id", ondelete="CASCADE"), primary_key=True),
)


class Endpoint(Base):
    """Where alerts go: a webhook URL whose requests are signed with a secret, or an e-mail address.

    The secret is stored encrypted (``subscriptions.vault``); :meth:`signing_secret` is the one place
    that decrypts it. ``secret`` holds the plaintext only on the object that created or rotated it,
    so that it can be shown once.
    """

    __tablename__ = "endpoints"
    __table_args__ = NEVER_REUSE_IDS

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    target: Mapped[str] = mapped_column(String(2048))
    secret_encrypted: Mapped[str | None] = mapped_column(String(512), nullable=True)
    template: Mapped[str | None] = mapped_column(Text, nullable=True)  # the message template; None: the channel's own
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    secret = None  # not stored: the new plaintext, on the object that set it (str | None)

    def set_secret(self, settings: Settings, secret: str | None) -> None:
        self.secret = secret
        self.secret_encrypted = vault.seal(settings, secret) if secret is not None else None

    def signing_secret(self, settings: Settings) -> str | None:
        """The webhook secret in plaintext, for the notifier to sign with."""
        return vault.reveal(settings, self.secret_encrypted) if self.secret_encrypted is not None else None


class Subscription(Base):
    __tablename__ = "subscriptions"
    __table_args__ = NEVER_REUSE_IDS

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(MAX_NAME_LENGTH))
    condition: Mapped[str] = mapped_column(Text)  # canonical text
    condition_spec: Mapped[dict] = mapped_column(JSON)
    keys: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)  # None: every key
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    policy: Mapped[dict] = mapped_column(JSON, default=dict)  # subscriptions.policy.AlertPolicy
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)
    # The catalog version of its last change (None: made before versions were kept here): a shard that evaluated an
    # older catalog has not evaluated it as it is (web.admission)
    catalog_version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    endpoints: Mapped[list[Endpoint]] = relationship(secondary=subscription_endpoints, lazy="selectin")


class Silence(Base):
    """Alertmanager-style silence: alerts of ``owner_id``'s subscriptions that match every matcher are not notified
    from ``starts_at`` until ``ends_at`` (or until expired by hand), and each is logged as a suppression naming it.

    ``matchers`` is a list of ``{"name": ..., "op": ..., "value": ...}`` (validated by the API schema), so new
    matcher names need no migration.
    """

    __tablename__ = "silences"
    __table_args__ = NEVER_REUSE_IDS

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    created_by: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"), nullable=True)
    comment: Mapped[str] = mapped_column(Text)
    matchers: Mapped[list[dict]] = mapped_column(JSON)
    starts_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    ends_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    expired_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)  # ended by hand


class CatalogVersion(Base):
    """A single row whose version increases with every subscription change.

    Bumping it inside the changing transaction serialises writers, so the
    snapshots published to the evaluator are totally ordered.
    """

    __tablename__ = "catalog_version"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[int] = mapped_column(Integer, default=0)


class Invitation(Base):
    """An operator's single-use, expiring invitation to sign up with a role; only the token's SHA-256 is stored."""

    __tablename__ = "invitations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    role: Mapped[str] = mapped_column(String(16))
    created_by: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class Deployment(Base):
    """The one row naming this database's deployment; Redis keys are namespaced by it.

    Created with the database (migration ``0002_state``), so a fresh database on an old
    Redis, or two deployments sharing one Redis, never see each other's state.
    """

    __tablename__ = "deployment"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    deployment_id: Mapped[str] = mapped_column(String(32), unique=True)


class Stream(Base):
    """A declared stream (``core.streams.StreamSchema``, kept whole as JSON in ``schema``) and its Kafka topic.

    ``version`` grows with every accepted change, so readers (the evaluator, publishers' caches) can tell a
    schema they hold from the current one.
    """

    __tablename__ = "streams"
    __table_args__ = NEVER_REUSE_IDS

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(63), unique=True)
    topic: Mapped[str] = mapped_column(String(255))
    schema: Mapped[dict] = mapped_column(JSON)
    version: Mapped[int] = mapped_column(Integer, default=1)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)


publisher_token_streams = Table(
    "publisher_token_streams",
    Base.metadata,
    Column("token_id", ForeignKey("publisher_tokens.id", ondelete="CASCADE"), primary_key=True),
    Column("stream_id", ForeignKey("streams.id", ondelete="CASCADE"), primary_key=True),
)


class PublisherToken(Base):
    """A bearer token that may publish to its streams and do nothing else; only its SHA-256 is stored."""

    __tablename__ = "publisher_tokens"
    __table_args__ = NEVER_REUSE_IDS

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(MAX_NAME_LENGTH))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_by: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    streams: Mapped[list[Stream]] = relationship(secondary=publisher_token_streams, lazy="selectin")
