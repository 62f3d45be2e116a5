"""Rate limits, the sign-in lock-out and per-user quotas, under real concurrency against a real server,
on SQLite and PostgreSQL."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx

from core.settings import Settings
from tests.servers import serving
from tests.users import PASSWORD, api_client, new_user, sign_in
from web.app import create_app

PARALLEL = 24
CONDITION = "COUNT(*) OVER 1m > 1"


def _in_parallel(url: str, requests: list[tuple[str, str, dict]], headers: dict | None = None) -> list[int]:
    """Status codes of ``requests`` (method, path, JSON) sent at once, one connection each."""
    def send(request: tuple[str, str, dict]) -> int:
        method, path, body = request
        with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
            return client.request(method, path, json=body).status_code

    with ThreadPoolExecutor(max_workers=len(requests)) as pool:
        return list(pool.map(send, requests))


def test_parallel_wrong_passwords_get_at_most_max_failures_checks(settings: Settings) -> None:
    settings = settings.model_copy(update={"login_max_failures": 5, "rate_sign_in_client": "1000/minute"})
    user, _ = new_user(settings)
    with serving(create_app(settings)) as url:
        codes = _in_parallel(url, [("POST", "/api/auth/login", {"email": user.email, "password": f"guess {i}"})
                                   for i in range(PARALLEL)])
        assert codes.count(401) <= 5 and codes.count(401) + codes.count(429) == PARALLEL, codes
        right = httpx.post(f"{url}/api/auth/login", json={"email": user.email, "password": PASSWORD})
        assert right.status_code == 429 and int(right.headers["retry-after"]) > 0  # locked: even the right one


def test_the_lock_out_is_one_per_address_whatever_its_case_or_surrounding_spaces(settings: Settings) -> None:
    settings = settings.model_copy(update={"login_max_failures": 5, "rate_sign_in_client": "1000/minute"})
    user, _ = new_user(settings)
    local, domain = user.email.split("@")
    variants = [user.email.upper(), f" {user.email}", f"{user.email}\t", local.title() + "@" + domain.upper(),
                f"\u00a0{user.email}"]
    with serving(create_app(settings)) as url:
        codes = _in_parallel(url, [("POST", "/api/auth/login", {"email": variants[i % len(variants)],
                                                                 "password": f"guess {i}"}) for i in range(PARALLEL)])
        assert codes.count(401) <= 5 and codes.count(401) + codes.count(429) == PARALLEL, codes
        right = httpx.post(f"{url}/api/auth/login", json={"email": user.email, "password": PASSWORD})
        assert right.status_code == 429


def test_parallel_creates_stop_exactly_at_the_quota(settings: Settings) -> None:
    # One account's PARALLEL requests all in progress at once: above its default bound (web.tenants), and each
    # with a connection of its own while it waits for the lock on the user's row.
    settings = settings.model_copy(update={"user_max_subscriptions": 5, "user_max_endpoints": 4,
                                           "user_max_tokens": 3, "account_max_requests": PARALLEL,
                                           "web_db_max_overflow": PARALLEL})
    _, token = new_user(settings)  # holds one of the 3 tokens
    headers = {"Authorization": f"Bearer {token}"}
    with serving(create_app(settings)) as url:
        for path, body, quota in [("/api/subscriptions", {"name": "x", "condition": CONDITION}, 5),
                                  ("/api/endpoints", {"kind": "email", "target": "a@example.com"}, 4),
                                  ("/api/tokens", {"name": "t"}, 2)]:
            codes = _in_parallel(url, [("POST", path, body)] * PARALLEL, headers)
            assert codes.count(201) == quota and codes.count(403) == PARALLEL - quota, (path, codes)
            listed = httpx.get(f"{url}{path}", headers=headers).json()
            assert len(listed) == (quota + 1 if path == "/api/tokens" else quota), path


def test_sign_in_sign_up_previews_and_test_alerts_are_rate_limited(settings: Settings) -> None:
    settings = settings.model_copy(update={
        "rate_sign_in_client": "3/minute", "rate_sign_up_client": "2/hour", "rate_preview_account": "2/minute",
        "rate_test_alert_account": "2/minute", "preview_timeout_s": 0.1})
    user, token = new_user(settings)
    with api_client(settings) as browser:
        for i in range(3):
            assert browser.post("/api/auth/login", json={"email": f"n{i}@example.com", "password": "x"}
                                ).status_code == 401
        limited = browser.post("/api/auth/login", json={"email": user.email, "password": PASSWORD})
        assert limited.status_code == 429 and int(limited.headers["retry-after"]) > 0
        for i in range(2):
            assert browser.post("/api/auth/signup", json={"email": f"s{i}@example.com", "password": PASSWORD}
                                ).status_code == 201
        assert browser.post("/api/auth/signup", json={"email": "s3@example.com", "password": PASSWORD}
                            ).status_code == 429
    with api_client(settings, token) as api:
        for _ in range(2):
            assert api.post("/api/conditions/preview", json={"condition": CONDITION}).status_code == 200
        assert api.post("/api/conditions/preview", json={"condition": CONDITION}).status_code == 429
        endpoint = api.post("/api/endpoints", json={"kind": "email", "target": "a@example.com"}).json()["id"]
        for _ in range(2):
            assert api.post(f"/api/endpoints/{endpoint}/test").status_code == 202
        over = api.post(f"/api/endpoints/{endpoint}/test")
        assert over.status_code == 429 and "test alerts" in over.json()["detail"]
    _, other = new_user(settings)  # per account: another user still may
    with api_client(settings, other) as api:
        assert api.post("/api/conditions/preview", json={"condition": CONDITION}).status_code == 200


def test_password_change_revokes_other_sessions_and_every_token(settings: Settings) -> None:
    settings = settings.model_copy(update={"login_max_failures": 3})
    user, token = new_user(settings)
    new_password = "a brand new passphrase"
    with api_client(settings) as other_browser, api_client(settings) as browser:
        sign_in(other_browser, user.email)
        sign_in(browser, user.email)
        weak = browser.post("/api/auth/password", json={"current_password": PASSWORD, "new_password": " " * 12})
        assert weak.status_code == 422 and weak.json()["detail"][0]["loc"] == ["body", "password"]
        same = browser.post("/api/auth/password", json={"current_password": PASSWORD, "new_password": user.email})
        assert same.status_code == 422
        changed = browser.post("/api/auth/password", json={"current_password": PASSWORD,
                                                           "new_password": new_password})
        assert changed.status_code == 200, changed.text
        assert changed.json()["revoked_sessions"] == 1 and changed.json()["revoked_tokens"] == 1
        assert "revoked" in changed.json()["detail"]
        assert browser.get("/api/auth/me").status_code == 200  # this session stays
        assert other_browser.get("/api/auth/me").status_code == 401
        assert browser.get("/api/auth/me", headers={"Authorization": f"Bearer {token}"}).status_code == 401
        for _ in range(3):  # the current-password check counts toward the lock-out
            assert browser.post("/api/auth/password", json={"current_password": "wrong wrong",
                                                            "new_password": "another passphrase"}
                                ).status_code == 403
        assert browser.post("/api/auth/password", json={"current_password": new_password,
                                                        "new_password": "another passphrase"}).status_code == 429


def test_password_rules(settings: Settings) -> None:
    with api_client(settings) as browser:
        for password, message in [(" " * 20, "at least 10"), ("  short1  \t ", "at least 10"),
                                  ("x" * 257, "at most 256"), ("Ada@Example.com", "e-mail")]:
            refused = browser.post("/api/auth/signup", json={"email": "ada@example.com", "password": password})
            assert refused.status_code == 422 and message in refused.text, (password, refused.text)


def test_an_invitation_works_once_even_in_parallel_and_not_after_it_expires(settings: Settings) -> None:
    from datetime import UTC, datetime, timedelta

    from sqlalchemy import update

    from subscriptions.db import session_factory
    from subscriptions.models import Invitation

    _, operator_token = new_user(settings, role="operator")
    with api_client(settings, operator_token) as api:
        raced = api.post("/api/invitations", json={"role": "operator"}).json()["token"]
        expired = api.post("/api/invitations", json={"role": "operator"}).json()["token"]
    with session_factory(settings.database_url)() as session:
        session.execute(update(Invitation).where(Invitation.id == 2)
                        .values(expires_at=datetime.now(UTC) - timedelta(seconds=1)))
        session.commit()
    settings = settings.model_copy(update={"rate_sign_up_client": "1000/minute"})
    with serving(create_app(settings)) as url:
        codes = _in_parallel(url, [("POST", "/api/auth/signup", {"email": f"op{i}@example.com", "password": PASSWORD,
                                                                  "invitation": raced}) for i in range(PARALLEL)])
        assert codes.count(201) == 1 and codes.count(422) == PARALLEL - 1, codes
        late = httpx.post(f"{url}/api/auth/signup", json={"email": "late@example.com", "password": PASSWORD,
                                                            "invitation": expired})
        assert late.status_code == 422 and "expired" in late.text
