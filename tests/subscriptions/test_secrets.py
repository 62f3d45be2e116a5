"""Endpoint secrets are encrypted at rest with the settings' key; an old database's secrets are encrypted on upgrade."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic import command
from cryptography.fernet import Fernet
from pydantic import ValidationError
from sqlalchemy import create_engine, text

from core.settings import Settings, get_settings
from subscriptions.db import alembic_config, engine_for, session_factory
from subscriptions.models import Endpoint
from subscriptions.schemas import EndpointIn
from subscriptions.service import SubscriptionService
from subscriptions.vault import SecretKeyError


def test_the_database_holds_no_plaintext_secret(settings: Settings, owner, redis_client) -> None:
    with session_factory(settings.database_url)() as session:
        service = SubscriptionService(session, settings, redis_client, owner)
        given = service.create_endpoint(EndpointIn(kind="webhook", target="https://example.com/h",
                                                   secret="my very own secret value"))
        rotated = service.rotate_secret(service.create_endpoint(
            EndpointIn(kind="webhook", target="https://example.com/h")).id)
        plaintexts = {"my very own secret value", rotated.secret}
    with create_engine(settings.database_url).connect() as connection:
        stored = connection.execute(text("select * from endpoints")).all()
    dump = repr(stored)
    assert not [p for p in plaintexts if p in dump]
    with session_factory(settings.database_url)() as session:
        assert session.get(Endpoint, given.id).signing_secret(settings) == "my very own secret value"
        assert session.get(Endpoint, rotated.id).secret is None  # shown once: only where it was set
        other_key = settings.model_copy(update={"secret_key": None, "data_dir": settings.data_dir / "elsewhere"})
        with pytest.raises(SecretKeyError, match="rotate"):
            session.get(Endpoint, given.id).signing_secret(other_key)


def test_the_local_key_is_generated_once_and_kept(tmp_path: Path) -> None:
    first = Settings(data_dir=tmp_path)
    from subscriptions.vault import secret_key

    key = secret_key(first)
    assert secret_key(Settings(data_dir=tmp_path)) == key
    assert (tmp_path / "secret.key").stat().st_mode & 0o077 == 0
    assert first.to_env()["TOCSIN_SECRET_KEY"] == key  # child processes share it


def test_a_key_that_is_not_a_fernet_key_is_refused_clearly() -> None:
    with pytest.raises(ValidationError, match="Fernet key"):
        Settings(secret_key="hunter2")


def test_upgrading_encrypts_existing_plaintext_secrets_and_keeps_every_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = Fernet.generate_key().decode()
    monkeypatch.setenv("TOCSIN_SECRET_KEY", key)
    get_settings.cache_clear()
    url = f"sqlite:///{tmp_path / 'old.db'}"
    old = create_engine(url)
    with old.begin() as connection:
        command.upgrade(alembic_config(connection), "0001")
        connection.execute(text("insert into users values (1, 'a@example.com', 'x', 'user', '2026-01-01')"))
        connection.execute(text("insert into endpoints values (1, 1, 'webhook', 'https://e.com', "
                                "'old plaintext secret', '2026-01-01')"))
        connection.execute(text("insert into subscriptions values (1, 1, 's', 'COUNT OVER 1s > 1', '{}', null, 1, "
                                "'{}', '2026-01-01', '2026-01-01')"))
        connection.execute(text("insert into subscription_endpoints values (1, 1)"))
    with old.connect() as connection:  # foreign keys on: refused before anything cascades
        connection.exec_driver_sql("PRAGMA foreign_keys=ON")
        with pytest.raises(RuntimeError, match="foreign keys off"):
            command.upgrade(alembic_config(connection), "head")
    old.dispose()
    try:
        engine = engine_for(url)
        with engine.connect() as connection:  # recreating parent tables cascaded nothing
            assert connection.execute(text("select count(*) from subscription_endpoints")).scalar() == 1
            stored = connection.execute(text("select secret_encrypted from endpoints")).scalar()
        assert "plaintext" not in stored
        assert Fernet(key.encode()).decrypt(stored.encode()) == b"old plaintext secret"
        with create_engine(url).begin() as connection:  # and back (foreign keys off, as the alembic CLI has them)
            command.downgrade(alembic_config(connection), "0001")
            assert connection.execute(text("select secret from endpoints")).scalar() == "old plaintext secret"
    finally:
        get_settings.cache_clear()
