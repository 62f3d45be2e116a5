"""Signing in and out, shared by the JSON API and the HTML pages.

Failed logins are counted per address in Redis; past ``login_max_failures``
within ``login_lockout_s`` password logins to that address wait that long (429),
which makes guessing passwords slow. A locked-out account keeps its browser
sessions and API tokens: a stranger's failed guesses cannot cut it off.
"""

from __future__ import annotations

import redis
from fastapi import HTTPException, Request, Response, status

from infra.redis_schema import RedisKeys
from infra.settings import Settings
from subscriptions.accounts import AccountService
from subscriptions.models import User, WebSession
from subscriptions.schemas import EMAIL_ADDRESS
from web.deps import SESSION_COOKIE


def check_password(accounts: AccountService, redis_client: redis.Redis, settings: Settings,
                   email: str, password: str) -> User:
    """The user with these credentials; 401 if wrong, 429 while the address is locked out."""
    email = email.strip().lower()
    if not EMAIL_ADDRESS.match(email):  # no account has such an address (and PostgreSQL refuses NUL in a query)
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "wrong e-mail address or password")
    key = RedisKeys(settings).login_failures(email)
    failures = int(redis_client.get(key) or 0)
    if failures >= settings.login_max_failures:
        retry = max(int(redis_client.ttl(key)), 1)
        raise HTTPException(status.HTTP_429_TOO_MANY_REQUESTS, f"too many failed logins; try again in {retry} s",
                            headers={"Retry-After": str(retry)})
    user = accounts.authenticate(email, password)
    if user is None:
        pipe = redis_client.pipeline()
        pipe.incr(key)
        pipe.expire(key, settings.login_lockout_s)
        pipe.execute()
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "wrong e-mail address or password")
    redis_client.delete(key)
    return user


def sign_in(response: Response, accounts: AccountService, settings: Settings, user: User) -> WebSession:
    token, web_session = accounts.start_session(user)
    response.set_cookie(SESSION_COOKIE, token, max_age=settings.session_ttl_s, httponly=True, samesite="lax",
                        secure=settings.session_cookie_secure, path="/")
    return web_session


def sign_out(request: Request, response: Response, accounts: AccountService) -> None:
    if token := request.cookies.get(SESSION_COOKIE):
        accounts.end_session(token)
    response.delete_cookie(SESSION_COOKIE, path="/")
