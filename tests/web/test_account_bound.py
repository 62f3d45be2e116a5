"""The per-account bound's counting (web.tenants) against a real Redis, running and absent: over several web
processes, with a lapsed lease, each process alone while Redis does not answer, and clients that go away."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from fastapi import HTTPException

from core.settings import Settings
from devstack.patience import patient
from devstack.services import free_port
from tests.servers import serving
from tests.users import evaluator_running, new_user
from web.app import create_app
from web.deps import SESSION_COOKIE
from web.tenants import TICKET, AccountBound, Ticket

ACCOUNT = "account:7"


_made: list[AccountBound] = []


def _run(scenario: Callable[[], Awaitable[None]]) -> None:
    """Run ``scenario`` on an event loop of its own, closing the bounds it made on that loop afterwards."""
    async def closing() -> None:
        try:
            await scenario()
        finally:
            while _made:
                await _made.pop().aclose()

    asyncio.run(closing())


def _bound(settings: Settings) -> AccountBound:
    """A web process's bound of 3 requests per account."""
    _made.append(AccountBound(settings.model_copy(update={"account_max_requests": 3}), SESSION_COOKIE))
    return _made[-1]


async def _enter(bound: AccountBound, key: str = ACCOUNT) -> Ticket | None:
    """A request's ticket holding a slot of ``key``, or None if it was refused."""
    ticket = Ticket("credential")
    return ticket if await bound.enter(ticket, key) else None


def test_the_slots_are_shared_by_every_process_and_given_back(settings: Settings) -> None:
    async def scenario() -> None:
        one, two = _bound(settings), _bound(settings)  # two web processes
        held = [await _enter(one), await _enter(two), await _enter(two)]
        assert all(held)
        assert await _enter(one) is None and await _enter(two) is None  # 3 in all, whichever process
        assert await _enter(one, "account:8") is not None  # another account has its own
        one.leave(held[0])
        deadline = time.monotonic() + patient(10)
        while (again := await _enter(two)) is None:  # the lease is given back by a task of its own
            assert time.monotonic() < deadline, "the slot given back in one process is not free in the other"
            await asyncio.sleep(0.05)
        assert await _enter(one) is None
        for ticket in (*held[1:], again):
            two.leave(ticket)

    _run(scenario)


def test_a_dead_processs_slots_lapse_after_the_lease(settings: Settings) -> None:
    async def scenario() -> None:
        dead = _bound(settings.model_copy(update={"account_request_lease_s": 1.0}))
        for _ in range(3):
            assert await _enter(dead)  # never given back: the process died
        alive = _bound(settings)
        assert await _enter(alive) is None
        started = time.monotonic()
        while await _enter(alive) is None:
            assert time.monotonic() - started < 10, "the dead process's leases did not lapse"
            await asyncio.sleep(0.1)
        assert time.monotonic() - started >= 0.5  # not before (most of) the lease

    _run(scenario)


def test_a_request_counted_under_its_credential_takes_its_accounts_slot_once_authenticated(
        settings: Settings) -> None:
    async def scenario() -> None:
        bound = _bound(settings)
        assert bound.key_of("fresh") == "credential:fresh"
        for _ in range(3):
            assert await _enter(bound)  # the account's 3 slots, taken with its other credentials
        ticket = Ticket("fresh")
        assert await bound.enter(ticket, bound.key_of("fresh"))  # not yet known as the account's
        with pytest.raises(HTTPException) as refused:
            await bound.admit({TICKET: ticket}, 7)
        assert refused.value.status_code == 429 and refused.value.headers == {"Retry-After": "1"}
        bound.leave(ticket)
        assert bound.key_of("fresh") == ACCOUNT  # counted under its account from now on

    _run(scenario)


def test_without_redis_each_process_bounds_its_requests_alone(settings: Settings) -> None:
    absent = settings.model_copy(update={"redis_url": f"redis://127.0.0.1:{free_port()}/0"})  # nothing listens

    async def scenario() -> None:
        bound = _bound(absent)
        held = [await _enter(bound) for _ in range(3)]
        assert all(held) and await _enter(bound) is None
        bound.leave(held[0])
        assert await _enter(bound)

    _run(scenario)


def test_a_hung_redis_costs_one_wait_of_the_count_timeout_then_none_for_a_while(settings: Settings) -> None:
    with socket.create_server(("127.0.0.1", 0)) as hung:  # accepts connections (the kernel does), never answers
        silent = settings.model_copy(update={"redis_url": f"redis://127.0.0.1:{hung.getsockname()[1]}/0"})

        async def scenario() -> None:
            bound = _bound(silent)
            started = time.monotonic()
            assert await _enter(bound)
            assert time.monotonic() - started >= 0.4  # account_count_timeout_s (0.5 s) waited
            started = time.monotonic()
            assert await _enter(bound) and await _enter(bound) and await _enter(bound) is None
            assert time.monotonic() - started < 1.0  # not three more waits: Redis is left alone for 5 s

        _run(scenario)


def test_clients_that_go_away_mid_request_give_their_slots_back(settings: Settings) -> None:
    settings = settings.model_copy(update={"account_max_requests": 2, "preview_timeout_s": 2.0,
                                           "rate_preview_account": "1000/minute"})
    _, token = new_user(settings)
    evaluator_running(settings)  # a preview waits preview_timeout_s for the shard's answer
    bearer = {"Authorization": f"Bearer {token}"}
    preview = {"condition": "COUNT(*) OVER 1m > 1"}
    with serving(create_app(settings)) as url, ThreadPoolExecutor(max_workers=2) as pool:
        for _ in range(2):  # two clients give up while their previews wait: both slots taken, then abandoned
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(f"{url}/api/conditions/preview", json=preview, headers=bearer, timeout=0.3)
        deadline = time.monotonic() + patient(30)
        while True:  # once the abandoned previews ended, two at once are admitted again
            codes = list(pool.map(lambda _: httpx.post(f"{url}/api/conditions/preview", json=preview,
                                                       headers=bearer, timeout=60).status_code, range(2)))
            if codes == [200, 200]:
                break
            assert time.monotonic() < deadline, f"the abandoned requests' slots never came back: {codes}"
            time.sleep(0.5)
