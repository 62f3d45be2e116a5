"""The operators' stream pages in a real browser (Debian's Chromium + Playwright) against a real server and Tansu:
declare a stream (field errors first), evolve it, issue a publisher token and publish with it over HTTP."""

from __future__ import annotations

import httpx
import pytest
from playwright.sync_api import Page, expect

from core.settings import Settings
from ingest.kafka import ensure_topics
from subscriptions.db import session_factory
from subscriptions.streams import StreamService
from tests.ingest.test_publisher import events_on
from tests.users import PASSWORD, api_client, new_user
from tests.web.test_ui import browser, page, server  # noqa: F401 - the browser, its page and a live server


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """Stream topics of this test's own (the broker is shared by the test session)."""
    return settings.model_copy(update={"stream_topic_prefix": f"{settings.events_topic}.stream."})


def _sign_in(browser_page: Page, url: str, email: str) -> None:
    browser_page.goto(url + "/login")
    browser_page.get_by_label("E-mail").fill(email)
    browser_page.get_by_label("Password").fill(PASSWORD)
    browser_page.get_by_role("button", name="Sign in").click()


def test_an_operator_declares_a_stream_issues_a_publisher_token_and_publishes_with_it(
        server: str, page: Page, settings: Settings) -> None:  # noqa: F811
    ensure_topics(settings)
    operator, api_token = new_user(settings, role="operator")
    _sign_in(page, server, operator.email)
    page.get_by_role("link", name="Streams").click()
    trades = page.locator('[data-stream-detail="trades"]')
    expect(trades.locator('[data-attribute="volume"]')).to_contain_text("≥ 0")

    form = page.locator("#declare-stream")
    form.locator("input[name=name]").fill("hosts")
    form.get_by_label("Key field").fill("host")
    form.get_by_label("Time field").fill("time")
    form.get_by_label("Time format").select_option("iso8601")
    form.locator('textarea[name="attributes"]').fill("cpu:%:100:0\nmem:%:0:100")  # min above max
    form.get_by_label("Dimensions").fill("region")
    form.get_by_role("button", name="Declare stream").click()
    expect(page.locator('[data-field="attributes"]')).to_contain_text("min 100 is above max 0")
    expect(form.locator("input[name=name]")).to_have_value("hosts")  # the form keeps what was typed

    form.locator('textarea[name="attributes"]').fill("cpu:%:0:100\nmem:%:0:100")
    form.get_by_label("Partitions").fill("2")
    form.get_by_role("button", name="Declare stream").click()
    expect(page.locator("#notice")).to_contain_text(f"Stream hosts declared on topic {settings.stream_topic_prefix}hosts")
    hosts = page.locator('[data-stream-detail="hosts"]')
    expect(hosts.locator('[data-attribute="cpu"]')).to_contain_text("0 – 100")
    expect(hosts.locator(".dimensions")).to_contain_text("region")
    expect(page.locator('#stream-hosts')).to_contain_text("ISO-8601")

    hosts.get_by_text("Add an attribute").click()  # a compatible change: optional
    hosts.get_by_label("Name").fill("disk")
    hosts.get_by_label("Unit").fill("%")
    hosts.get_by_label("Max").fill("100")
    hosts.get_by_role("button", name="Add attribute").click()
    expect(page.locator("#notice")).to_contain_text("attribute disk added (version 2)")
    expect(page.locator('[data-stream-detail="hosts"] [data-attribute="disk"]')).to_contain_text("≤ 100")

    with api_client(settings, api_token) as api:  # a subscription on hosts uses cpu
        made = api.post("/api/subscriptions", json={"name": "hot", "stream": "hosts",
                                                    "condition": "AVG(cpu) OVER 1m > 90"})
        assert made.status_code == 201, made.text
        sid = made.json()["id"]
    page.reload()
    cpu = page.locator('[data-stream-detail="hosts"] [data-attribute="cpu"]')
    expect(cpu.locator(".used-by")).to_have_text(f"#{sid} hot")
    page.once("dialog", lambda dialog: dialog.accept())
    cpu.get_by_role("button", name="Remove").click()
    expect(page.locator("#refusal")).to_contain_text("used by subscriptions")
    expect(page.locator("#refusal li")).to_have_text([f"#{sid} hot"])
    expect(page.locator('[data-stream-detail="hosts"] [data-attribute="cpu"]')).to_have_count(1)

    tokens = page.locator("#create-publisher-token")
    tokens.get_by_label("Token name").fill("collector")
    tokens.get_by_role("button", name="Create publisher token").click()  # no stream chosen
    expect(page.locator('[data-field="token_streams"]')).to_contain_text("choose at least one stream")
    tokens.get_by_label("hosts").check()
    tokens.get_by_role("button", name="Create publisher token").click()
    token = page.locator("#new-publisher-token").inner_text()
    assert token.startswith("tcp_")
    expect(page.locator("#publisher-token-list")).to_contain_text("collector")
    expect(page.locator("#publisher-token-list")).to_contain_text("hosts")
    page.reload()
    expect(page.locator("#new-publisher-token")).to_have_count(0)  # shown once

    records = [{"host": "web-1", "time": "2026-01-02T09:30:00Z", "cpu": 42.5, "mem": 61, "region": "eu"},
               {"host": "web-2", "time": "2026-01-02T09:30:01Z", "cpu": 140, "mem": 10},
               {"host": "db-1", "time": "2026-01-02T09:30:02.500+01:00", "cpu": 7, "mem": 20, "disk": 93.5}]
    answer = httpx.post(f"{server}/api/streams/hosts/events", json=records,
                        headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert answer.status_code == 202, answer.text
    assert answer.json() == {"accepted": 2, "rejected": [
        {"index": 1, "reason": "cpu: Input should be less than or equal to 100"}]}
    on_topic = sorted(events_on(settings, f"{settings.stream_topic_prefix}hosts"),
                      key=lambda r: r["key"])
    assert on_topic == [{"key": "db-1", "ts": 1767342602500, "cpu": 7, "mem": 20, "disk": 93.5, "region": None},
                        {"key": "web-1", "ts": 1767346200000, "cpu": 42.5, "mem": 61, "disk": None, "region": "eu"}]
    refused = httpx.post(f"{server}/api/streams/trades/events", json=[], timeout=30,
                         headers={"Authorization": f"Bearer {token}"})
    assert refused.status_code == 403  # scoped to hosts

    page.once("dialog", lambda dialog: dialog.accept())
    page.locator("#publisher-token-list").get_by_role("button", name="Revoke").click()
    expect(page.get_by_text("No publisher tokens yet.")).to_be_visible()
    revoked = httpx.post(f"{server}/api/streams/hosts/events", json=records[:1], timeout=30,
                         headers={"Authorization": f"Bearer {token}"})
    assert revoked.status_code == 401
    with session_factory(settings.database_url)() as session:  # the page went through the service: same rows
        assert StreamService(session, settings).get("hosts").version == 2


def test_stream_pages_are_for_operators_with_the_csrf_token_and_show_field_errors(settings: Settings) -> None:
    from tests.users import sign_in

    user, _ = new_user(settings)
    operator, _ = new_user(settings, role="operator")
    with api_client(settings) as client:
        sign_in(client, user.email)
        assert client.get("/streams", headers={"Accept": "text/html"}).status_code == 403
        assert client.post("/streams", data={"name": "x"}).status_code == 403
        assert client.post("/streams/tokens", data={"token_name": "t", "streams": ["trades"]}).status_code == 403
    with api_client(settings) as client:
        csrf = sign_in(client, operator.email)
        del client.headers["X-CSRF-Token"]
        assert client.post("/streams", data={"name": "hosts", "attributes": "cpu"}).status_code == 403  # no CSRF
        bad = client.post("/streams", data={"csrf_token": csrf, "name": "Hosts", "attributes": "cpu:%:x",
                                            "dimensions": "region"})
        assert bad.status_code == 422
        assert 'data-field="attributes">a bound is not a number' in bad.text
        bad = client.post("/streams", data={"csrf_token": csrf, "name": "Hosts", "attributes": "cpu\nkind",
                                            "partitions": "0"})
        assert bad.status_code == 422
        assert 'data-field="name">String should match pattern' in bad.text
        assert 'data-field="partitions">Input should be greater than or equal to 1' in bad.text
        clash = client.post("/streams", data={"csrf_token": csrf, "name": "hosts", "attributes": "cpu\nkind"})
        assert clash.status_code == 422 and 'data-field="form">&#39;kind&#39; is reserved' in clash.text
        taken = client.post("/streams", data={"csrf_token": csrf, "name": "trades", "attributes": "price"})
        assert taken.status_code == 409 and "a stream named &#39;trades&#39; exists already" in taken.text
        fixed = client.post("/streams/trades/attributes/price/remove", data={"csrf_token": csrf})
        assert fixed.status_code == 409 and "schema is fixed" in fixed.text  # the evaluator's built-in path
        solo = client.post("/streams", data={"csrf_token": csrf, "name": "solo", "attributes": "cpu\nmem"},
                           follow_redirects=False)
        assert solo.status_code == 303, solo.text
        last = client.post("/streams/solo/attributes/mem/remove", data={"csrf_token": csrf}, follow_redirects=False)
        assert last.status_code == 303  # mem is used by no subscription
        last = client.post("/streams/solo/attributes/cpu/remove", data={"csrf_token": csrf})
        assert last.status_code == 422 and "at least 1 item" in last.text  # a stream keeps one attribute
        missing = client.post("/streams/trades/attributes/nope/remove", data={"csrf_token": csrf},
                              headers={"Accept": "text/html"})
        assert missing.status_code == 404
