"""TOCSIN_SESSION_COOKIE_SECURE: secure-only cookies sign a browser in over HTTPS only (docs/production.md).

docker-compose.yml sets it and puts an HTTPS proxy in front of the web app. Over plain HTTP a browser never
sends a secure cookie back, not even the sign-in form's own CSRF cookie, so signing in fails: the setting
must go with HTTPS, and a plain-HTTP deployment on a trusted network turns it off.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from core.settings import Settings
from tests.users import PASSWORD, form_csrf, new_user
from web.app import create_app
from web.auth import SESSION_COOKIE
from web.pages.auth import PRE_SESSION_COOKIE


def sign_in_with_the_form(settings: Settings, base_url: str) -> tuple[int, list[str], int]:
    """Sign in with the form as a browser at ``base_url`` would: (the form's status, the cookies set on the way,
    /api/auth/me's status after it)."""
    user, _ = new_user(settings)
    with TestClient(create_app(settings), base_url=base_url) as browser:
        form = browser.get("/login")
        csrf = form_csrf(browser, "/login")
        signed_in = browser.post("/login", data={"email": user.email, "password": PASSWORD, "csrf_token": csrf},
                                 follow_redirects=False)
        cookies = form.headers.get_list("set-cookie") + signed_in.headers.get_list("set-cookie")
        return signed_in.status_code, cookies, browser.get("/api/auth/me").status_code


def secure(cookies: list[str], name: str) -> bool:
    """Whether every ``name`` cookie set was secure-only (each form page sets a new one where none came back)."""
    flags = {"; secure" in c.lower() for c in cookies if c.startswith(f"{name}=")}
    assert len(flags) == 1, f"{name} cookies: {cookies}"
    return flags.pop()


def test_secure_cookies_sign_in_over_https(settings: Settings) -> None:
    status, cookies, me = sign_in_with_the_form(settings.model_copy(update={"session_cookie_secure": True}),
                                                "https://tocsin.test")
    assert status == 303 and me == 200
    assert secure(cookies, PRE_SESSION_COOKIE) and secure(cookies, SESSION_COOKIE)


def test_secure_cookies_cannot_sign_in_over_plain_http(settings: Settings) -> None:
    """What compose's setting does without its proxy: the form's CSRF cookie never comes back."""
    status, cookies, me = sign_in_with_the_form(settings.model_copy(update={"session_cookie_secure": True}),
                                                "http://tocsin.test")
    assert secure(cookies, PRE_SESSION_COOKIE)
    assert status == 403 and me == 401


@pytest.mark.parametrize("value", ["false", "true"])
def test_the_environment_setting_decides_plain_http(settings: Settings, monkeypatch: pytest.MonkeyPatch,
                                                    value: str) -> None:
    """TOCSIN_SESSION_COOKIE_SECURE=false (a trusted network without TLS): signing in works over HTTP."""
    monkeypatch.setenv("TOCSIN_SESSION_COOKIE_SECURE", value)
    from_env = Settings(**settings.model_dump(exclude={"session_cookie_secure"}))
    assert from_env.session_cookie_secure is (value == "true")
    status, cookies, me = sign_in_with_the_form(from_env, "http://tocsin.test")
    assert secure(cookies, PRE_SESSION_COOKIE) is from_env.session_cookie_secure
    assert (status, me) == ((403, 401) if from_env.session_cookie_secure else (303, 200))
