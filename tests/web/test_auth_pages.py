"""Sign-in, sign-up, password and invitation pages: CSRF before a session, what a change revokes."""

from __future__ import annotations

import re

from core.settings import Settings
from tests.users import PASSWORD, api_client, form_csrf, new_user, sign_in
from web.pages.auth import PRE_SESSION_COOKIE

HTML = {"accept": "text/html"}


def test_sign_in_and_sign_up_forms_need_their_csrf_token(settings: Settings) -> None:
    user, _ = new_user(settings)
    with api_client(settings) as browser:
        forged = browser.post("/login", data={"email": user.email, "password": PASSWORD}, follow_redirects=False)
        assert forged.status_code == 403 and "form expired" in forged.text
        csrf = form_csrf(browser, "/login")
        wrong = browser.post("/login", data={"email": user.email, "password": PASSWORD, "csrf_token": "x" + csrf},
                             follow_redirects=False)
        assert wrong.status_code == 403
        signed_in = browser.post("/login", data={"email": user.email, "password": PASSWORD, "csrf_token": csrf},
                                 follow_redirects=False)
        assert signed_in.status_code == 303
    with api_client(settings) as browser:
        assert browser.post("/signup", data={"email": "new@example.com", "password": PASSWORD}).status_code == 403
        csrf = form_csrf(browser, "/signup")
        assert browser.cookies.get(PRE_SESSION_COOKIE) == csrf
        weak = browser.post("/signup", data={"email": "new@example.com", "password": " " * 12, "csrf_token": csrf})
        assert weak.status_code == 422 and 'data-field="password"' in weak.text
        made = browser.post("/signup", data={"email": "new@example.com", "password": PASSWORD, "csrf_token": csrf},
                            follow_redirects=False)
        assert made.status_code == 303


def test_password_change_page_says_what_it_revoked(settings: Settings) -> None:
    user, token = new_user(settings)
    with api_client(settings) as other, api_client(settings) as browser:
        sign_in(other, user.email)
        sign_in(browser, user.email)
        wrong = browser.post("/account/password", data={"current_password": "nope nope nope",
                                                        "new_password": "a new passphrase"})
        assert wrong.status_code == 403 and "current password is wrong" in wrong.text
        done = browser.post("/account/password", data={"current_password": PASSWORD,
                                                       "new_password": "a new passphrase"})
        main = done.text[done.text.index("<main"):]
        assert done.status_code == 200 and "1 other browser session(s) signed out, 1 API token(s) revoked" in main
        assert other.get("/api/auth/me").status_code == 401
        assert browser.get("/api/auth/me", headers={"Authorization": f"Bearer {token}"}).status_code == 401


def test_an_operator_invites_an_operator_on_the_ops_page(settings: Settings) -> None:
    operator, _ = new_user(settings, role="operator")
    closed = settings.model_copy(update={"signup_open": False})
    with api_client(closed) as browser:
        sign_in(browser, operator.email)
        page = browser.post("/ops/invitations", data={"role": "operator"})
        url = re.search(r'id="new-invitation">([^<]+)<', page.text)[1].replace("&amp;", "&")
        assert "new-invitation" not in browser.get("/ops", headers=HTML).text  # shown once
    with api_client(closed) as invited:
        assert "Sign-up is closed" in invited.get("/signup").text
        form = invited.get(url.removeprefix("http://testserver"))
        assert "You were invited" in form.text
        csrf = re.search(r'name="csrf_token" value="([^"]+)"', form.text)[1]
        token = re.search(r'name="invitation" value="([^"]+)"', form.text)[1]
        joined = invited.post("/signup", data={"email": "op2@example.com", "password": PASSWORD, "csrf_token": csrf,
                                               "invitation": token}, follow_redirects=False)
        assert joined.status_code == 303
        assert invited.get("/api/auth/me").json()["role"] == "operator"


def test_a_rate_limited_preview_says_so_in_place(settings: Settings) -> None:
    settings = settings.model_copy(update={"rate_preview_account": "1/minute", "preview_timeout_s": 0.1})
    user, _ = new_user(settings)
    with api_client(settings) as browser:
        sign_in(browser, user.email)
        assert browser.post("/conditions/preview", data={"condition": "COUNT(*) OVER 1m > 1"}).status_code == 200
        limited = browser.post("/conditions/preview", data={"condition": "COUNT(*) OVER 1m > 1"})
        assert limited.status_code == 429 and "too many previews" in limited.text
