"""The web UI in a real browser: Debian's headless Chromium driven by Playwright, against a real server."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from playwright.sync_api import Browser, Page, expect, sync_playwright

from core.redis_schema import RedisKeys, admission_waiting_field
from core.settings import Settings
from core.stream_names import TRADES
from evaluator.spark.sink import RedisAlertSink
from evaluator.transition import alert_id
from ingest.kafka import ensure_topics
from tests.servers import serving
from tests.users import PASSWORD, api_client, new_user
from web.app import create_app
from web.ops import sample_once

CHROMIUM = os.environ.get("TOCSIN_TEST_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-sync",
                 "--disable-background-networking", "--disable-component-update"]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def server(settings: Settings) -> Iterator[str]:
    with serving(create_app(settings)) as url:
        yield url


@pytest.fixture
def page(browser: Browser, tmp_path: Path) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    yield page
    page.screenshot(path=str(tmp_path / "last.png"), full_page=True)  # kept with the test's tmp dir
    context.close()


def test_sign_up_create_a_subscription_see_a_validation_error_and_the_listing(server: str, page: Page) -> None:
    page.goto(server + "/")
    expect(page).to_have_url(f"{server}/login?next=/")
    page.get_by_role("link", name="Sign up").click()
    page.get_by_label("E-mail").fill("grace@example.com")
    page.get_by_label("Password").fill("short")  # the browser checks minlength first; the server checks too
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign up").click()
    expect(page.get_by_text("No subscriptions yet")).to_be_visible()
    expect(page.get_by_text("grace@example.com")).to_be_visible()

    page.get_by_role("link", name="Create your first subscription").click()
    page.get_by_label("Name").fill("Tech volume")
    condition = page.locator("#condition")
    condition.fill("SUM(vol) OVER 5m > 2e6")
    live_error = page.locator('#condition-check [data-field="condition"]')
    expect(live_error).to_contain_text("unknown attribute 'vol'")  # checked as typed, before submitting
    expect(live_error).to_contain_text("column 5")

    page.get_by_role("button", name="Create subscription").click()  # submitting anyway is refused with the reason
    expect(page.locator('[data-field="condition"]').first).to_contain_text("unknown attribute 'vol'")
    expect(page.get_by_label("Name")).to_have_value("Tech volume")

    condition.fill("sum(volume) over 5m > 2e6")
    expect(page.locator("#condition-check .condition-ok")).to_contain_text("SUM(volume) OVER 5m > 2000000")
    page.locator("#keys").fill("AAPL, MSFT")
    page.get_by_role("button", name="Preview matches now").click()  # no evaluator runs in this test
    expect(page.locator("#preview")).to_contain_text("The evaluator is not running yet")
    page.get_by_role("button", name="Create subscription").click()
    expect(page.get_by_role("heading", name="Tech volume")).to_be_visible()
    expect(page.locator("#admission-waiting")).to_contain_text("no shard of its stream's query has run a micro-batch")

    page.get_by_role("link", name="Subscriptions").click()
    row = page.locator("#subscriptions tbody tr")
    expect(row).to_have_count(1)
    expect(row).to_contain_text("Tech volume")
    expect(row).to_contain_text("SUM(volume) OVER 5m > 2000000")
    expect(row).to_contain_text("AAPL, MSFT")
    expect(row).to_contain_text("active")

    row.get_by_role("button", name="Pause").click()  # an htmx POST with the CSRF header
    expect(page.locator("#subscriptions tbody tr")).to_contain_text("paused")


def test_endpoint_secret_is_shown_once_and_the_operator_dashboard_charts_live(server: str, page: Page,
                                                                              settings: Settings) -> None:
    ensure_topics(settings)
    operator, _ = new_user(settings, role="operator")
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    page.goto(server + "/login")
    page.get_by_label("E-mail").fill(operator.email)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()

    page.get_by_role("link", name="Endpoints").click()
    page.get_by_label("URL or address").fill("https://hooks.example.com/tocsin")
    page.get_by_role("button", name="Add endpoint").click()
    secret = page.locator("#new-secret").inner_text()
    assert len(secret) >= 32
    page.reload()
    expect(page.locator("#new-secret")).to_have_count(0)  # shown once
    page.get_by_role("button", name="Send test alert").click()
    expect(page.get_by_text("Test alert queued")).to_be_visible()

    for _ in range(2):
        _sample(settings, client)
        time.sleep(0.05)
    page.get_by_role("link", name="Operations").click()
    expect(page.locator("#charts .uplot")).to_have_count(6)
    expect(page.locator('#tiles [data-metric="lag"]')).to_have_text("0")
    expect(page.locator('#tiles [data-metric="queued"]')).not_to_have_text("–")
    expect(page.locator("#sample-status")).to_contain_text("Kafka ok")


def _sample(settings: Settings, client: redis.Redis) -> dict:
    """The sampler's work, done here: the server's sampler took its one sample of the hour at its start (before
    the test made its topics: a test that read that sample passed only while a probe of a missing topic waited
    for it) and holds the hour's lock."""
    client.delete(RedisKeys(settings).ops_sampler_lock)
    taken = sample_once(settings.model_copy(update={"dashboard_sample_s": 0.01}), client)
    assert taken is not None
    return taken


def _sign_in(page: Page, server: str, email: str) -> None:
    page.goto(server + "/login")
    page.get_by_label("E-mail").fill(email)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()


def test_the_alert_history_shows_a_new_alert_without_a_reload(server: str, page: Page, settings: Settings) -> None:
    """It said "No alerts." beside a firing key until the page was reloaded; it follows new alerts now. Before its
    admission (evaluator/admission.py) it says it is not evaluated yet, and that goes once a shard admits it."""
    user, token = new_user(settings)
    with api_client(settings, token) as api:
        sid = api.post("/api/subscriptions", json={"name": "Volume", "condition": "SUM(volume) OVER 5m > 2e6"}).json()["id"]
    client, keys = redis.Redis.from_url(settings.redis_url), RedisKeys(settings)
    client.hset(keys.evaluator_stats, mapping={admission_waiting_field(TRADES, 0): 1, admission_waiting_field(TRADES, 1): 0})
    client.sadd(keys.admission_waiting(TRADES, 0), sid)
    _sign_in(page, server, user.email)
    page.goto(f"{server}/subscriptions/{sid}")
    expect(page.locator("#history")).to_contain_text("No alerts.")
    page.evaluate("window.notReloaded = true")
    expect(page.locator("#admission-waiting")).to_contain_text("Not evaluated yet on 1 of 2 shards", timeout=30_000)
    client.delete(keys.admission_waiting(TRADES, 0))
    client.hset(keys.evaluator_stats, admission_waiting_field(TRADES, 0), 0)
    expect(page.locator("#admission-waiting")).to_have_count(0, timeout=30_000)
    expect(page.locator("#firing")).to_contain_text("No key is in the condition right now.")
    at = int(time.time() * 1000)
    RedisAlertSink(settings).write([
        {"alert_id": alert_id(sid, "AAPL", "firing", at), "subscription_id": sid, "key": "AAPL", "state": "firing",
         "value": 2.5e6, "window_start": at - 300_000, "window_end": at, "evaluated_at": at}])
    expect(page.locator("#firing")).to_contain_text("AAPL", timeout=30_000)
    row = page.locator("#history tbody tr")
    expect(row).to_have_count(1, timeout=30_000)
    expect(row).to_contain_text("AAPL")
    expect(row).to_contain_text("firing")
    assert page.evaluate("window.notReloaded") is True
    page.locator("#history-filters select[name=state]").select_option("resolved")  # the poll keeps the filters
    expect(page.locator("#history")).to_contain_text("No alerts match these filters.")
    page.wait_for_timeout(3_000)  # more than one poll: it must not bring back the unfiltered list
    expect(page.locator("#history")).to_contain_text("No alerts match these filters.")


def test_the_ops_tiles_and_charts_read_true(server: str, page: Page, settings: Settings, tmp_path: Path) -> None:
    """The success tile said "–" while its chart said 100 %, whose axis ran to 200; the input line hid under the
    evaluated one."""
    ensure_topics(settings)
    operator, _ = new_user(settings, role="operator")
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    keys = RedisKeys(settings)

    client.hset(keys.evaluator_stats, mapping={"batch_seconds": 25_000,  # long labels: 25,000,000 ms
                                               "admission_waiting:trades:0": 5, "admission_waiting:hosts:1": 2,
                                               "handoff_waiting:trades": 40_000, "handoff_waiting:hosts": 2})
    _sample(settings, client)
    client.hset(keys.delivery_stats, mapping={"delivered": 3})  # every attempt of this period delivered
    time.sleep(0.05)
    _sample(settings, client)
    time.sleep(0.05)
    assert _sample(settings, client)["success_rate"] is None  # nothing attempted since: the chart draws across this gap
    _sign_in(page, server, operator.email)
    page.goto(server + "/ops")
    expect(page.locator("#charts .uplot")).to_have_count(6)
    expect(page.locator('#tiles [data-metric="success_rate"]')).to_have_text("100")
    expect(page.locator('#tiles [data-metric="admission_waiting"]')).to_have_text("7")  # summed over streams, shards
    expect(page.locator('#tiles [data-metric="handoff_waiting"]')).to_have_text("40,002")  # summed over streams
    delivery = page.evaluate("(() => { const p = window.tocsinCharts.delivery;"
                             " return [p.scales.y.min, p.scales.y.max, p.axes[1]._size]; })()")
    assert delivery[:2] == [0, 100]
    rates = page.evaluate("window.tocsinCharts.rates.series.slice(1).map((s) => [s.label, String(s._stroke), s.dash])")
    (_, input_colour, input_dash), (_, evaluated_colour, evaluated_dash) = rates
    assert input_colour != evaluated_colour and input_dash != evaluated_dash
    size, widest, margin = page.evaluate("""(() => {
        const p = window.tocsinCharts.batch, a = p.axes[1];
        p.ctx.font = a.font[0];
        const widest = Math.max(...a._values.map((v) => p.ctx.measureText(String(v)).width / devicePixelRatio));
        return [a._size, widest, a.ticks.size + a.gap]; })()""")
    page.screenshot(path=str(tmp_path / "ops.png"), full_page=True)
    assert size >= widest + margin  # the longest label fits (the fixed 60 px cut "25,000,000")
