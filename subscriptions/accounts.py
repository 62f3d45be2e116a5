"""Users, browser sessions and API tokens.

Passwords are hashed with Argon2id (re-hashed on login when the parameters move
on). Session cookies, API tokens and invitations are random 256-bit strings of
which only the SHA-256 is stored, so a leaked database opens no account.

Operator rights come only from the admin CLI (``subscriptions.admin``) or from an
invitation an operator issued: single use, expiring, carrying the role it grants.
"""

from __future__ import annotations

import functools
import hashlib
import secrets
from datetime import UTC, datetime, timedelta
from typing import cast

from argon2 import PasswordHasher, profiles
from argon2.exceptions import InvalidHashError, VerificationError
from sqlalchemy import CursorResult, Result, delete, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from core.settings import Settings
from core.timestamps import as_utc
from subscriptions.errors import Conflict, FieldError, Forbidden, NotFound
from subscriptions.models import ROLES, ApiToken, Invitation, User, WebSession

TOKEN_PREFIX = "tcs_"  # API tokens are recognisable (secret scanners, logs)

_PROFILES = {"rfc9106-low-memory": profiles.RFC_9106_LOW_MEMORY, "rfc9106-high-memory": profiles.RFC_9106_HIGH_MEMORY,
             "cheapest-insecure": profiles.CHEAPEST}


@functools.cache
def _hashing(profile: str) -> tuple[PasswordHasher, str]:
    """The hasher of a ``password_hashing`` profile, and a hash verified against when an address is unknown, so
    that a failed login takes as long either way."""
    hasher = PasswordHasher.from_parameters(_PROFILES[profile])
    return hasher, hasher.hash(secrets.token_urlsafe(16))


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def lock_owner(session: Session, user_id: int) -> None:
    """Serialise one user's quota-checked writes until the transaction ends.

    A write to the user's row takes PostgreSQL's row lock, and on SQLite (whose
    reads take no transaction) starts the transaction with the database's write
    lock; a count made after it sees every row committed before, so parallel
    creates cannot all pass the same check.
    """
    session.execute(update(User).where(User.id == user_id).values(role=User.role)
                    .execution_options(synchronize_session=False))


def _rowcount(result: Result) -> int:
    """Rows an UPDATE or DELETE matched: its result is a cursor result, typed as the general one."""
    return cast("CursorResult", result).rowcount



class AccountService:
    def __init__(self, session: Session, settings: Settings) -> None:
        self.session = session
        self.settings = settings
        self._hasher, self._dummy_hash = _hashing(settings.password_hashing)

    # -- users ---------------------------------------------------------------------------------

    def check_password_rules(self, password: str, email: str) -> None:
        """At least ``password_min_length`` characters besides surrounding spaces, at most
        ``password_max_length`` (Argon2 hashes all of it), and not the account's address."""
        low, high = self.settings.password_min_length, self.settings.password_max_length
        if len(password.strip()) < low:
            raise FieldError("password", f"must have at least {low} characters besides surrounding spaces")
        if len(password) > high:
            raise FieldError("password", f"must have at most {high} characters")
        if password.strip().lower() == email.strip().lower():
            raise FieldError("password", "must not be the e-mail address")

    def sign_up(self, email: str, password: str, role: str = "user", invitation: str | None = None) -> User:
        """A new account with ``role`` (the admin CLI's), or the role an unused, unexpired invitation grants."""
        email = email.strip().lower()
        self.check_password_rules(password, email)
        if self.session.scalar(select(User).where(User.email == email)) is not None:
            raise Conflict(f"{email} already has an account")
        if invitation is not None:
            role = self._redeem(invitation)
        user = User(email=email, password_hash=self._hasher.hash(password), role=role)
        self.session.add(user)
        try:
            self.session.commit()
        except IntegrityError:  # the same address signed up concurrently (the invitation stays unused)
            self.session.rollback()
            raise Conflict(f"{email} already has an account") from None
        return user

    # -- invitations -----------------------------------------------------------------------------

    def invite(self, operator: User, role: str) -> tuple[str, Invitation]:
        """A new invitation to sign up with ``role``; returns the token (shown once) and the invitation."""
        if not operator.is_operator:
            raise Forbidden("operators only")
        if role not in ROLES:
            raise FieldError("role", f"must be one of {', '.join(ROLES)}")
        token = secrets.token_urlsafe(32)
        now = datetime.now(UTC)
        invitation = Invitation(token_hash=_digest(token), role=role, created_by=operator.id, created_at=now,
                                expires_at=now + timedelta(seconds=self.settings.invitation_ttl_s))
        self.session.add(invitation)
        self.session.commit()
        return token, invitation

    def _redeem(self, token: str) -> str:
        """Use up an invitation in the caller's transaction and return its role; one conditional
        update, so of two sign-ups racing with one invitation only one gets it."""
        now = datetime.now(UTC)
        invitation = self.session.scalar(select(Invitation).where(Invitation.token_hash == _digest(token)))
        if invitation is None or invitation.used_at is not None or as_utc(invitation.expires_at) < now:
            raise FieldError("invitation", "the invitation is not valid (used, expired or mistyped)")
        used = self.session.execute(update(Invitation).where(Invitation.id == invitation.id,
                                                             Invitation.used_at.is_(None)).values(used_at=now))
        if _rowcount(used) != 1:
            self.session.rollback()
            raise FieldError("invitation", "the invitation is not valid (used, expired or mistyped)")
        return invitation.role

    def authenticate(self, email: str, password: str) -> User | None:
        user = self.session.scalar(select(User).where(User.email == email.strip().lower()))
        try:
            self._hasher.verify(user.password_hash if user else self._dummy_hash, password)
        except (VerificationError, InvalidHashError):
            return None
        if user is None:
            return None
        if self._hasher.check_needs_rehash(user.password_hash):
            user.password_hash = self._hasher.hash(password)
            self.session.commit()
        return user

    def set_role(self, email: str, role: str) -> User:
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}")
        user = self.session.scalar(select(User).where(User.email == email.strip().lower()))
        if user is None:
            raise NotFound(f"no account for {email}")
        user.role = role
        self.session.commit()
        return user

    def change_password(self, user: User, new: str, keep_session: WebSession | None = None) -> tuple[int, int]:
        """Set a new password (the caller checked the current one) and revoke every other browser
        session and every API token: whoever knew the old password may hold one. Returns
        (sessions, tokens) revoked."""
        self.check_password_rules(new, user.email)
        user = self.session.get_one(User, user.id)
        user.password_hash = self._hasher.hash(new)
        others = delete(WebSession).where(WebSession.user_id == user.id)
        if keep_session is not None:
            others = others.where(WebSession.id != keep_session.id)
        sessions = _rowcount(self.session.execute(others))
        tokens = _rowcount(self.session.execute(delete(ApiToken).where(ApiToken.user_id == user.id)))
        self.session.commit()
        return sessions, tokens

    # -- browser sessions -------------------------------------------------------------------------

    def start_session(self, user: User) -> tuple[str, WebSession]:
        """A new session; returns the cookie value (shown to nobody else) and the session."""
        token = secrets.token_urlsafe(32)
        now = datetime.now(UTC)
        web_session = WebSession(id=_digest(token), user_id=user.id, csrf_token=secrets.token_urlsafe(32),
                                 created_at=now, expires_at=now + timedelta(seconds=self.settings.session_ttl_s))
        self.session.add(web_session)
        self.session.execute(delete(WebSession).where(WebSession.expires_at < now))  # sweep the expired
        self.session.commit()
        return token, web_session

    def session_for(self, token: str) -> WebSession | None:
        web_session = self.session.get(WebSession, _digest(token))
        if web_session is None or as_utc(web_session.expires_at) < datetime.now(UTC):
            return None
        return web_session

    def end_session(self, token: str) -> None:
        self.session.execute(delete(WebSession).where(WebSession.id == _digest(token)))
        self.session.commit()

    # -- API tokens -------------------------------------------------------------------------------

    def create_token(self, user: User, name: str) -> tuple[str, ApiToken]:
        lock_owner(self.session, user.id)
        count = self.session.scalar(select(func.count()).select_from(ApiToken).where(ApiToken.user_id == user.id))
        if (count or 0) >= self.settings.user_max_tokens:
            raise Forbidden(f"limit reached: at most {self.settings.user_max_tokens} API tokens per user")
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        api_token = ApiToken(user_id=user.id, name=name, token_hash=_digest(token), prefix=token[:10])
        self.session.add(api_token)
        self.session.commit()
        return token, api_token

    def user_for_token(self, token: str) -> User | None:
        api_token = self.session.scalar(select(ApiToken).where(ApiToken.token_hash == _digest(token)))
        if api_token is None:
            return None
        now = datetime.now(UTC)
        if api_token.last_used_at is None or now - as_utc(api_token.last_used_at) > timedelta(minutes=1):
            api_token.last_used_at = now  # at most once a minute: no write per request
            self.session.commit()
        return api_token.user

    def tokens(self, user: User) -> list[ApiToken]:
        return list(self.session.scalars(select(ApiToken).where(ApiToken.user_id == user.id).order_by(ApiToken.id)))

    def revoke_token(self, user: User, token_id: int) -> None:
        api_token = self.session.get(ApiToken, token_id)
        if api_token is None or api_token.user_id != user.id:
            raise NotFound(f"API token {token_id} not found")
        self.session.delete(api_token)
        self.session.commit()
