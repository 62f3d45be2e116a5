"""Dependencies injected into routes: settings, database session, Redis, the caller, services.

The caller is authenticated by an API token (``Authorization: Bearer tcs_…``) or by
the session cookie of the web UI, and its request then counts toward its account's
requests in progress (``web.tenants``). Cookie-authenticated requests that change
something must carry the session's CSRF token (``X-CSRF-Token`` header, or a
``csrf_token`` form field), so another site cannot make a browser act for its user.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated

import redis
from celery import Celery
from fastapi import Depends, HTTPException, Path, Request, status
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.orm import Session, sessionmaker

from core.redis_schema import RedisKeys
from core.settings import Settings
from notifier.deliveries import DeliveryRecords
from notifier.outbox import Outbox
from subscriptions.accounts import AccountService
from subscriptions.db import DbPool, session_factory
from subscriptions.models import User, WebSession
from subscriptions.schemas import MAX_ID
from subscriptions.service import SubscriptionService
from subscriptions.streams import PUBLISHER_PREFIX
from web.tenants import AccountBound

SESSION_COOKIE = "tocsin_session"
CSRF_HEADER = "X-CSRF-Token"
CSRF_FIELD = "csrf_token"
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def web_pool(settings: Settings) -> DbPool:
    """The web app's database pool: sized by the settings, and a short wait for a connection when all are in use
    (then a 503, ``web.tenants.database_busy``), not SQLAlchemy's 30 s."""
    return DbPool(settings.web_db_pool_size, settings.web_db_max_overflow, settings.web_db_pool_timeout_s)


def web_sessions(settings: Settings) -> sessionmaker[Session]:
    """Sessions from the web app's pool (:func:`web_pool`)."""
    return session_factory(settings.database_url, web_pool(settings))


def get_db(settings: Annotated[Settings, Depends(get_settings)]) -> Iterator[Session]:
    session = web_sessions(settings)()
    try:
        yield session
    finally:
        session.close()


def get_redis(request: Request) -> redis.Redis:
    return request.app.state.redis


def get_celery(request: Request) -> Celery:
    return request.app.state.celery


def get_keys(settings: Annotated[Settings, Depends(get_settings)]) -> RedisKeys:
    return RedisKeys(settings)


def get_accounts(
    session: Annotated[Session, Depends(get_db)], settings: Annotated[Settings, Depends(get_settings)]
) -> AccountService:
    return AccountService(session, settings)


@dataclass(frozen=True)
class Principal:
    """Who is calling, and how: ``web_session`` is None for API tokens."""

    user: User
    web_session: WebSession | None


def _unauthorized(detail: str) -> HTTPException:
    return HTTPException(status.HTTP_401_UNAUTHORIZED, detail, headers={"WWW-Authenticate": "Bearer"})


def _identify(request: Request, accounts: AccountService) -> Principal | None:
    header = request.headers.get("authorization")
    if header:
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise _unauthorized("use 'Authorization: Bearer <API token>'")
        if token.strip().startswith(PUBLISHER_PREFIX):
            raise _unauthorized("a publisher token may only publish events (POST /api/streams/{name}/events)")
        user = accounts.user_for_token(token.strip())
        if user is None:
            raise _unauthorized("the API token is not valid (revoked, or mistyped)")
        return Principal(user, None)
    cookie = request.cookies.get(SESSION_COOKIE)
    web_session = accounts.session_for(cookie) if cookie else None
    return Principal(web_session.user, web_session) if web_session else None


async def get_principal(
    request: Request, accounts: Annotated[AccountService, Depends(get_accounts)]
) -> Principal | None:
    principal = await run_in_threadpool(_identify, request, accounts)
    if principal is not None:  # counted under its account now, if its credential was new to this process
        bound: AccountBound = request.app.state.account_bound
        await bound.admit(request.scope, principal.user.id)
    if principal is not None and principal.web_session is not None and request.method not in _SAFE_METHODS:
        sent: object = request.headers.get(CSRF_HEADER)  # a form field may be a file: checked below
        if sent is None and request.headers.get("content-type", "").startswith(
                ("application/x-www-form-urlencoded", "multipart/form-data")):
            sent = (await request.form()).get(CSRF_FIELD)
        # Bytes: compare_digest refuses str with non-ASCII characters (a TypeError, so a 500).
        if not isinstance(sent, str) or not hmac.compare_digest(sent.encode(), principal.web_session.csrf_token.encode()):
            raise HTTPException(status.HTTP_403_FORBIDDEN, "missing or wrong CSRF token")
    return principal


def get_user(principal: Annotated[Principal | None, Depends(get_principal)]) -> User:
    if principal is None:
        raise _unauthorized("sign in, or send an API token")
    return principal.user


def get_operator(user: Annotated[User, Depends(get_user)]) -> User:
    if not user.is_operator:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "operators only")
    return user


def get_records(
    redis_client: Annotated[redis.Redis, Depends(get_redis)], keys: Annotated[RedisKeys, Depends(get_keys)]
) -> DeliveryRecords:
    return DeliveryRecords(redis_client, keys)


def get_outbox(
    redis_client: Annotated[redis.Redis, Depends(get_redis)], keys: Annotated[RedisKeys, Depends(get_keys)],
    settings: Annotated[Settings, Depends(get_settings)]
) -> Outbox:
    return Outbox(redis_client, keys, settings)


def get_service(
    session: Annotated[Session, Depends(get_db)],
    settings: Annotated[Settings, Depends(get_settings)],
    redis_client: Annotated[redis.Redis, Depends(get_redis)],
    user: Annotated[User, Depends(get_user)],
) -> SubscriptionService:
    return SubscriptionService(session, settings, redis_client, user)


SettingsDep = Annotated[Settings, Depends(get_settings)]
DbDep = Annotated[Session, Depends(get_db)]
RedisDep = Annotated[redis.Redis, Depends(get_redis)]
KeysDep = Annotated[RedisKeys, Depends(get_keys)]
AccountsDep = Annotated[AccountService, Depends(get_accounts)]
PrincipalDep = Annotated[Principal | None, Depends(get_principal)]
UserDep = Annotated[User, Depends(get_user)]
OperatorDep = Annotated[User, Depends(get_operator)]
ServiceDep = Annotated[SubscriptionService, Depends(get_service)]
CeleryDep = Annotated[Celery, Depends(get_celery)]
RecordsDep = Annotated[DeliveryRecords, Depends(get_records)]
OutboxDep = Annotated[Outbox, Depends(get_outbox)]
IdPath = Annotated[int, Path(ge=1, le=MAX_ID, description="an id (ids are 1 to 2^31-1)")]
