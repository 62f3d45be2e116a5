"""Accounts: sign-up (open, or by an operator's invitation), sign-in (session cookie + CSRF token), API tokens.

Sign-in and sign-up take JSON only (a cross-site HTML form cannot send it), and
the HTML forms carry a pre-session CSRF token (see ``web.pages.auth``).
"""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request, Response, status

from subscriptions.models import ApiToken, User, WebSession
from subscriptions.schemas import (
    Credentials,
    InvitationIn,
    InvitationOut,
    LoginTokenIn,
    PasswordChanged,
    PasswordChangeIn,
    SessionOut,
    SignUpIn,
    TokenCreated,
    TokenIn,
    TokenOut,
    UserOut,
)
from web.auth import check_password, sign_in, sign_out, wrong_current_password
from web.deps import AccountsDep, IdPath, OperatorDep, PrincipalDep, SettingsDep, UserDep
from web.limits import LimiterDep, client_address

router = APIRouter(prefix="/api", tags=["accounts"])


def _session_out(user: User, web_session: WebSession) -> SessionOut:
    return SessionOut(user=UserOut.model_validate(user), csrf_token=web_session.csrf_token)


def _token_created(token: str, api_token: ApiToken) -> TokenCreated:
    return TokenCreated.model_validate({**TokenOut.model_validate(api_token).model_dump(), "token": token})


@router.post("/auth/signup", status_code=status.HTTP_201_CREATED, response_model=SessionOut)
def sign_up(data: SignUpIn, request: Request, response: Response, accounts: AccountsDep, settings: SettingsDep,
            limiter: LimiterDep) -> SessionOut:
    """Create an account and sign in (the session cookie is set); an invitation grants its role."""
    if not settings.signup_open and data.invitation is None:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "sign-up is closed; ask an operator for an invitation")
    limiter.hit(settings.rate_sign_up_client, "sign-up", client_address(request), what="sign-ups")
    user = accounts.sign_up(data.email, data.password, invitation=data.invitation)
    return _session_out(user, sign_in(response, accounts, settings, user))


@router.post("/auth/login", response_model=SessionOut)
def log_in(data: Credentials, request: Request, response: Response, accounts: AccountsDep, limiter: LimiterDep,
           settings: SettingsDep) -> SessionOut:
    """Sign in with e-mail and password; sets the session cookie and returns the CSRF token."""
    user = check_password(accounts, limiter, request, data.email, data.password)
    return _session_out(user, sign_in(response, accounts, settings, user))


@router.post("/auth/logout", status_code=status.HTTP_204_NO_CONTENT)
def log_out(request: Request, accounts: AccountsDep, _user: UserDep) -> Response:
    response = Response(status_code=status.HTTP_204_NO_CONTENT)
    sign_out(request, response, accounts)
    return response


@router.get("/auth/me", response_model=UserOut)
def me(user: UserDep) -> UserOut:
    return UserOut.model_validate(user)


@router.post("/auth/password", response_model=PasswordChanged)
def change_password(data: PasswordChangeIn, request: Request, principal: PrincipalDep, user: UserDep,
                    accounts: AccountsDep, limiter: LimiterDep) -> PasswordChanged:
    """Change the password. Every other browser session ends and every API token is revoked (the one
    this request used too); the current-password check counts toward the sign-in lock-out."""
    check_password(accounts, limiter, request, user.email, data.current_password, wrong=wrong_current_password())
    sessions, tokens = accounts.change_password(user, data.new_password,
                                                keep_session=principal.web_session if principal else None)
    return PasswordChanged(revoked_sessions=sessions, revoked_tokens=tokens, detail=(
        f"password changed; {sessions} other browser session(s) signed out and {tokens} API token(s) revoked"))


@router.post("/invitations", status_code=status.HTTP_201_CREATED, response_model=InvitationOut)
def invite(data: InvitationIn, request: Request, operator: OperatorDep, accounts: AccountsDep) -> InvitationOut:
    """An invitation to sign up with a role (operators only): single use, valid for ``invitation_ttl_s``."""
    token, invitation = accounts.invite(operator, data.role)
    return InvitationOut(token=token, role=invitation.role, expires_at=invitation.expires_at,
                         signup_url=str(request.url_for("signup_page").include_query_params(invitation=token)))


@router.post("/auth/token", status_code=status.HTTP_201_CREATED, response_model=TokenCreated)
def token_for_credentials(data: LoginTokenIn, request: Request, accounts: AccountsDep,
                          limiter: LimiterDep) -> TokenCreated:
    """Exchange e-mail and password for a new API token (for scripts and curl)."""
    user = check_password(accounts, limiter, request, data.email, data.password)
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
