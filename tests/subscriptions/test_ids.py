"""Ids are never reused, on SQLite and PostgreSQL: state keyed by a deleted row's id never meets a new row."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from subscriptions.db import session_factory
from subscriptions.models import ApiToken, Endpoint, Subscription, User
from tests.databases import postgres_database


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ids.db'}"
    else:
        with postgres_database() as url:
            yield url


def _user() -> User:
    return User(email=f"{uuid.uuid4().hex[:10]}@example.com", password_hash="x")


def _rows(owner: User) -> dict[type, callable]:
    return {
        User: _user,
        ApiToken: lambda: ApiToken(user_id=owner.id, name="t", token_hash=uuid.uuid4().hex, prefix="p"),
        Endpoint: lambda: Endpoint(owner_id=owner.id, kind="email", target="a@example.com"),
        Subscription: lambda: Subscription(owner_id=owner.id, name="s", condition="COUNT OVER 1s > 1",
                                           condition_spec={}, keys=None, policy={}),
    }


def test_deleting_the_newest_row_never_frees_its_id(database_url: str) -> None:
    with session_factory(database_url)() as session:
        owner = _user()
        session.add(owner)
        session.commit()
        for model, make in _rows(owner).items():
            row = make()
            session.add(row)
            session.commit()
            deleted = row.id
            session.delete(row)
            session.commit()
            again = make()
            session.add(again)
            session.commit()
            assert again.id > deleted, f"{model.__tablename__} reused id {deleted}"


def test_the_database_is_created_with_a_deployment_id_every_process_reads(database_url: str) -> None:
    from core.settings import Settings
    from subscriptions.db import deployment_id

    settings = Settings(database_url=database_url)
    assert settings.redis_key("alerts") == f"{settings.redis_prefix}:{deployment_id(database_url)}:alerts"
    assert settings.to_env()["TOCSIN_DEPLOYMENT_ID"] == settings.deployment  # children need no lookup
    assert Settings(database_url=database_url).deployment == settings.deployment
    pinned = Settings(database_url=database_url, deployment_id="elsewhere")
    assert pinned.redis_key("alerts") == f"{settings.redis_prefix}:elsewhere:alerts"
