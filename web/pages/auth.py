"""Signing in, signing up and signing out: the pages that come before (or end) a browser session."""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Mapping
from typing import Annotated, Any

from fastapi import APIRouter, Form, HTTPException, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import ValidationError

from subscriptions.errors import Conflict, FieldError
from subscriptions.schemas import SignUpIn
from web.auth import check_password, sign_in, sign_out
from web.deps import AccountsDep, SettingsDep
from web.limits import LimiterDep, client_address
from web.pages.common import Page, form_errors, render

router = APIRouter(include_in_schema=False)

# Sign-in and sign-up forms come before any session, so their CSRF token is a random cookie the form
# repeats (double submit): another site can make a browser post the form, but cannot read the cookie.
PRE_SESSION_COOKIE = "tocsin_csrf"
FORM_EXPIRED = "the form expired; please try again"


def _safe_next(target: str | None) -> str:
    return target if target and target.startswith("/") and not target.startswith("//") else "/"


def _anonymous_form(request: Request, template: str, status_code: int = 200, headers: Mapping[str, str] | None = None,
                    **context: Any) -> HTMLResponse:
    """A sign-in or sign-up page with its pre-session CSRF token (the cookie is set if missing).

    ``headers``: those of the error shown, so a 429 or 503 keeps its Retry-After.
    """
    token = request.cookies.get(PRE_SESSION_COOKIE) or secrets.token_urlsafe(32)
    response = render(request, template, status_code=status_code, csrf=token, **context)
    response.headers.update(headers or {})
    response.set_cookie(PRE_SESSION_COOKIE, token, httponly=True, samesite="strict", path="/",
                        secure=request.app.state.settings.session_cookie_secure)
    return response


def _pre_session_csrf_ok(request: Request, sent: str) -> bool:
    cookie = request.cookies.get(PRE_SESSION_COOKIE)
    if not cookie:
        return False
    return hmac.compare_digest(sent.encode(), cookie.encode())


@router.get("/login", response_class=HTMLResponse)
def login_page(request: Request, next: str = "/") -> HTMLResponse:  # noqa: A002 -- the ?next= of the sign-in link
    return _anonymous_form(request, "login.html", next=_safe_next(next))


@router.post("/login")
def login(request: Request, accounts: AccountsDep, limiter: LimiterDep, settings: SettingsDep,
          email: Annotated[str, Form()] = "", password: Annotated[str, Form()] = "",
          next: Annotated[str, Form()] = "/", csrf_token: Annotated[str, Form()] = "") -> Response:  # noqa: A002 -- the form field
    try:
        if not _pre_session_csrf_ok(request, csrf_token):
            raise HTTPException(status.HTTP_403_FORBIDDEN, FORM_EXPIRED)
        user = check_password(accounts, limiter, request, email, password)
    except HTTPException as exc:
        return _anonymous_form(request, "login.html", error=exc.detail, email=email, next=_safe_next(next),
                               status_code=exc.status_code, headers=exc.headers)
    response = RedirectResponse(_safe_next(next), status_code=status.HTTP_303_SEE_OTHER)
    sign_in(response, accounts, settings, user)
    return response


@router.get("/signup", response_class=HTMLResponse)
def signup_page(request: Request, settings: SettingsDep, invitation: str = "") -> HTMLResponse:
    return _anonymous_form(request, "signup.html", closed=not settings.signup_open and not invitation, errors={},
                           invitation=invitation)


@router.post("/signup")
def signup(request: Request, accounts: AccountsDep, settings: SettingsDep, limiter: LimiterDep,
           email: Annotated[str, Form()] = "", password: Annotated[str, Form()] = "",
           invitation: Annotated[str, Form()] = "", csrf_token: Annotated[str, Form()] = "") -> Response:
    form: dict[str, Any] = {"email": email, "invitation": invitation}
    if not settings.signup_open and not invitation:
        return _anonymous_form(request, "signup.html", closed=True, errors={}, status_code=403, **form)
    try:
        if not _pre_session_csrf_ok(request, csrf_token):
            raise FieldError("form", FORM_EXPIRED)
        limiter.hit(settings.rate_sign_up_client, "sign-up", client_address(request), what="sign-ups")
        data = SignUpIn(email=email, password=password, invitation=invitation or None)
        user = accounts.sign_up(data.email, data.password, invitation=data.invitation)
    except ValidationError as exc:
        return _anonymous_form(request, "signup.html", errors=form_errors(exc), status_code=422, **form)
    except FieldError as exc:
        code = 403 if exc.field == "form" else 422
        return _anonymous_form(request, "signup.html", errors={exc.field: str(exc)}, status_code=code, **form)
    except HTTPException as exc:
        return _anonymous_form(request, "signup.html", errors={"form": exc.detail}, status_code=exc.status_code,
                               headers=exc.headers, **form)
    except Conflict as exc:
        return _anonymous_form(request, "signup.html", errors={"email": str(exc)}, status_code=409, **form)
    response = RedirectResponse("/", status_code=status.HTTP_303_SEE_OTHER)
    sign_in(response, accounts, settings, user)
    return response


@router.post("/logout")
def logout(request: Request, accounts: AccountsDep, _principal: Page) -> Response:
    response = RedirectResponse("/login", status_code=status.HTTP_303_SEE_OTHER)
    sign_out(request, response, accounts)
    return response
