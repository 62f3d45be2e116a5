"""The account page: API tokens (made, shown once, revoked) and the password change."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, HTTPException, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import ValidationError

from subscriptions.errors import FieldError, Forbidden
from subscriptions.schemas import TokenIn
from web.auth import check_password, wrong_current_password
from web.deps import AccountsDep, IdPath, KeysDep, RedisDep
from web.limits import LimiterDep
from web.pages.common import Page, flash, form_errors, render, take_flash

router = APIRouter(include_in_schema=False)


@router.get("/account", response_class=HTMLResponse)
def account_page(request: Request, principal: Page, accounts: AccountsDep, redis_client: RedisDep,
                 keys: KeysDep) -> HTMLResponse:
    shown = take_flash(redis_client, keys, principal)
    return render(request, "account.html", principal, tokens=accounts.tokens(principal.user), errors={},
                  new_token=shown.get("token"), password_changed=shown.get("password_changed"))


@router.post("/account/tokens")
def create_token(request: Request, principal: Page, accounts: AccountsDep, redis_client: RedisDep, keys: KeysDep,
                 name: Annotated[str, Form()] = "") -> Response:
    try:
        token, _ = accounts.create_token(principal.user, TokenIn(name=name.strip()).name)
    except ValidationError as exc:
        errors = {"name": f"the token's name {next(iter(form_errors(exc).values()))}"}
    except Forbidden as exc:
        errors = {"name": str(exc)}
    else:
        flash(redis_client, keys, principal, token=token)
        return RedirectResponse("/account", status_code=status.HTTP_303_SEE_OTHER)
    return render(request, "account.html", principal, tokens=accounts.tokens(principal.user), new_token=None,
                  errors=errors, status_code=422)


@router.post("/account/password")
def change_password(request: Request, principal: Page, accounts: AccountsDep, limiter: LimiterDep,
                    redis_client: RedisDep, keys: KeysDep, current_password: Annotated[str, Form()] = "",
                    new_password: Annotated[str, Form()] = "") -> Response:
    """Other sessions end and every API token is revoked; the page says how many."""
    user = principal.user
    try:
        check_password(accounts, limiter, request, user.email, current_password, wrong=wrong_current_password())
        sessions, tokens = accounts.change_password(user, new_password, keep_session=principal.web_session)
    except HTTPException as exc:
        errors, code = {"password": exc.detail}, exc.status_code
    except FieldError as exc:
        errors, code = {"password": f"the new password {exc}"}, 422
    else:
        flash(redis_client, keys, principal, password_changed=(
            f"Password changed: {sessions} other browser session(s) signed out, {tokens} API token(s) revoked."))
        return RedirectResponse("/account", status_code=status.HTTP_303_SEE_OTHER)
    return render(request, "account.html", principal, tokens=accounts.tokens(user), new_token=None, errors=errors,
                  status_code=code)


@router.post("/account/tokens/{token_id}/revoke")
def revoke_token(token_id: IdPath, principal: Page, accounts: AccountsDep) -> Response:
    accounts.revoke_token(principal.user, token_id)
    return Response(headers={"HX-Redirect": "/account"})
