"""Signing in and out, shared by the JSON API and the HTML pages.

Password checks are counted per address in Redis *before* the password is
verified (``web.limits``): past ``login_max_failures`` within ``login_lockout_s``
the address is locked out (429) until the window ends, however many requests
race, which makes guessing passwords slow. A successful sign-in clears the count.
The current-password check of a password change counts the same way. A
locked-out account keeps its browser sessions and API tokens: a stranger's
failed guesses cannot cut it off.
"""

from __future__ import annotations

from fastapi import HTTPException, Request, Response, status

from core.settings import Settings
from subscriptions.accounts import AccountService
from subscriptions.models import User, WebSession
from subscriptions.schemas import EMAIL_ADDRESS
from web.deps import SESSION_COOKIE
from web.limits import RateLimiter, client_address

WRONG_CREDENTIALS = "wrong e-mail address or password"


def check_password(accounts: AccountService, limiter: RateLimiter, request: Request, email: str, password: str,
                   wrong: HTTPException | None = None) -> User:
    """The user with these credentials; ``wrong`` (401) if not, 429 while the address or client is limited."""
    wrong = wrong or HTTPException(status.HTTP_401_UNAUTHORIZED, WRONG_CREDENTIALS)
    limiter.hit(accounts.settings.rate_sign_in_client, "sign-in", client_address(request), what="sign-in attempts")
    email = email.strip().lower()
    if not EMAIL_ADDRESS.match(email):  # no account has such an address (and PostgreSQL refuses NUL in a query)
        raise wrong
    limiter.login_attempt(email)
    user = accounts.authenticate(email, password)
    if user is None:
        raise wrong
    limiter.login_succeeded(email)
    return user


def wrong_current_password() -> HTTPException:
    """What a password change answers to a wrong current password (it counts toward the lock-out)."""
    return HTTPException(status.HTTP_403_FORBIDDEN, "the current password is wrong")


def sign_in(response: Response, accounts: AccountService, settings: Settings, user: User) -> WebSession:
    token, web_session = accounts.start_session(user)
    response.set_cookie(SESSION_COOKIE, token, max_age=settings.session_ttl_s, httponly=True, samesite="lax",
                        secure=settings.session_cookie_secure, path="/")
    return web_session


def sign_out(request: Request, response: Response, accounts: AccountService) -> None:
    if token := request.cookies.get(SESSION_COOKIE):
        accounts.end_session(token)
    response.delete_cookie(SESSION_COOKIE, path="/")
