"""Passwords are hashed with the configured Argon2id profile, and a hash made with another is renewed at login."""

from __future__ import annotations

from sqlalchemy import select

from core.settings import Settings
from subscriptions.accounts import AccountService
from subscriptions.db import session_factory
from subscriptions.models import User
from tests.users import PASSWORD


def _stored_hash(settings: Settings, email: str) -> str:
    with session_factory(settings.database_url)() as session:
        return session.scalar(select(User.password_hash).where(User.email == email))


def test_the_default_is_rfc_9106_low_memory_and_a_changed_profile_renews_the_hash_at_login(settings: Settings) -> None:
    production = settings.model_copy(update={"password_hashing": "rfc9106-low-memory"})
    assert Settings.model_fields["password_hashing"].default == "rfc9106-low-memory"
    with session_factory(settings.database_url)() as session:
        AccountService(session, production).sign_up("hash@example.com", PASSWORD)
    assert _stored_hash(settings, "hash@example.com").startswith("$argon2id$v=19$m=65536,t=3,p=4$")

    cheap = settings.model_copy(update={"password_hashing": "cheapest-insecure"})
    with session_factory(settings.database_url)() as session:
        accounts = AccountService(session, cheap)
        assert accounts.authenticate("hash@example.com", "not the password") is None
        assert _stored_hash(settings, "hash@example.com").startswith("$argon2id$v=19$m=65536,"), "kept on failure"
        assert accounts.authenticate("hash@example.com", PASSWORD) is not None
    assert _stored_hash(settings, "hash@example.com").startswith("$argon2id$v=19$m=8,t=1,p=1$")
    with session_factory(settings.database_url)() as session:  # and back: the renewed hash still opens the account
        assert AccountService(session, production).authenticate("hash@example.com", PASSWORD) is not None
    assert _stored_hash(settings, "hash@example.com").startswith("$argon2id$v=19$m=65536,t=3,p=4$")
