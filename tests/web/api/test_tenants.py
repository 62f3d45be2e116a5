"""One account's requests cannot starve another's, on SQLite and PostgreSQL (real server, real concurrency): a
request that finds no database connection free gets a 503 soon, never a 500, and a preview holds none while it
waits for the evaluator."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from core.settings import Settings
from subscriptions.db import engine_for
from tests.servers import serving
from tests.users import evaluator_running, new_user, sign_in
from web.app import create_app
from web.deps import web_pool

CONDITION = "COUNT(*) OVER 1m > 1"


def test_a_request_that_finds_no_database_connection_free_gets_a_503_soon_not_a_500(settings: Settings) -> None:
    user, token = new_user(settings)
    engine = engine_for(settings.database_url, web_pool(settings))  # the web app's, as the pool is the process's
    with serving(create_app(settings)) as url, httpx.Client(base_url=url, timeout=60) as api, \
            httpx.Client(base_url=url, timeout=60) as browser:
        api.headers["Authorization"] = f"Bearer {token}"
        sign_in(browser, user.email)
        held = [engine.connect() for _ in range(settings.web_db_pool_size + settings.web_db_max_overflow)]
        try:
            started = time.monotonic()
            busy = api.get("/api/subscriptions")
            waited = time.monotonic() - started
            page = browser.get("/", headers={"accept": "text/html"})
        finally:
            for connection in held:
                connection.close()
        again = api.get("/api/subscriptions")
    assert busy.status_code == 503 and busy.headers["retry-after"] == "1", busy.text
    assert "database connection" in busy.json()["detail"]
    assert waited < 10, waited  # web_db_pool_timeout_s (1 s), not SQLAlchemy's 30 s; generous for a loaded machine
    assert page.status_code == 503 and "database connection" in page.text and "<html" in page.text.lower()
    assert again.status_code == 200


def test_a_preview_gives_its_database_connection_back_while_it_waits_for_the_evaluator(settings: Settings) -> None:
    settings = settings.model_copy(update={"preview_timeout_s": 4.0})
    _, token = new_user(settings)
    evaluator_running(settings)  # a shard exists, so the preview waits preview_timeout_s for its answer
    engine = engine_for(settings.database_url, web_pool(settings))
    bearer = {"Authorization": f"Bearer {token}"}
    with serving(create_app(settings)) as url, httpx.Client(base_url=url, timeout=60, headers=bearer) as api, \
            ThreadPoolExecutor(max_workers=1) as pool:
        assert api.get("/api/subscriptions").status_code == 200
        held = [engine.connect() for _ in range(settings.web_db_pool_size + settings.web_db_max_overflow - 1)]  # all but one
        try:
            preview = pool.submit(api.post, "/api/conditions/preview", json={"condition": CONDITION})
            time.sleep(1.5)  # the preview is waiting for the shard's answer
            listed = api.get("/api/subscriptions")  # needs the one connection left
            served_while_preview_waits = not preview.done()
            previewed = preview.result()
        finally:
            for connection in held:
                connection.close()
    assert previewed.status_code == 200 and previewed.json()["answered"] == 0, previewed.text
    assert listed.status_code == 200 and served_while_preview_waits, listed.text
