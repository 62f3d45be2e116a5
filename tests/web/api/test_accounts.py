"""Accounts: sign-up and sign-in, CSRF, API tokens, roles, per-user isolation and limits."""

from __future__ import annotations

import redis
from fastapi.testclient import TestClient

from core.redis_schema import celery_queue_keys, lane_queue
from core.settings import Settings
from evaluator.spark.sink import RedisAlertSink
from evaluator.transition import alert_id
from tests.users import PASSWORD, api_client, form_csrf, new_user, sign_in
from web.deps import SESSION_COOKIE

CONDITION = "SUM(volume) OVER 5m > 100"


def _transition(subscription_id: int, key: str, state: str, at: int, value: float = 150.0) -> dict:
    return {"alert_id": alert_id(subscription_id, key, state, at), "subscription_id": subscription_id, "key": key,
            "state": state, "value": value, "window_start": at - 300_000, "window_end": at, "evaluated_at": at}


def test_sign_up_sign_in_and_out_with_a_session_cookie(settings: Settings) -> None:
    with api_client(settings) as browser:
        weak = browser.post("/api/auth/signup", json={"email": "ada@example.com", "password": "short"})
        assert weak.status_code == 422 and weak.json()["detail"][0]["loc"] == ["body", "password"]
        bad = browser.post("/api/auth/signup", json={"email": "not-an-address", "password": PASSWORD})
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "email"]

        created = browser.post("/api/auth/signup", json={"email": "Ada@Example.com", "password": PASSWORD})
        assert created.status_code == 201 and created.json()["user"]["email"] == "ada@example.com"
        assert created.json()["user"]["role"] == "user"
        cookie = browser.cookies.get(SESSION_COOKIE)
        assert cookie and "httponly" in created.headers["set-cookie"].lower()
        assert "samesite=lax" in created.headers["set-cookie"].lower()
        assert browser.get("/api/auth/me").json()["email"] == "ada@example.com"
        again = browser.post("/api/auth/signup", json={"email": "ada@example.com", "password": PASSWORD})
        assert again.status_code == 409

        browser.headers["X-CSRF-Token"] = created.json()["csrf_token"]
        assert browser.post("/api/auth/logout").status_code == 204
        assert browser.get("/api/auth/me").status_code == 401
        browser.cookies.set(SESSION_COOKIE, cookie)  # a logged-out session stays dead
        assert browser.get("/api/auth/me").status_code == 401
        browser.cookies.clear()

        assert browser.post("/api/auth/login", json={"email": "ada@example.com", "password": "wrong password"}
                            ).status_code == 401
        sign_in(browser, "ADA@example.com")
        assert browser.get("/api/auth/me").status_code == 200


def test_cookie_requests_that_change_things_need_the_csrf_token(settings: Settings) -> None:
    user, token = new_user(settings)
    body = {"kind": "webhook", "target": "https://hooks.example.com/x"}
    with api_client(settings) as browser:
        csrf = sign_in(browser, user.email)
        del browser.headers["X-CSRF-Token"]
        assert browser.get("/api/endpoints").status_code == 200  # reading needs none
        refused = browser.post("/api/endpoints", json=body)
        assert refused.status_code == 403 and "CSRF" in refused.json()["detail"]
        assert browser.post("/api/endpoints", json=body, headers={"X-CSRF-Token": "forged"}).status_code == 403
        assert browser.post("/api/endpoints", json=body, headers={"X-CSRF-Token": csrf}).status_code == 201
        # An HTML form carries it as a field instead.
        form = browser.post("/endpoints", data={"kind": "webhook", "target": "https://h.example.com/y",
                                                "csrf_token": csrf})
        assert form.status_code == 200 and form.url.path == "/endpoints"  # redirected after the POST
    with api_client(settings, token) as api:  # API tokens are not sent by browsers on their own: no CSRF
        assert api.post("/api/endpoints", json=body).status_code == 201
        assert len(api.get("/api/endpoints").json()) == 3


def test_a_csrf_token_that_is_not_ascii_is_refused_not_a_server_error(settings: Settings) -> None:
    user, _ = new_user(settings)
    with api_client(settings) as browser:
        sign_in(browser, user.email)
        del browser.headers["X-CSRF-Token"]
        form = browser.post("/account/tokens", data={"name": "x", "csrf_token": "é"}, follow_redirects=False)
        header = browser.post("/api/tokens", json={"name": "x"}, headers={"X-CSRF-Token": "é".encode()})
        assert (form.status_code, header.status_code) == (403, 403)


def test_failed_logins_lock_the_address_out(settings: Settings) -> None:
    settings = settings.model_copy(update={"login_max_failures": 3})
    user, _ = new_user(settings)
    with api_client(settings) as browser:
        for _ in range(3):
            assert browser.post("/api/auth/login", json={"email": user.email, "password": "guess guess"}
                                ).status_code == 401
        locked = browser.post("/api/auth/login", json={"email": user.email, "password": PASSWORD})
        assert locked.status_code == 429 and int(locked.headers["retry-after"]) > 0


def test_api_tokens_are_shown_once_and_revocable(settings: Settings) -> None:
    user, _ = new_user(settings)
    with api_client(settings) as client:
        made = client.post("/api/auth/token", json={"email": user.email, "password": PASSWORD, "name": "ci"})
        assert made.status_code == 201 and made.json()["token"].startswith("tcs_")
        token = made.json()["token"]
        client.headers["Authorization"] = f"Bearer {token}"
        listed = client.get("/api/tokens").json()
        assert {t["name"] for t in listed} == {"tests", "ci"} and all("token" not in t for t in listed)
        assert client.delete(f"/api/tokens/{made.json()['id']}").status_code == 204
        revoked = client.get("/api/auth/me")
        assert revoked.status_code == 401 and revoked.headers["www-authenticate"] == "Bearer"
        client.headers["Authorization"] = "Basic abc"
        assert client.get("/api/auth/me").status_code == 401
        del client.headers["Authorization"]
        assert client.get("/api/subscriptions").status_code == 401


def test_users_neither_read_nor_change_each_others_subscriptions_endpoints_or_alerts(settings: Settings) -> None:
    _, token_a = new_user(settings, "a@example.com")
    _, token_b = new_user(settings, "b@example.com")
    with api_client(settings, token_a) as a, api_client(settings, token_b) as b:
        endpoint = a.post("/api/endpoints", json={"kind": "webhook", "target": "https://a.example.com/h"}).json()
        sub = a.post("/api/subscriptions", json={"name": "A's", "condition": CONDITION,
                                                 "endpoint_ids": [endpoint["id"]]}).json()
        RedisAlertSink(settings).write([_transition(sub["id"], "AAPL", "firing", 1_700_000_000_000)])
        assert a.get(f"/api/subscriptions/{sub['id']}/firing").json()["firing"].keys() == {"AAPL"}
        assert len(a.get(f"/api/subscriptions/{sub['id']}/alerts").json()["alerts"]) == 1

        assert b.get("/api/subscriptions").json() == [] and b.get("/api/endpoints").json() == []
        sid, eid = sub["id"], endpoint["id"]
        for method, path in [
            ("get", f"/api/subscriptions/{sid}"), ("put", f"/api/subscriptions/{sid}"),
            ("post", f"/api/subscriptions/{sid}/pause"), ("post", f"/api/subscriptions/{sid}/resume"),
            ("post", f"/api/subscriptions/{sid}/mute"), ("delete", f"/api/subscriptions/{sid}"),
            ("get", f"/api/subscriptions/{sid}/firing"), ("get", f"/api/subscriptions/{sid}/alerts"),
            ("get", f"/api/subscriptions/{sid}/deliveries"), ("get", f"/api/endpoints/{eid}"),
            ("post", f"/api/endpoints/{eid}/rotate-secret"), ("post", f"/api/endpoints/{eid}/test"),
            ("get", f"/api/endpoints/{eid}/deliveries"), ("delete", f"/api/endpoints/{eid}"),
        ]:
            body = {"name": "B's", "condition": CONDITION} if method == "put" else (
                {"until": None} if path.endswith("/mute") else None)
            response = b.request(method.upper(), path, json=body)
            assert response.status_code == 404, (method, path, response.text)
        stolen = b.post("/api/subscriptions", json={"name": "B's", "condition": CONDITION, "endpoint_ids": [eid]})
        assert stolen.status_code == 404

        # A's things are untouched, and B's view of the platform is empty.
        assert a.get(f"/api/subscriptions/{sid}").json()["active"] is True
        assert a.get(f"/api/endpoints/{eid}").status_code == 200
        assert a.get(f"/api/subscriptions/{sid}/firing").json()["firing"].keys() == {"AAPL"}


def test_operators_see_the_platform_users_do_not(settings: Settings) -> None:
    user, user_token = new_user(settings)
    operator, operator_token = new_user(settings, role="operator")
    with api_client(settings, user_token) as u, api_client(settings, operator_token) as o:
        u.post("/api/subscriptions", json={"name": "x", "condition": CONDITION})
        u.post("/api/subscriptions", json={"name": "y", "condition": "MAX(price) OVER 1m >= 3"})
        for path in ("/api/dead-letters", "/api/ops/overview", "/api/ops/samples"):
            assert u.get(path).status_code == 403, path
            assert o.get(path).status_code == 200, path
        overview = o.get("/api/ops/overview").json()
        assert overview["subscriptions"] == 2 and overview["users"] == 2
        assert {(g["aggregate"], g["attribute"], g["window"], g["active"]) for g in overview["load"]} == {
            ("SUM", "volume", "5m", 1), ("MAX", "price", "1m", 1)}
        assert o.get("/api/subscriptions").json() == []  # operators see load, not other users' subscriptions
    with api_client(settings) as browser:
        sign_in(browser, user.email)
        assert browser.get("/ops", headers={"accept": "text/html"}).status_code == 403
        sign_in(browser, operator.email)
        page = browser.get("/ops", headers={"accept": "text/html"})
        assert page.status_code == 200 and "Evaluator load" in page.text and "MAX" in page.text


def test_operator_rights_come_only_from_an_operators_invitation(settings: Settings) -> None:
    _, user_token = new_user(settings)
    _, operator_token = new_user(settings, role="operator")
    with api_client(settings.model_copy(update={"operator_emails": ["ops@example.com"]})) as browser:
        made = browser.post("/api/auth/signup", json={"email": "OPS@example.com", "password": PASSWORD})
        assert made.json()["user"]["role"] == "user"  # an address proves nothing
    with api_client(settings, user_token) as api:
        assert api.post("/api/invitations", json={"role": "operator"}).status_code == 403
    with api_client(settings, operator_token) as api:
        invited = api.post("/api/invitations", json={"role": "operator"})
        assert invited.status_code == 201 and invited.json()["token"] in invited.json()["signup_url"]
        token = invited.json()["token"]
    closed = settings.model_copy(update={"signup_open": False})
    with api_client(closed) as browser:
        assert browser.post("/api/auth/signup", json={"email": "x@example.com", "password": PASSWORD}
                            ).status_code == 403
        joined = browser.post("/api/auth/signup", json={"email": "new-op@example.com", "password": PASSWORD,
                                                         "invitation": token})
        assert joined.status_code == 201 and joined.json()["user"]["role"] == "operator"
        again = browser.post("/api/auth/signup", json={"email": "second@example.com", "password": PASSWORD,
                                                        "invitation": token})
        assert again.status_code == 422 and again.json()["detail"][0]["loc"] == ["body", "invitation"]
        forged = browser.post("/api/auth/signup", json={"email": "third@example.com", "password": PASSWORD,
                                                         "invitation": "made-up"})
        assert forged.status_code == 422


def test_per_user_limits(settings: Settings) -> None:
    settings = settings.model_copy(update={"user_max_subscriptions": 2, "user_max_endpoints": 1})
    _, token = new_user(settings)
    with api_client(settings, token) as api:
        for _ in range(2):
            assert api.post("/api/subscriptions", json={"name": "x", "condition": CONDITION}).status_code == 201
        over = api.post("/api/subscriptions", json={"name": "x", "condition": CONDITION})
        assert over.status_code == 403 and "at most 2 subscriptions" in over.json()["detail"]
        assert api.post("/api/endpoints", json={"kind": "email", "target": "a@example.com"}).status_code == 201
        assert api.post("/api/endpoints", json={"kind": "email", "target": "b@example.com"}).status_code == 403
    _, other = new_user(settings)  # limits are per user
    with api_client(settings, other) as api:
        assert api.post("/api/subscriptions", json={"name": "x", "condition": CONDITION}).status_code == 201


def test_alert_history_filters_and_pages(api: TestClient, settings: Settings) -> None:
    sid = api.post("/api/subscriptions", json={"name": "x", "condition": CONDITION}).json()["id"]
    base = 1_700_000_000_000
    transitions = []
    for i in range(30):
        key = ("AAPL", "MSFT", "IBM")[i % 3]
        transitions.append(_transition(sid, key, "firing" if i % 2 == 0 else "resolved", base + i * 60_000))
    RedisAlertSink(settings).write(transitions)
    RedisAlertSink(settings).write(transitions[:5])  # a replayed batch adds nothing

    everything = api.get(f"/api/subscriptions/{sid}/alerts", params={"limit": 1000}).json()
    assert [a["evaluated_at"] for a in everything["alerts"]] == [t["evaluated_at"] for t in reversed(transitions)]
    assert everything["next"] is None

    aapl_firing = api.get(f"/api/subscriptions/{sid}/alerts", params={"key": "AAPL", "state": "firing"}).json()
    expected = [t for t in transitions if t["key"] == "AAPL" and t["state"] == "firing"]
    assert [a["alert_id"] for a in aapl_firing["alerts"]] == [t["alert_id"] for t in reversed(expected)]

    window = api.get(f"/api/subscriptions/{sid}/alerts",
                     params={"since": base + 10 * 60_000, "until": base + 20 * 60_000}).json()["alerts"]
    assert sorted(a["evaluated_at"] for a in window) == [base + i * 60_000 for i in range(10, 20)]

    pages, cursor = [], None
    while True:
        page = api.get(f"/api/subscriptions/{sid}/alerts", params={"limit": 7, **({"before": cursor} if cursor else {})}
                       ).json()
        pages += page["alerts"]
        cursor = page["next"]
        if cursor is None:
            break
    assert [a["alert_id"] for a in pages] == [a["alert_id"] for a in everything["alerts"]]
    assert api.get(f"/api/subscriptions/{sid}/alerts", params={"before": "nonsense"}).status_code == 422


def test_endpoint_secrets_rotate_and_test_alerts_are_queued(api: TestClient, settings: Settings) -> None:
    endpoint = api.post("/api/endpoints", json={"kind": "webhook", "target": "https://hooks.example.com/x"}).json()
    rotated = api.post(f"/api/endpoints/{endpoint['id']}/rotate-secret")
    assert rotated.status_code == 200 and rotated.json()["secret"] not in (None, endpoint["secret"])
    assert "secret" not in api.get(f"/api/endpoints/{endpoint['id']}").json()
    email = api.post("/api/endpoints", json={"kind": "email", "target": "ops@example.com"}).json()
    assert api.post(f"/api/endpoints/{email['id']}/rotate-secret").status_code == 422

    queue = celery_queue_keys(settings)[0] + ":tests"  # test alerts have a lane (queue) of their own
    assert queue.endswith(lane_queue(settings, "tests"))
    client = redis.Redis.from_url(settings.redis_url)
    before = client.llen(queue)
    fired = api.post(f"/api/endpoints/{endpoint['id']}/test")
    assert fired.status_code == 202 and fired.json()["queued"] is True
    assert client.llen(queue) == before + 1
    assert api.delete(f"/api/endpoints/{endpoint['id']}").status_code == 204
    assert api.get(f"/api/endpoints/{endpoint['id']}").status_code == 404


def test_control_characters_are_refused_not_a_server_error(settings: Settings) -> None:
    """PostgreSQL refuses NUL in text: every free-text input says so as a 4xx, on both databases."""
    user, token = new_user(settings)
    with api_client(settings, token) as api:
        for path, body, field in [
            ("/api/auth/signup", {"email": "a\x00b@example.com", "password": PASSWORD}, "email"),
            ("/api/auth/login", {"email": "a\x00b@example.com", "password": PASSWORD}, "email"),
            ("/api/subscriptions", {"name": "a\x00b", "condition": CONDITION}, "name"),
            ("/api/subscriptions", {"name": "ok", "condition": "COUNT(*)\x00 OVER 1m > 1"}, "condition"),
            ("/api/tokens", {"name": "tab\x07"}, "name"),
            ("/api/endpoints", {"kind": "email", "target": "a\x00b@example.com"}, "target"),
        ]:
            response = api.post(path, json=body)
            assert response.status_code == 422, (path, response.text)
            assert response.json()["detail"][0]["loc"][:2] == ["body", field], (path, response.text)
    with api_client(settings) as browser:
        page = browser.post("/login", data={"email": "a\x00b@example.com", "password": PASSWORD,
                                            "csrf_token": form_csrf(browser)})
        assert page.status_code == 401 and "wrong e-mail address or password" in page.text
        sign_in(browser, user.email)
        refused = browser.post("/account/tokens", data={"name": "a\x00b"})
        assert refused.status_code == 422 and "control characters" in refused.text
