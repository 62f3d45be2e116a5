"""Accounts from the command line."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from core.settings import Settings
from subscriptions import admin
from subscriptions.accounts import AccountService
from subscriptions.db import session_factory


@pytest.fixture
def local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'tocsin.db'}")
    monkeypatch.setattr(admin, "get_settings", lambda: settings)
    return settings


def _authenticate(settings: Settings, email: str, password: str):
    with session_factory(settings.database_url)() as session:
        return AccountService(session, settings).authenticate(email, password)


def test_create_user_set_role_and_errors(local: Settings, capsys: pytest.CaptureFixture,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    assert admin.main(["create-user", "ada@example.com", "--operator"]) == 0
    password = capsys.readouterr().out.strip().rsplit(": ", 1)[1]
    assert _authenticate(local, "ada@example.com", password).role == "operator"

    monkeypatch.setattr("sys.stdin", io.StringIO("a long enough secret\n"))
    assert admin.main(["create-user", "bob@example.com", "--password-stdin"]) == 0
    assert "password" not in capsys.readouterr().out
    assert _authenticate(local, "bob@example.com", "a long enough secret").role == "user"
    assert admin.main(["set-role", "bob@example.com", "operator"]) == 0
    assert _authenticate(local, "bob@example.com", "a long enough secret").role == "operator"

    assert admin.main(["create-user", "bob@example.com"]) == 2
    assert "already has an account" in capsys.readouterr().err
    assert admin.main(["set-role", "nobody@example.com", "user"]) == 2
    monkeypatch.setattr("sys.stdin", io.StringIO("short\n"))
    assert admin.main(["create-user", "carl@example.com", "--password-stdin"]) == 2


def test_first_operator_only_on_an_empty_database(local: Settings) -> None:
    password = admin.first_operator(local)
    assert password and _authenticate(local, admin.LOCAL_OPERATOR, password).role == "operator"
    assert admin.first_operator(local) is None
