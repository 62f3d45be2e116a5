"""One account's flood of requests, from a process of its own: its client's CPU then never competes with the
server's for the test process's GIL, as a real client's would not.

``FLOOD`` connections each send the next request as soon as the last is answered (0.25 s after a 429 or 503:
a client that retries fast, ignoring Retry-After), at most ``ROUNDS`` each, until told to stop. Odd
connections preview a condition, even ones list subscriptions.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from multiprocessing.synchronize import Event

import httpx

FLOOD = 100  # requests in progress at once
ROUNDS = 40  # at most this many requests per connection: the flood ends even if it is never told to
PAUSE_S = 0.25  # after a 429 or 503
CONDITION = "COUNT(*) OVER 1m > 1"


class Flood:
    """The flood of the account with API ``token`` against ``url`` while the block runs; ``codes`` afterwards
    (status codes, or the name of the error of a request that got no answer)."""

    def __init__(self, url: str, token: str) -> None:
        context = multiprocessing.get_context("spawn")  # the test process has threads: never fork it
        self.started, self.stop = context.Event(), context.Event()
        self.results = context.Queue()
        self.process = context.Process(target=_flood, args=(url, token, self.started, self.stop, self.results),
                                       daemon=True)
        self.codes: list[int | str] = []

    def __enter__(self) -> Flood:
        self.process.start()
        assert self.started.wait(60), "the flood did not start"
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.codes = self.results.get(timeout=120)
        self.process.join(timeout=30)


def _flood(url: str, token: str, started: Event, stop: Event, results: multiprocessing.Queue) -> None:
    results.put(asyncio.run(_run(url, token, started, stop)))


async def _run(url: str, token: str, started: Event, stop: Event) -> list[int | str]:
    codes: list[int | str] = []
    sent = 0

    async def connection(client: httpx.AsyncClient, n: int) -> None:
        nonlocal sent
        for _ in range(ROUNDS):
            if stop.is_set():
                return
            if n % 2:
                request = client.post("/api/conditions/preview", json={"condition": CONDITION})
            else:
                request = client.get("/api/subscriptions")
            sent += 1
            if sent >= FLOOD:
                started.set()  # every connection has asked
            try:
                code: int | str = (await request).status_code
            except httpx.HTTPError as exc:  # no answer is a failure too, not a crash of the flood
                code = type(exc).__name__
            codes.append(code)
            if code in (429, 503):
                await asyncio.sleep(PAUSE_S)

    limits = httpx.Limits(max_connections=FLOOD, max_keepalive_connections=FLOOD)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits,
                                 headers={"Authorization": f"Bearer {token}"}) as client:
        await asyncio.gather(*(connection(client, n) for n in range(FLOOD)))
    return codes
