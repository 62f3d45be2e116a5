"""The HTML pages through HTTP with a browser session: forms, fragments, redirects, ownership."""

from __future__ import annotations

import re

import redis

from core.redis_schema import RedisKeys, admission_waiting_field, catalog_read_field
from core.settings import Settings
from core.stream_names import TRADES
from evaluator.spark.sink import RedisAlertSink
from evaluator.transition import alert_id
from subscriptions.db import session_factory
from subscriptions.models import Subscription
from tests.users import api_client, new_user, sign_in

HTML = {"accept": "text/html"}
FORM = {"name": "Volume", "condition": "SUM(volume) OVER 5m > 2e6", "keys": "AAPL, MSFT", "cooldown_s": "60",
        "renotify_s": "", "send_resolved": "on", "group": "on", "active": "on"}


def test_subscription_form_edit_fragments_and_delete(settings: Settings) -> None:
    user, _ = new_user(settings)
    with api_client(settings) as browser:
        assert browser.get("/", headers=HTML, follow_redirects=False).headers["location"] == "/login?next=/"
        sign_in(browser, user.email)
        created = browser.post("/subscriptions/new", data=FORM, follow_redirects=False)
        assert created.status_code == 303
        sid = int(created.headers["location"].rsplit("/", 1)[1])

        bad = browser.post(f"/subscriptions/{sid}/edit", data={**FORM, "condition": "SUM(volume) OVER 1500ms > 1",
                                                               "cooldown_s": "-1"})
        assert bad.status_code == 422
        assert "multiple of 1s" in bad.text and "policy.cooldown_s" in bad.text
        edited = browser.post(f"/subscriptions/{sid}/edit", data={**FORM, "name": "Renamed", "keys": ""},
                              follow_redirects=False)
        assert edited.status_code == 303
        form = browser.get(f"/subscriptions/{sid}/edit", headers=HTML).text
        assert 'value="Renamed"' in form and 'value="60"' in form

        at = 1_800_000_000_000
        RedisAlertSink(settings).write([
            {"alert_id": alert_id(sid, "AAPL", "firing", at), "subscription_id": sid, "key": "AAPL",
             "state": "firing", "value": 2.5e6, "window_start": at - 300_000, "window_end": at, "evaluated_at": at}])
        assert "AAPL" in browser.get(f"/subscriptions/{sid}/firing").text
        assert "AAPL" in browser.get(f"/subscriptions/{sid}/history", params={"state": "firing"}).text
        assert "No alerts match" in browser.get(f"/subscriptions/{sid}/history", params={"state": "resolved"}).text
        assert browser.get(f"/subscriptions/{sid}/history", params={"before": "junk"}).status_code == 200
        assert "1 firing" in browser.get("/", headers=HTML).text

        assert browser.post(f"/subscriptions/{sid}/pause").headers["hx-refresh"] == "true"
        assert browser.post(f"/subscriptions/{sid}/explode").status_code == 404
        assert browser.post(f"/subscriptions/{sid}/delete").headers["hx-redirect"] == "/"
        assert browser.get(f"/subscriptions/{sid}", headers=HTML).status_code == 404


def _catalog_version(settings: Settings, subscription_id: int) -> int | None:
    with session_factory(settings.database_url)() as session:
        subscription = session.get(Subscription, subscription_id)
        assert subscription is not None
        return subscription.catalog_version


def test_a_subscription_waiting_for_admission_says_so_instead_of_no_key(settings: Settings) -> None:
    """A shard that has not admitted the subscription yet (evaluator/admission.py), or whose last batch evaluated a
    catalog from before the subscription's last change, evaluates nothing for it: its page and the API say it
    waits, why and on how many shards, and not that no key is in the condition. Judged by catalog versions, not by
    the hosts' clocks (until 2026-12-07 by when the shard read the catalog, by its executor's clock, against the
    subscription's ``updated_at``, by the web host's: an executor's clock behind made it "not evaluated" for ever)."""
    user, token = new_user(settings)
    client, keys = redis.Redis.from_url(settings.redis_url), RedisKeys(settings)
    with api_client(settings, token) as api, api_client(settings) as browser:
        sid = api.post("/api/subscriptions", json={"name": "x", "condition": "COUNT(*) OVER 1m > 1"}).json()["id"]
        sign_in(browser, user.email)
        version = _catalog_version(settings, sid)
        assert version is not None and version >= 1
        client.hset(keys.evaluator_stats, mapping={admission_waiting_field(TRADES, 0): 7,  # both shards read it
                                                   admission_waiting_field(TRADES, 1): 0,
                                                   catalog_read_field(TRADES, 0): version,
                                                   catalog_read_field(TRADES, 1): version})
        client.sadd(keys.admission_waiting(TRADES, 0), sid + 1, sid)
        page = browser.get(f"/subscriptions/{sid}/firing").text
        assert "Not evaluated yet on 1 of 2 shards" in page and "on the shards that evaluate it" in page
        assert api.get(f"/api/subscriptions/{sid}/firing").json()["admission"] == {
            "waiting_shards": 1, "shards": 2, "unread_shards": 0, "waiting": True}
        client.hset(keys.evaluator_stats, admission_waiting_field(TRADES, 1), 1)
        client.sadd(keys.admission_waiting(TRADES, 1), sid)
        page = browser.get(f"/subscriptions/{sid}/firing").text
        assert "2 of 2 shards" in page and "No key is in the condition" not in page
        client.srem(keys.admission_waiting(TRADES, 0), sid)  # admitted on shard 0; another still waits there
        client.delete(keys.admission_waiting(TRADES, 1))
        client.hset(keys.evaluator_stats, admission_waiting_field(TRADES, 1), 0)
        page = browser.get(f"/subscriptions/{sid}/firing").text
        assert "Not evaluated yet" not in page and "No key is in the condition right now." in page
        assert api.get(f"/api/subscriptions/{sid}/firing").json()["admission"]["waiting"] is False

        # changed again (paused and resumed) after shard 1 last read the catalog: not evaluated there yet
        api.post(f"/api/subscriptions/{sid}/pause")
        api.post(f"/api/subscriptions/{sid}/resume")
        resumed = _catalog_version(settings, sid)
        assert resumed is not None and resumed > version + 1  # the pause, then the resumption
        client.hset(keys.evaluator_stats, catalog_read_field(TRADES, 0), resumed)  # shard 1 read only the older
        page = browser.get(f"/subscriptions/{sid}/firing").text
        assert "Not evaluated yet on 1 of 2 shards:" in page and "changed after the subscriptions they last read" in page
        assert "on the shards that evaluate it" in page
        assert api.get(f"/api/subscriptions/{sid}/firing").json()["admission"]["unread_shards"] == 1
        client.hset(keys.evaluator_stats, catalog_read_field(TRADES, 1), resumed + 5)  # a later catalog has it too
        assert api.get(f"/api/subscriptions/{sid}/firing").json()["admission"]["waiting"] is False


def test_pages_of_another_user_are_not_found(settings: Settings) -> None:
    _owner, owner_token = new_user(settings)
    other, _ = new_user(settings)
    with api_client(settings, owner_token) as api:
        sid = api.post("/api/subscriptions", json={"name": "x", "condition": "COUNT(*) OVER 1m > 1"}).json()["id"]
        eid = api.post("/api/endpoints", json={"kind": "email", "target": "a@example.com"}).json()["id"]
    with api_client(settings) as browser:
        sign_in(browser, other.email)
        for method, path in [("get", f"/subscriptions/{sid}"), ("get", f"/subscriptions/{sid}/edit"),
                             ("get", f"/subscriptions/{sid}/firing"), ("get", f"/subscriptions/{sid}/history"),
                             ("post", f"/subscriptions/{sid}/pause"), ("post", f"/subscriptions/{sid}/delete"),
                             ("post", f"/endpoints/{eid}/test"), ("post", f"/endpoints/{eid}/rotate"),
                             ("post", f"/endpoints/{eid}/delete"), ("get", f"/endpoints/{eid}/deliveries")]:
            assert browser.request(method.upper(), path, headers=HTML).status_code == 404, path
        assert "No subscriptions yet" in browser.get("/", headers=HTML).text


def test_tokens_and_secrets_are_shown_once(settings: Settings) -> None:
    user, _ = new_user(settings)
    with api_client(settings) as browser:
        sign_in(browser, user.email)
        made = browser.post("/account/tokens", data={"name": "deploy"})
        token = re.search(r'id="new-token">(tcs_[^<]+)<', made.text)[1]
        assert token not in browser.get("/account", headers=HTML).text
        browser.headers["Authorization"] = f"Bearer {token}"
        assert browser.get("/api/auth/me").json()["email"] == user.email
        del browser.headers["Authorization"]

        page = browser.post("/endpoints", data={"kind": "webhook", "target": "https://hooks.example.com/x"})
        first = re.search(r'id="new-secret">([^<]+)<', page.text)[1]
        eid = int(re.search(r'data-endpoint="(\d+)"', page.text)[1])
        rotated = browser.post(f"/endpoints/{eid}/rotate")
        second = re.search(r'id="new-secret">([^<]+)<', rotated.text)[1]
        assert second != first and 'id="new-secret"' not in browser.get("/endpoints", headers=HTML).text
        refused = browser.post("/endpoints", data={"kind": "webhook", "target": "ftp://x"})
        assert refused.status_code == 422 and "http(s) URL" in refused.text


def test_the_forms_refuse_names_with_control_or_format_characters_on_the_field(settings: Settings) -> None:
    operator, _ = new_user(settings, role="operator")
    with api_client(settings) as browser:
        sign_in(browser, operator.email)
        for bad in ("in\tside", "right\u202eto-left", "zero\u200bwidth"):
            for path, data, field in [
                ("/account/tokens", {"name": bad}, "name"),
                ("/streams/tokens", {"token_name": bad, "streams": ["trades"]}, "token_name"),
                ("/subscriptions/new", {"name": bad, "condition": "COUNT(*) OVER 1m > 1"}, "name"),
            ]:
                refused = browser.post(path, data=data, headers=HTML)
                assert refused.status_code == 422, (path, bad)
                assert re.search(f'data-field="{field}">[^<]*control characters or Unicode format characters', refused.text), (path, bad)
        assert browser.post("/streams/tokens", data={"token_name": "n" * 200, "streams": ["trades"]},
                            follow_redirects=False).status_code == 303
