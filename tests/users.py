"""Accounts for tests: a user with an API token, and the web app as that user."""

from __future__ import annotations

import uuid

from core.settings import Settings

PASSWORD = "correct horse battery"


def new_user(settings: Settings, email: str | None = None, role: str = "user"):
    """A user with an API token: ``(user, token)``."""
    from subscriptions.accounts import AccountService
    from subscriptions.db import session_factory

    with session_factory(settings.database_url)() as session:
        accounts = AccountService(session, settings)
        user = accounts.sign_up(email or f"{uuid.uuid4().hex[:10]}@example.com", PASSWORD, role=role)
        token, _ = accounts.create_token(user, "tests")
        return user, token


def api_client(settings: Settings, token: str | None = None):
    """A TestClient of the web app, authenticated with ``token`` when given (start it with ``with``)."""
    from fastapi.testclient import TestClient

    from web.app import create_app

    client = TestClient(create_app(settings))
    if token:
        client.headers["Authorization"] = f"Bearer {token}"
    return client



def form_csrf(client, page: str = "/login") -> str:
    """The pre-session CSRF token of the sign-in or sign-up form (its cookie is now in ``client``)."""
    import re

    return re.search(r'name="csrf_token" value="([^"]+)"', client.get(page).text)[1]


def sign_in(client, email: str, password: str = PASSWORD) -> str:
    """Sign ``client`` in with a browser session (cookie) and send its CSRF token from now on."""
    response = client.post("/api/auth/login", json={"email": email, "password": password})
    assert response.status_code == 200, response.text
    csrf = response.json()["csrf_token"]
    client.headers["X-CSRF-Token"] = csrf
    return csrf


def evaluator_running(settings: Settings) -> None:
    """What a live evaluator writes to Redis (a fresh heartbeat, a batch since its start, a shard clock), for
    tests of the web app alone that need ``/readyz`` to be ready."""
    import time

    import redis

    from core.redis_schema import RedisKeys, shard_clock_field

    now = time.time()
    redis.Redis.from_url(settings.redis_url).hset(RedisKeys(settings).evaluator_stats, mapping={
        "driver_started_at": now, "driver_heartbeat_at": now, "last_batch_at": now, shard_clock_field(0): 1})
