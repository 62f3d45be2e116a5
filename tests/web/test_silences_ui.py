"""Issue #16's browser test: a subscription and a silence made in the UI, a firing the evaluator's sink wrote, the
real dispatcher on the same Redis, and the suppression with the silence's id in the subscription's delivery log."""

from __future__ import annotations

import re

from playwright.sync_api import Page, expect

from core.settings import Settings
from evaluator.spark.sink import RedisAlertSink
from evaluator.transition import alert_id
from notifier.app import make_celery
from notifier.dispatcher import Dispatcher
from tests.users import PASSWORD, api_client, new_user, sign_in
from tests.web.test_ui import browser, page, server  # noqa: F401 - the browser, its page and a live server


def _firing(subscription_id: int, key: str, evaluated_at: int) -> dict:
    """A firing transition as the evaluator emits it (the sink stores it in its own format)."""
    return {"alert_id": alert_id(subscription_id, key, "firing", evaluated_at), "subscription_id": subscription_id,
            "key": key, "state": "firing", "value": 150.0, "window_start": evaluated_at - 60_000,
            "window_end": evaluated_at, "evaluated_at": evaluated_at}


def test_a_silence_made_in_the_ui_shows_as_the_suppression_in_the_delivery_log(server: str, page: Page,  # noqa: F811
                                                                             settings: Settings) -> None:
    user, _ = new_user(settings)
    page.goto(server + "/login")
    page.get_by_label("E-mail").fill(user.email)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()

    page.get_by_role("link", name="New subscription").click()
    page.get_by_label("Name").fill("Tech volume")
    page.locator("#condition").fill("SUM(volume) OVER 1m > 100 FOR 2m")  # a pending period, as the issue asks
    expect(page.locator("#condition-check .condition-ok")).to_be_visible()
    page.locator("#keys").fill("AAPL, MSFT")
    page.get_by_role("button", name="Create subscription").click()
    expect(page.get_by_role("heading", name="Tech volume")).to_be_visible()
    expect(page.locator("main")).to_contain_text("SUM(volume) OVER 1m > 100 FOR 2m")  # the pending period kept
    subscription_id = int(re.search(r"/subscriptions/(\d+)$", page.url)[1])

    page.get_by_role("link", name="Silence", exact=True).click()  # prefilled with this subscription
    expect(page.get_by_label("Value 1")).to_have_value(str(subscription_id))
    page.get_by_label("Operator 2").select_option("=~")
    page.get_by_label("Value 2").fill("(AA")
    page.get_by_label("Comment").fill("AAPL earnings call")
    live_error = page.locator("#silence-check #silence-errors")
    expect(live_error).to_contain_text("not a valid RE2 regular expression: missing )")  # checked as typed
    page.get_by_role("button", name="Create silence").click()  # submitted anyway: refused, the form kept
    expect(live_error).to_contain_text("not a valid RE2 regular expression: missing )")
    expect(page.get_by_label("Comment")).to_have_value("AAPL earnings call")
    expect(page.get_by_label("Value 1")).to_have_value(str(subscription_id))
    page.get_by_label("Value 2").fill("AA.*")
    expect(page.locator("#silence-check .silence-ok")).to_contain_text("Valid: silences from")
    page.get_by_role("button", name="Create silence").click()
    row = page.locator("#silences tbody tr").first
    expect(row).to_contain_text("active")
    expect(row).to_contain_text(f'subscription="{subscription_id}"')
    expect(row).to_contain_text('key=~"AA.*"')
    silence_id = int(row.get_attribute("data-silence"))

    evaluated_at = 1_700_000_060_000
    assert RedisAlertSink(settings).write([_firing(subscription_id, "AAPL", evaluated_at),
                                           _firing(subscription_id, "MSFT", evaluated_at)]) == 2
    dispatcher = Dispatcher(settings, make_celery(settings))
    assert dispatcher.read(block_ms=1_000) == 2
    dispatcher.flush(force=True)

    page.goto(f"{server}/subscriptions/{subscription_id}")
    log = page.locator("#deliveries tbody tr")
    expect(log).to_have_count(1)  # MSFT was notified (to no endpoint): only AAPL's suppression is logged
    expect(log).to_contain_text("suppressed")
    expect(log).to_contain_text("AAPL")
    expect(log).to_contain_text(f"silenced by #{silence_id}")

    page.get_by_role("link", name="Silences").click()  # expiring it in the UI
    page.locator(f'#silences tr[data-silence="{silence_id}"]').get_by_role("button", name="Expire").click()
    expect(page.locator(f'#silences tr[data-silence="{silence_id}"]')).to_contain_text("expired")
    expect(page.locator(f'#silences tr[data-silence="{silence_id}"]').get_by_role("button")).to_have_count(0)


def test_the_silences_page_needs_its_csrf_token_and_shows_only_ones_own(settings: Settings) -> None:  # no browser
    mine, _ = new_user(settings)
    _, their_token = new_user(settings)
    with api_client(settings, their_token) as api:
        other = api.post("/api/silences", json={"matchers": [{"name": "key", "value": "AAPL"}],
                                                "comment": "their secret maintenance", "duration_s": 600}).json()
    with api_client(settings) as client:
        csrf = sign_in(client, mine.email)
        assert "their secret maintenance" not in client.get("/silences").text
        assert client.post(f"/silences/{other['id']}/expire", data={"csrf_token": csrf}).status_code == 404
        form = {"matcher_name": "key", "matcher_op": "=", "matcher_value": "AAPL", "comment": "mine",
                "duration_s": "900"}
        del client.headers["X-CSRF-Token"]
        assert client.post("/silences", data=form, follow_redirects=False).status_code == 403  # no token
        created = client.post("/silences", data={**form, "csrf_token": csrf}, follow_redirects=False)
        assert created.status_code == 303 and created.headers["location"] == "/silences"
        page = client.get("/silences").text
        assert 'key="AAPL"' in page and "mine" in page and "active" in page
    with api_client(settings, their_token) as api:
        assert api.get(f"/api/silences/{other['id']}").json()["state"] == "active"
