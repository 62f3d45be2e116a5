"""Limits a public service needs: request body size and time, and rate limits kept in Redis.

Rate limits are counted in Redis (the `limits` library's fixed windows, one atomic
increment per hit), so every web process shares them, and a hit is counted before
the work it guards is done: N parallel requests cannot all pass a check that
none of them has counted yet. Sign-in, sign-up, previews and test alerts are
limited per client address and, where there is one, per account.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Annotated

import kombu.exceptions
import redis
from fastapi import Depends, HTTPException, Request, status
from limits import RateLimitItem, RateLimitItemPerSecond, parse
from limits.errors import StorageError
from limits.storage import storage_from_string
from limits.strategies import FixedWindowRateLimiter
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core.redis_client import limits_storage
from core.redis_schema import RedisKeys
from core.settings import Settings

STORE_DOWN = (redis.RedisError, StorageError, kombu.exceptions.OperationalError)
"""What the Redis client, the rate limiter's storage and Celery's producer raise when Redis is down or hung."""
UNAVAILABLE_RETRY_AFTER_S = 5


def unavailable() -> HTTPException:
    """A 503 that says why and when to come back, for a request that needs Redis while it is down."""
    return HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE,
                         f"temporarily unavailable (the service's Redis does not answer); "
                         f"try again in {UNAVAILABLE_RETRY_AFTER_S} s",
                         headers={"Retry-After": str(UNAVAILABLE_RETRY_AFTER_S)})


class RateLimiter:
    """Named rate limits over the deployment's Redis (single or cluster), under its key prefix."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        uri, options = limits_storage(settings)
        storage = storage_from_string(uri, key_prefix=RedisKeys(settings).rate_limits, wrap_exceptions=True,
                                      **options)
        self.limiter = FixedWindowRateLimiter(storage)

    def hit(self, rate: str | RateLimitItem, *identifiers: str, what: str = "requests") -> None:
        """Count one hit; 429 with Retry-After when it is one too many."""
        item = parse(rate) if isinstance(rate, str) else rate
        try:
            allowed = self.limiter.hit(item, *identifiers)
            reset_at = None if allowed else self.limiter.get_window_stats(item, *identifiers).reset_time
        except STORE_DOWN as exc:  # a limit that cannot be counted is not passed: 503, never a 500
            raise unavailable() from exc
        if reset_at is not None:
            retry = max(math.ceil(reset_at - time.time()), 1)
            raise HTTPException(status.HTTP_429_TOO_MANY_REQUESTS, f"too many {what}; try again in {retry} s",
                                headers={"Retry-After": str(retry)})

    def login_attempt(self, email: str) -> None:
        """Count a password check against ``email`` before it is made (429 once the address is locked out).

        Counting first makes check-and-count one atomic step: of any number of parallel
        guesses, at most ``login_max_failures`` reach the password check.
        """
        self.hit(self._lockout(), "login", email, what="failed logins")

    def login_succeeded(self, email: str) -> None:
        try:
            self.limiter.clear(self._lockout(), "login", email)
        except STORE_DOWN as exc:
            raise unavailable() from exc

    def _lockout(self) -> RateLimitItem:
        return RateLimitItemPerSecond(self.settings.login_max_failures, self.settings.login_lockout_s)


def client_address(request: Request) -> str:
    """The peer address (behind a proxy, run uvicorn with ``--proxy-headers`` so it is the client's)."""
    return request.client.host if request.client else "unknown"


def limit_previews(limiter: RateLimiter, request: Request, user_id: int) -> None:
    settings = limiter.settings
    limiter.hit(settings.rate_preview_account, "preview", "account", str(user_id), what="previews")
    limiter.hit(settings.rate_preview_client, "preview", "client", client_address(request), what="previews")


def limit_test_alerts(limiter: RateLimiter, request: Request, user_id: int) -> None:
    settings = limiter.settings
    limiter.hit(settings.rate_test_alert_account, "test-alert", "account", str(user_id), what="test alerts")
    limiter.hit(settings.rate_test_alert_client, "test-alert", "client", client_address(request), what="test alerts")


def limit_backtests(limiter: RateLimiter, user_id: int) -> None:
    limiter.hit(limiter.settings.rate_backtest_account, "backtest", "account", str(user_id), what="backtests")


def get_limiter(request: Request) -> RateLimiter:
    return request.app.state.limiter


LimiterDep = Annotated[RateLimiter, Depends(get_limiter)]


class BodySizeLimit:
    """ASGI middleware: a request body over ``max_bytes`` gets a 413, one slower than ``timeout_s`` a 408.

    The declared Content-Length is checked first (413 before a byte is read). The body is not read
    ahead: it is counted as the route reads it (chunked bodies, or a Content-Length that lies), and the
    read that passes the limit, or that comes later than ``timeout_s`` after the route's first one,
    raises the 413 or the 408 (with ``Connection: close``: the rest of the body is never read). So a
    route that authenticates before it reads the body (publishing) answers a bad token with a 401
    before the body is read, and a slow client holds neither a buffer nor a worker past the timeout.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send)
            return
        size = 0
        deadline: float | None = None
        complete = False

        async def limited() -> Message:
            nonlocal size, deadline, complete
            if complete:  # the body is in: later reads wait for the client to go away, as long as it takes
                return await receive()
            loop = asyncio.get_running_loop()
            if deadline is None:
                deadline = loop.time() + self.timeout_s
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise HTTPException(status.HTTP_408_REQUEST_TIMEOUT,
                                    f"the request body did not arrive within {self.timeout_s:g} s",
                                    headers={"Connection": "close"}) from None
            if message["type"] != "http.request":
                return message
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, self._too_large,
                                    headers={"Connection": "close"})
            complete = not message.get("more_body", False)
            return message

        await self.app(scope, limited, send)

    @property
    def _too_large(self) -> str:
        return f"the request body is larger than {self.max_bytes} bytes"

    async def _refuse(self, send: Send) -> None:
        body = json.dumps({"detail": self._too_large}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
