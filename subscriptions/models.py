"""Persistent subscriptions and delivery endpoints."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import JSON, Boolean, Column, DateTime, ForeignKey, Integer, String, Table, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    pass


subscription_endpoints = Table(
    "subscription_endpoints",
    Base.metadata,
    Column("subscription_id", ForeignKey("subscriptions.id", ondelete="CASCADE"), primary_key=True),
    Column("endpoint_id", ForeignKey("endpoints.id", ondelete="CASCADE"), primary_key=True),
)


class Endpoint(Base):
    """Where alerts go: a webhook URL whose requests are signed with ``secret``, or an e-mail address."""

    __tablename__ = "endpoints"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    target: Mapped[str] = mapped_column(String(2048))
    secret: Mapped[str | None] = mapped_column(String(128), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Subscription(Base):
    __tablename__ = "subscriptions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    condition: Mapped[str] = mapped_column(Text)  # canonical text
    condition_spec: Mapped[dict] = mapped_column(JSON)
    keys: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)  # None: every key
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    policy: Mapped[dict] = mapped_column(JSON, default=dict)  # notifier.policy.AlertPolicy
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)
    endpoints: Mapped[list[Endpoint]] = relationship(secondary=subscription_endpoints, lazy="selectin")


class CatalogVersion(Base):
    """A single row whose version increases with every subscription change.

    Bumping it inside the changing transaction serialises writers, so the
    snapshots published to the evaluator are totally ordered.
    """

    __tablename__ = "catalog_version"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[int] = mapped_column(Integer, default=0)
