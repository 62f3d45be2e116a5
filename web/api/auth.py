"""Accounts: sign-up, sign-in (session cookie + CSRF token), API tokens."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request, Response, status

from subscriptions.schemas import (
    Credentials,
    LoginTokenIn,
    PasswordChangeIn,
    SessionOut,
    SignUpIn,
    TokenCreated,
    TokenIn,
    TokenOut,
    UserOut,
)
from web.auth import check_password, sign_in, sign_out
from web.deps import AccountsDep, IdPath, RedisDep, SettingsDep, UserDep

router = APIRouter(prefix="/api", tags=["accounts"])


def _session_out(user, web_session) -> SessionOut:  # noqa: ANN001
    return SessionOut(user=UserOut.model_validate(user), csrf_token=web_session.csrf_token)


def _token_created(token: str, api_token) -> TokenCreated:  # noqa: ANN001
    return TokenCreated.model_validate({**TokenOut.model_validate(api_token).model_dump(), "token": token})


@router.post("/auth/signup", status_code=status.HTTP_201_CREATED, response_model=SessionOut)
def sign_up(data: SignUpIn, response: Response, accounts: AccountsDep, settings: SettingsDep) -> SessionOut:
    """Create an account and sign in (the session cookie is set)."""
    if not settings.signup_open:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "sign-up is closed; ask an operator for an account")
    user = accounts.sign_up(data.email, data.password)
    return _session_out(user, sign_in(response, accounts, settings, user))


@router.post("/auth/login", response_model=SessionOut)
def log_in(data: Credentials, response: Response, accounts: AccountsDep, redis_client: RedisDep,
           settings: SettingsDep) -> SessionOut:
    """Sign in with e-mail and password; sets the session cookie and returns the CSRF token."""
    user = check_password(accounts, redis_client, settings, data.email, data.password)
    return _session_out(user, sign_in(response, accounts, settings, user))


@router.post("/auth/logout", status_code=status.HTTP_204_NO_CONTENT)
def log_out(request: Request, accounts: AccountsDep, _user: UserDep) -> Response:
    response = Response(status_code=status.HTTP_204_NO_CONTENT)
    sign_out(request, response, accounts)
    return response


@router.get("/auth/me", response_model=UserOut)
def me(user: UserDep) -> UserOut:
    return UserOut.model_validate(user)


@router.post("/auth/password", status_code=status.HTTP_204_NO_CONTENT)
def change_password(data: PasswordChangeIn, user: UserDep, accounts: AccountsDep) -> Response:
    """Change the password; every browser session of the account ends."""
    accounts.change_password(user, data.current_password, data.new_password)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/auth/token", status_code=status.HTTP_201_CREATED, response_model=TokenCreated)
def token_for_credentials(data: LoginTokenIn, accounts: AccountsDep, redis_client: RedisDep,
                          settings: SettingsDep) -> TokenCreated:
    """Exchange e-mail and password for a new API token (for scripts and curl)."""
    user = check_password(accounts, redis_client, settings, data.email, data.password)
    return _token_created(*accounts.create_token(user, data.name))


@router.get("/tokens", response_model=list[TokenOut])
def list_tokens(user: UserDep, accounts: AccountsDep) -> list[TokenOut]:
    return [TokenOut.model_validate(t) for t in accounts.tokens(user)]


@router.post("/tokens", status_code=status.HTTP_201_CREATED, response_model=TokenCreated)
def create_token(data: TokenIn, user: UserDep, accounts: AccountsDep) -> TokenCreated:
    return _token_created(*accounts.create_token(user, data.name))


@router.delete("/tokens/{token_id}", status_code=status.HTTP_204_NO_CONTENT)
def revoke_token(token_id: IdPath, user: UserDep, accounts: AccountsDep) -> Response:
    accounts.revoke_token(user, token_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
