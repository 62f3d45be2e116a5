"""One account cannot starve the others: a bound on the requests each account has in progress.

The requests of a web process share its threads (anyio's pool, which sync routes and dependencies run
on) and its database connections (``web_db_pool_size`` + ``web_db_max_overflow``). Unbounded, 60 parallel
requests of one account took them all: another account's requests waited SQLAlchemy's 30 s for a
connection, then got a 500. So:

- A request carrying an account's credential (an API token, or the UI's session cookie) takes one of
  its account's ``account_max_requests`` slots first, in an ASGI middleware (:class:`AccountConcurrency`):
  before its body is read, before it takes a thread or a connection. Finding them all taken, it gets
  a 429 with ``Retry-After`` at once. One account then holds at most that many threads and connections
  of a process (the settings keep it below the pool), and the others find theirs free.
- Slots are counted in the process (a counter: no I/O, so a flood's excess is refused without a round
  trip, and it alone guards the process's own threads and connections) and in Redis (a sorted set of
  leases per account, taken by one atomic script), so the bound holds over every web process and host:
  one account's statements in progress on the shared database do not grow with the number of web
  processes, and a client meets the same bound wherever a load balancer sends it. A lease lapses after
  ``account_request_lease_s`` if its process dies holding it. Redis not answering within
  ``account_count_timeout_s``: each process bounds its own requests alone for a few seconds, rather
  than refusing every signed-in request.
- Which account a credential belongs to is known only once the database was asked. A request is
  counted under its account when this process has seen its credential before, else under the
  credential; once authenticated (``web.deps.get_principal``, :meth:`AccountBound.admit`) it takes a slot
  of its account as well, or gets its 429 there. So a fresh credential's first burst costs at most
  ``account_max_requests`` short authentications beyond the bound, never more of the account's work.

Requests without an account's credential are not counted: sign-in and sign-up have their rate limits
(``web.limits``), publishing with publisher tokens has its own bounds and threads (``web.publishing``).
Static files are not counted either (a page's parallel fetches of them would count against its user;
they need no database).

A request that finds the database pool exhausted for ``web_db_pool_timeout_s`` (many accounts busy at once)
gets :func:`database_busy`, a 503 with ``Retry-After``, never a 500.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import prometheus_client
import redis
import redis.asyncio
import structlog
from fastapi import HTTPException, status
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from starlette.requests import HTTPConnection, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from core.redis_client import make_async_redis
from core.redis_schema import RedisKeys
from core.settings import Settings
from subscriptions.streams import PUBLISHER_PREFIX
from web.limits import UNAVAILABLE_RETRY_AFTER_S

log = structlog.get_logger("web")

TICKET = "tocsin.account_slots"  # the scope key of a request's slots
_REMEMBERED = 10_000  # credentials whose account a process remembers (least recently seen forgotten first)

# Drop lapsed leases; take one if fewer than ARGV[1] remain (Redis's clock: web hosts' clocks may differ).
_ACQUIRE = """
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ms)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then
  return 0
end
redis.call('ZADD', KEYS[1], ms + tonumber(ARGV[2]), ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""

ACCOUNT_BUSY = prometheus_client.Counter(
    "tocsin_account_busy_total", "Requests refused with 429: their account had account_max_requests in progress")
DATABASE_BUSY = prometheus_client.Counter(
    "tocsin_database_busy_total", "Requests answered 503: no database connection was free within web_db_pool_timeout_s")


@dataclass
class _Slot:
    key: str
    lease: str  # its member of the key's sorted set in Redis (if Redis took it)


@dataclass
class Ticket:
    """The slots one request holds: under its credential or its account, or under both."""

    credential: str
    slots: list[_Slot] = field(default_factory=list)


class AccountBound:
    """The slots of every account: counted in this process, and in Redis over all of them."""

    def __init__(self, settings: Settings, session_cookie: str) -> None:
        self.settings = settings
        self.session_cookie = session_cookie
        self._prefix = RedisKeys(settings).requests_in_progress
        self._local: Counter[str] = Counter()
        self._accounts: OrderedDict[str, int] = OrderedDict()  # credential digest -> account id
        self._client: tuple[asyncio.AbstractEventLoop, redis.asyncio.Redis, AsyncScript] | None = None
        self._releases: set[asyncio.Task[None]] = set()
        self._redis_back_at = 0.0

    def _redis(self) -> tuple[redis.asyncio.Redis, AsyncScript]:
        """The asyncio Redis client of the running loop (made on first use: its connections belong to that loop)."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._client[0] is not loop:
            wait = self.settings.account_count_timeout_s
            client = make_async_redis(self.settings, socket_timeout=wait, socket_connect_timeout=wait,
                                      retry=Retry(NoBackoff(), 0))  # a late answer is no answer: no retries
            self._client = (loop, client, client.register_script(_ACQUIRE))
        return self._client[1], self._client[2]

    async def aclose(self) -> None:
        """Give back the leases still being given back (briefly), and close the client."""
        if self._releases:
            await asyncio.wait(self._releases, timeout=self.settings.account_count_timeout_s)
        if self._client is not None and self._client[0] is asyncio.get_running_loop():
            await self._client[1].aclose()
        self._client = None

    def credential(self, scope: Scope) -> str | None:
        """A digest of the account credential the request carries (as ``web.deps`` reads it), or None."""
        connection = HTTPConnection(scope)
        header = connection.headers.get("authorization")
        if header is not None:  # the header wins over the cookie, as in web.deps
            scheme, _, token = header.partition(" ")
            token = token.strip()
            # Not an account's: a malformed header (a 401 without the database), a publisher token (web.publishing).
            secret = token if scheme.lower() == "bearer" and not token.startswith(PUBLISHER_PREFIX) else ""
        else:
            secret = connection.cookies.get(self.session_cookie, "")
        return hashlib.sha256(secret.encode()).hexdigest() if secret else None

    def key_of(self, credential: str) -> str:
        """Where a request with ``credential`` is counted first: its account if this process knows it."""
        account = self._accounts.get(credential)
        if account is None:
            return f"credential:{credential}"
        self._accounts.move_to_end(credential)
        return f"account:{account}"

    async def enter(self, ticket: Ticket, key: str) -> bool:
        """Take a slot of ``key`` for the request (kept in ``ticket``); False, nothing taken, if none is free."""
        if self._local[key] >= self.settings.account_max_requests:
            return False
        self._local[key] += 1
        slot = _Slot(key, uuid.uuid4().hex)  # in the ticket before Redis is asked: given back whatever happens
        ticket.slots.append(slot)
        if await self._count(key, slot.lease) is False:
            ticket.slots.remove(slot)
            self._uncount_locally(key)
            return False
        return True

    async def admit(self, scope: Scope, account: int) -> None:
        """Count an authenticated request under its account too, if it was counted under its credential; 429 if
        the account has no slot free."""
        ticket: Ticket | None = scope.get(TICKET)
        key = f"account:{account}"
        if ticket is None or any(slot.key == key for slot in ticket.slots):
            return
        self._accounts[ticket.credential] = account
        self._accounts.move_to_end(ticket.credential)
        if len(self._accounts) > _REMEMBERED:
            self._accounts.popitem(last=False)
        if not await self.enter(ticket, key):
            raise self.busy()

    def leave(self, ticket: Ticket) -> None:
        """Give the request's slots back (its leases in Redis by a task of their own, not waited for)."""
        for slot in ticket.slots:
            self._uncount_locally(slot.key)
            self._release_soon(slot.key, slot.lease)
        ticket.slots.clear()

    def busy(self) -> HTTPException:
        ACCOUNT_BUSY.inc()
        retry = self.settings.busy_retry_after_s
        return HTTPException(status.HTTP_429_TOO_MANY_REQUESTS,
                             f"this account has {self.settings.account_max_requests} requests in progress, as many as "
                             f"it may have at once; try again in {retry} s", headers={"Retry-After": str(retry)})

    def _uncount_locally(self, key: str) -> None:
        self._local[key] -= 1
        if self._local[key] <= 0:
            del self._local[key]

    async def _count(self, key: str, lease: str) -> bool | None:
        """Whether Redis took the lease (False: the account is full everywhere); None: Redis does not answer."""
        if time.monotonic() < self._redis_back_at:
            return None
        _, acquire = self._redis()
        lease_ms = int(self.settings.account_request_lease_s * 1000)
        try:
            async with asyncio.timeout(self.settings.account_count_timeout_s):
                return bool(await acquire(keys=[f"{self._prefix}:{key}"],
                                          args=[self.settings.account_max_requests, lease_ms, lease]))
        except (TimeoutError, redis.RedisError) as exc:
            self._redis_failed(exc)
            return None  # the lease is still given back with the slot, in case Redis took it after all

    def _redis_failed(self, exc: BaseException) -> None:
        """Count in this process alone for a while (said once per outage)."""
        if time.monotonic() >= self._redis_back_at:
            log.warning("account_bound_local_only", seconds=UNAVAILABLE_RETRY_AFTER_S,
                        reason=f"{type(exc).__name__}: {exc}")
        self._redis_back_at = time.monotonic() + UNAVAILABLE_RETRY_AFTER_S

    def _release_soon(self, key: str, lease: str) -> None:
        task = asyncio.get_running_loop().create_task(self._release(key, lease))
        self._releases.add(task)  # a reference, so the task is not collected before it ran
        task.add_done_callback(self._releases.discard)

    async def _release(self, key: str, lease: str) -> None:
        client, _ = self._redis()
        try:
            async with asyncio.timeout(self.settings.account_count_timeout_s):
                await client.zrem(f"{self._prefix}:{key}", lease)
        except (TimeoutError, redis.RedisError) as exc:  # the lease lapses by itself
            self._redis_failed(exc)


class AccountConcurrency:
    """ASGI middleware: a request with an account's credential takes a slot of it first; 429 when none is free
    (rendered by ``refuse``, as the app's other errors are)."""

    def __init__(self, app: ASGIApp, bound: AccountBound,
                 refuse: Callable[[Request, HTTPException], Awaitable[Response]], exempt: tuple[str, ...]) -> None:
        self.app = app
        self.bound = bound
        self.refuse = refuse
        self.exempt = exempt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        credential = self.bound.credential(scope) if scope["type"] == "http" else None
        if credential is None or scope["path"].startswith(self.exempt):
            await self.app(scope, receive, send)
            return
        ticket = Ticket(credential)
        try:  # the slots go back however the request ends: answered, refused, failed or cancelled
            if await self.bound.enter(ticket, self.bound.key_of(credential)):
                scope[TICKET] = ticket
                await self.app(scope, receive, send)
            else:
                response = await self.refuse(Request(scope, receive), self.bound.busy())
                await response(scope, receive, send)
        finally:
            self.bound.leave(ticket)


def database_busy(settings: Settings) -> HTTPException:
    """A 503 for a request that found no database connection free within ``web_db_pool_timeout_s``."""
    DATABASE_BUSY.inc()
    retry = settings.busy_retry_after_s
    return HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE,
                         f"temporarily unavailable (every database connection of this web process is in use); "
                         f"try again in {retry} s", headers={"Retry-After": str(retry)})
