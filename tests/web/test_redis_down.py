"""With its Redis stopped, the web app says so: a 503 with Retry-After, not a 500 (real server, real Redis)."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from core.settings import Settings
from devstack.services import ManagedProcess, free_port, start_redis
from tests.servers import serving
from tests.users import PASSWORD, new_user
from web.app import create_app

pytestmark = pytest.mark.slow  # fault injection (Redis stopped and hung): run in CI

HTML = {"accept": "text/html"}


@pytest.fixture
def own_redis(settings: Settings, tmp_path: Path) -> Iterator[tuple[Settings, ManagedProcess]]:
    """A Redis of this test's own, to stop."""
    port = free_port()
    server = start_redis(port, tmp_path / "redis", tmp_path / "redis.log")
    yield settings.model_copy(update={"redis_url": f"redis://127.0.0.1:{port}/0"}), server
    server.stop()


def _csrf(client: httpx.Client, page: str) -> str:
    return re.search(r'name="csrf_token" value="([^"]+)"', client.get(page).text)[1]


def test_with_redis_stopped_sign_in_sign_up_previews_and_test_alerts_answer_503(own_redis) -> None:
    settings, server = own_redis
    user, token = new_user(settings)
    bearer = {"Authorization": f"Bearer {token}"}
    with serving(create_app(settings)) as url, httpx.Client(base_url=url, timeout=30) as client, \
            httpx.Client(base_url=url, timeout=30) as browser:
        endpoint = client.post("/api/endpoints", json={"kind": "webhook", "target": "http://127.0.0.1:9/x"},
                               headers=bearer).json()
        login_csrf, signup_csrf = _csrf(browser, "/login"), _csrf(browser, "/signup")
        server.stop()
        answers = {
            "api sign-in": client.post("/api/auth/login", json={"email": user.email, "password": PASSWORD}),
            "api token": client.post("/api/auth/token", json={"email": user.email, "password": PASSWORD,
                                                               "name": "t"}),
            "api sign-up": client.post("/api/auth/signup", json={"email": "new@example.com", "password": PASSWORD}),
            "api preview": client.post("/api/conditions/preview", json={"condition": "SUM(volume) OVER 1m > 1"},
                                       headers=bearer),
            "api test alert": client.post(f"/api/endpoints/{endpoint['id']}/test", headers=bearer),
            "page sign-in": browser.post("/login", data={"email": user.email, "password": PASSWORD,
                                                         "csrf_token": login_csrf}, headers=HTML),
            "page sign-up": browser.post("/signup", data={"email": "new2@example.com", "password": PASSWORD,
                                                          "csrf_token": signup_csrf}, headers=HTML),
        }
    got = {name: (r.status_code, r.headers.get("retry-after")) for name, r in answers.items()}
    assert got == dict.fromkeys(answers, (503, "5")), {n: r.text[:200] for n, r in answers.items()}
    assert "unavailable" in answers["api sign-in"].json()["detail"]
    assert "unavailable" in answers["page sign-in"].text


@pytest.mark.timeout(120)
def test_with_redis_hung_sign_in_answers_503_within_the_redis_timeout(own_redis) -> None:
    # A stopped process (SIGSTOP) accepts connections and never answers: redis-py's default 5 s
    # socket timeouts (kept by the web app's clients) make that a 503, not a request that waits forever.
    settings, server = own_redis
    user, _ = new_user(settings)
    with serving(create_app(settings)) as url, httpx.Client(base_url=url, timeout=60) as client:
        os.killpg(server.process.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            answer = client.post("/api/auth/login", json={"email": user.email, "password": PASSWORD})
            elapsed = time.monotonic() - started
        finally:
            os.killpg(server.process.pid, signal.SIGCONT)
    assert answer.status_code == 503 and answer.headers["retry-after"] == "5"
    assert elapsed < 30, elapsed  # generous: a few Redis calls, each bounded by its 5 s timeout


@pytest.mark.timeout(180)
def test_a_hung_redis_does_not_freeze_the_server_for_requests_that_do_not_need_it(own_redis) -> None:
    # Previews are async routes: a rate-limit check made on the event loop would block every
    # other request for as long as Redis does not answer.
    settings, server = own_redis
    _user, token = new_user(settings)
    bearer = {"Authorization": f"Bearer {token}"}
    with serving(create_app(settings)) as url, httpx.Client(base_url=url, timeout=120) as client:
        os.killpg(server.process.pid, signal.SIGSTOP)
        try:
            with ThreadPoolExecutor(max_workers=4) as pool:
                previews = [pool.submit(client.post, "/api/conditions/preview", headers=bearer,
                                        json={"condition": "SUM(volume) OVER 1m > 1"}) for _ in range(4)]
                time.sleep(1)  # the previews wait for Redis
                started = time.monotonic()
                health = client.get("/healthz")
                waited = time.monotonic() - started
                # Signed in, and needing only the database: its account's count in Redis is given up after
                # account_count_timeout_s (0.5 s) at most, and the process counts alone (web.tenants).
                started = time.monotonic()
                listed = client.get("/api/subscriptions", headers=bearer)
                listed_in = time.monotonic() - started
                codes = [p.result().status_code for p in previews]
        finally:
            os.killpg(server.process.pid, signal.SIGCONT)
    assert health.status_code == 200 and codes == [503] * 4
    assert waited < 3, waited  # not behind the previews' 5 s Redis timeouts
    assert listed.status_code == 200 and listed_in < 3, (listed.status_code, listed_in)
