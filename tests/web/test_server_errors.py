"""Inputs that used to make the pages answer 500: each is a 4xx (or a page with the error) now."""

from __future__ import annotations

import redis

from core.redis_schema import RedisKeys
from core.settings import Settings
from notifier.deliveries import DeliveryRecords
from tests.users import api_client, new_user, sign_in

HTML = {"accept": "text/html"}
FORM = {"name": "Volume", "condition": "SUM(volume) OVER 5m > 2e6", "keys": "AAPL", "cooldown_s": "60",
        "renotify_s": "", "active": "on"}
HUGE_ID = 2**63
DEEP = "(" * 2000 + "COUNT(*)" + ")" * 2000 + " OVER 1m > 1"  # the page's fields take any length


def test_the_delivery_log_shows_suppressions(settings: Settings) -> None:
    user, token = new_user(settings)
    with api_client(settings, token) as api:
        sid = api.post("/api/subscriptions", json={"name": "x", "condition": "COUNT(*) OVER 1m > 1"}).json()["id"]
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    pipe = client.pipeline()
    DeliveryRecords(client, RedisKeys(settings)).suppressed(
        sid, {"alert_id": "a1", "key": "AAPL", "state": "firing"}, "muted", pipe, pipe)
    pipe.execute()
    with api_client(settings) as browser:
        sign_in(browser, user.email)
        page = browser.get(f"/subscriptions/{sid}/deliveries")
        assert page.status_code == 200 and "suppressed" in page.text and "muted" in page.text


def test_deep_parentheses_are_a_condition_error(settings: Settings) -> None:
    user, _token = new_user(settings)
    with api_client(settings) as browser:
        sign_in(browser, user.email)
        page = browser.post("/conditions/check", data={"condition": DEEP})
        assert page.status_code == 200 and "nest" in page.text
        preview = browser.post("/conditions/preview", data={"condition": DEEP})
        assert preview.status_code == 200 and "nest" in preview.text
        form = browser.post("/subscriptions/new", data={**FORM, "condition": DEEP})
        assert form.status_code == 422 and 'data-field="condition"' in form.text  # too long, there


def test_digits_that_int_takes_or_refuses_are_form_errors(settings: Settings) -> None:
    user, token = new_user(settings)
    with api_client(settings, token) as api:
        sid = api.post("/api/subscriptions", json={"name": "x", "condition": "COUNT(*) OVER 1m > 1"}).json()["id"]
    with api_client(settings) as browser:
        sign_in(browser, user.email)
        for field, value in [("cooldown_s", "\u0663"), ("cooldown_s", "1" * 5000), ("renotify_s", "\u00b2"),
                             ("renotify_s", "9" * 5000), ("endpoint_ids", "\u00b2"), ("endpoint_ids", "1" * 5000),
                             ("endpoint_ids", str(HUGE_ID)), ("endpoint_ids", "\u0663")]:
            page = browser.post("/subscriptions/new", data={**FORM, field: value})
            assert page.status_code == 422, (field, value[:10], page.status_code)
        for since in ["\u00b2", "1" * 5000, "\u0663"]:
            assert browser.get(f"/subscriptions/{sid}/history", params={"since": since}).status_code == 200


def test_huge_ids_are_not_found(settings: Settings) -> None:
    user, _ = new_user(settings)
    with api_client(settings) as browser:
        sign_in(browser, user.email)
        for method, path in [("get", f"/subscriptions/{HUGE_ID}"), ("get", f"/subscriptions/{HUGE_ID}/edit"),
                             ("post", f"/subscriptions/{HUGE_ID}/edit"), ("get", f"/subscriptions/{HUGE_ID}/firing"),
                             ("get", f"/subscriptions/{HUGE_ID}/history"),
                             ("get", f"/subscriptions/{HUGE_ID}/deliveries"),
                             ("post", f"/subscriptions/{HUGE_ID}/pause"), ("post", f"/endpoints/{HUGE_ID}/test"),
                             ("post", f"/endpoints/{HUGE_ID}/rotate"), ("post", f"/endpoints/{HUGE_ID}/delete"),
                             ("get", f"/endpoints/{HUGE_ID}/deliveries"),
                             ("post", f"/account/tokens/{HUGE_ID}/revoke")]:
            response = browser.request(method.upper(), path, headers=HTML, data=FORM if method == "post" else None)
            assert response.status_code in (404, 422), (path, response.status_code)


def test_the_form_shows_key_errors_not_a_method(settings: Settings) -> None:
    user, _ = new_user(settings)
    with api_client(settings) as browser:
        sign_in(browser, user.email)
        page = browser.get("/subscriptions/new", headers=HTML)
        assert "built-in method" not in page.text
        bad = browser.post("/subscriptions/new", data={**FORM, "keys": "AAPL bad$key"})
        assert bad.status_code == 422 and "built-in method" not in bad.text
        assert 'data-field="keys"' in bad.text and "should match pattern" in bad.text
