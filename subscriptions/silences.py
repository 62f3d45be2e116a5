"""Silences: one user's Alertmanager-style rules that hold back notifications of matching alerts for a while.

A silence has matchers (every one must match), a comment, a start and an end; it is
*pending* before its start, *active* until its end, then *expired* (or expired by hand
at once, which is idempotent). It only ever applies to alerts of its owner's
subscriptions. Here are its API shapes, their validation (field-level 422s), the
owner-scoped operations, and :func:`silence_rules`, the typed values the dispatcher
reads (it never sees the ORM rows). Matching itself is ``notifier.silences``.

Matchers compare an alert's labels, all non-empty strings:

- ``key``: the alert's key (``AAPL``);
- ``subscription``: its subscription's id, in decimal (``12``);
- ``subscription_name``: its subscription's name.

Operators are Alertmanager's: ``=``, ``!=``, and ``=~`` / ``!~``, which match the
whole label against an RE2 pattern (linear time, so no user pattern can make the
dispatcher backtrack for ever; :func:`compile_pattern` is the one place patterns
are compiled, for validation and matching alike).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Annotated, Literal, get_args

import re2
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from sqlalchemy import ColumnElement, and_, func, or_, select, true
from sqlalchemy.orm import Session

from core.settings import Settings
from core.timestamps import UtcDatetime, as_utc
from subscriptions.accounts import lock_owner
from subscriptions.errors import FieldError, Forbidden, NotFound
from subscriptions.models import Silence, Subscription, User
from subscriptions.schemas import MAX_ID, Printable

MatcherName = Literal["key", "subscription", "subscription_name"]
MatcherOp = Literal["=", "!=", "=~", "!~"]
SilenceState = Literal["pending", "active", "expired"]
REGEX_OPS = frozenset({"=~", "!~"})
MATCHER_NAMES: frozenset[str] = frozenset(get_args(MatcherName))
MATCHER_OPS: frozenset[str] = frozenset(get_args(MatcherOp))

MAX_MATCHERS = 16  # every alert of the owner is checked against every matcher of every active silence
MAX_VALUE_LENGTH = 256  # bounds each RE2 program, and what a silence row holds
MAX_COMMENT_LENGTH = 1_000

#: RE2's memory budget per pattern (its default is 8 MiB). Linear-time matching is not cheap compiling: a short
#: pattern of Unicode classes (``\pL{400}``) took ~200 ms to compile within the default, and the dispatcher compiles
#: every matcher of an owner's silences; within this budget such patterns are refused ("pattern too large") in a
#: few ms and the costliest accepted one compiles in ~5 ms, while patterns of keys and names need a few KiB.
PATTERN_MEMORY = 256 << 10

_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a user's bad pattern is a 422, not a line on the server's stderr
_RE2_OPTIONS.max_mem = PATTERN_MEMORY


@lru_cache(maxsize=4_096)  # the same patterns come back: in many silences, at each check of the form, each reload
def compile_pattern(pattern: str) -> re2._Regexp:
    """An RE2 program for a ``=~``/``!~`` matcher (match with ``fullmatch``); ValueError says what is wrong."""
    try:
        return re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as exc:
        reason = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise ValueError(f"not a valid RE2 regular expression: {reason}") from None


def matches_empty(op: str, value: str, pattern: re2._Regexp | None = None) -> bool:
    """Whether a matcher matches the empty label (a missing one): such a matcher alone narrows nothing down."""
    if op in REGEX_OPS:
        return ((pattern or compile_pattern(value)).fullmatch("") is not None) == (op == "=~")
    return (value == "") == (op == "=")


EVERYTHING = ("at least one matcher must not match the empty string (as in Alertmanager): these would silence "
              "every alert of yours; to mean that, say so with key =~ .+")


class MatcherIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: MatcherName = Field(description="the label: key, subscription (its id) or subscription_name")
    op: MatcherOp = Field("=", description="=, !=, or =~ / !~ (an RE2 pattern matching the whole label)")
    value: Annotated[str, Field(max_length=MAX_VALUE_LENGTH), Printable]

    @model_validator(mode="after")
    def _checked(self) -> MatcherIn:
        if self.op in REGEX_OPS:
            compile_pattern(self.value)
        elif self.name == "subscription" and not (self.value.isascii() and self.value.isdigit()
                                                  and 1 <= int(self.value) <= MAX_ID):
            raise ValueError(f"a subscription is matched by its id (1 to {MAX_ID}), not {self.value!r}")
        return self


class SilenceIn(BaseModel):
    """A new silence; it ends at ``ends_at`` or ``duration_s`` after its start (give one of them)."""

    model_config = ConfigDict(extra="forbid")

    matchers: list[MatcherIn] = Field(min_length=1, max_length=MAX_MATCHERS,
                                      description="an alert is silenced when it matches every one")
    comment: Annotated[str, Field(max_length=MAX_COMMENT_LENGTH), Printable] = Field(
        description="why (required): shown in the list and to whoever finds the alerts missing")
    starts_at: UtcDatetime | None = Field(None, description="default (and at the earliest): now")
    ends_at: UtcDatetime | None = None
    duration_s: int | None = Field(None, ge=1, description="instead of ends_at")

    @field_validator("matchers")
    @classmethod
    def _narrows(cls, matchers: list[MatcherIn]) -> list[MatcherIn]:
        if all(matches_empty(m.op, m.value) for m in matchers):
            raise ValueError(EVERYTHING)
        return matchers

    @field_validator("comment")
    @classmethod
    def _said(cls, comment: str) -> str:
        if not comment.strip():
            raise ValueError("say why: a silence needs a comment")
        return comment.strip()

    @model_validator(mode="after")
    def _one_end(self) -> SilenceIn:
        if (self.ends_at is None) == (self.duration_s is None):
            raise ValueError("give either ends_at or duration_s")
        return self


class SilenceOut(BaseModel):
    id: int
    state: SilenceState
    matchers: list[MatcherIn]
    comment: str
    starts_at: UtcDatetime
    ends_at: UtcDatetime
    created_at: UtcDatetime
    created_by: int | None
    expired_at: UtcDatetime | None = Field(description="when it was expired by hand")
    ignored: str | None = Field(None, description="why the dispatcher ignores it (it silences nothing), if it does: "
                                "matchers edited past the API or written by a newer version")

    @classmethod
    def of(cls, silence: Silence, now: datetime | None = None) -> SilenceOut:
        """Also of a row the dispatcher skips (``ignored`` says why), so its owner still sees and can expire it."""
        ignored = None
        try:
            matchers = [MatcherIn.model_validate(m) for m in silence.matchers]
            if not matchers or all(matches_empty(m.op, m.value) for m in matchers):
                ignored = EVERYTHING
        except (ValidationError, TypeError):
            matchers = []
            ignored = f"matchers this version cannot read: {json.dumps(silence.matchers, default=str)[:300]}"
        return cls(id=silence.id, state=silence_state(silence, now or datetime.now(UTC)),
                   matchers=matchers, ignored=ignored, comment=silence.comment,
                   starts_at=as_utc(silence.starts_at), ends_at=as_utc(silence.ends_at),
                   created_at=as_utc(silence.created_at), created_by=silence.created_by,
                   expired_at=as_utc(silence.expired_at) if silence.expired_at else None)



def _span(seconds: int) -> str:
    for unit, size in (("days", 86_400), ("hours", 3_600), ("minutes", 60)):
        if seconds % size == 0:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


def silence_state(silence: Silence, now: datetime) -> SilenceState:
    if silence.expired_at is not None or as_utc(silence.ends_at) <= now:
        return "expired"
    return "pending" if as_utc(silence.starts_at) > now else "active"


def _in_state(state: SilenceState, now: datetime) -> ColumnElement[bool]:
    """The SQL filter of :func:`silence_state`."""
    ended = or_(Silence.expired_at.is_not(None), Silence.ends_at <= now)
    if state == "expired":
        return ended
    started = Silence.starts_at <= now if state == "active" else Silence.starts_at > now
    return and_(~ended, started)


class SilenceService:
    """One user's silences; every query is filtered by owner (another's silence is a 404)."""

    def __init__(self, session: Session, settings: Settings, owner: User) -> None:
        self.session = session
        self.settings = settings
        self.owner = owner

    def check(self, data: SilenceIn, now: datetime) -> tuple[datetime, datetime]:
        """What a valid silence would span, or FieldError: the checks that need the settings and the database."""
        window = self._window(data, now)
        self._own_subscriptions(data.matchers)
        return window

    def create(self, data: SilenceIn, now: datetime | None = None) -> Silence:
        now = now or datetime.now(UTC)
        starts_at, ends_at = self.check(data, now)
        lock_owner(self.session, self.owner.id)  # the count and the insert are one step: no parallel overshoot
        limit = self.settings.user_max_silences
        live = select(func.count()).select_from(Silence).where(Silence.owner_id == self.owner.id,
                                                              ~_in_state("expired", now))
        if (self.session.scalar(live) or 0) >= limit:
            raise Forbidden(f"limit reached: at most {limit} pending or active silences per user "
                            "(expire one, or TOCSIN_USER_MAX_SILENCES)")
        silence = Silence(owner_id=self.owner.id, created_by=self.owner.id, comment=data.comment,
                          matchers=[m.model_dump() for m in data.matchers], starts_at=starts_at, ends_at=ends_at,
                          created_at=now)
        self.session.add(silence)
        self.session.commit()
        return silence

    def _window(self, data: SilenceIn, now: datetime) -> tuple[datetime, datetime]:
        longest = timedelta(seconds=self.settings.silence_max_duration_s)
        bound = f"{_span(self.settings.silence_max_duration_s)} (TOCSIN_SILENCE_MAX_DURATION_S)"
        starts_at = max(data.starts_at or now, now)  # a start in the past is now, as in Alertmanager
        if starts_at - now > longest:
            raise FieldError("starts_at", f"must be at most {bound} from now")
        if data.duration_s is not None:
            if data.duration_s > longest.total_seconds():
                raise FieldError("duration_s", f"must be at most {bound}")
            return starts_at, starts_at + timedelta(seconds=data.duration_s)
        assert data.ends_at is not None  # SilenceIn has one end or the other
        if data.ends_at <= starts_at:
            raise FieldError("ends_at", "must be after starts_at (and after now)")
        if data.ends_at - starts_at > longest:
            raise FieldError("ends_at", f"must be at most {bound} after starts_at")
        return starts_at, data.ends_at

    def _own_subscriptions(self, matchers: list[MatcherIn]) -> None:
        """A ``subscription = <id>`` matcher names one of the owner's subscriptions, else it could match nothing."""
        named = {int(m.value) for m in matchers if m.name == "subscription" and m.op == "="}
        if not named:
            return
        owned = set(self.session.scalars(select(Subscription.id).where(Subscription.id.in_(named),
                                                                       Subscription.owner_id == self.owner.id)))
        if missing := sorted(named - owned):
            raise FieldError("matchers", f"no subscription of yours has the id {', '.join(map(str, missing))}")

    def list(self, state: SilenceState | None = None, limit: int = 200, now: datetime | None = None) -> list[Silence]:
        """Newest first."""
        where = _in_state(state, now or datetime.now(UTC)) if state else true()
        return list(self.session.scalars(select(Silence).where(Silence.owner_id == self.owner.id, where)
                                         .order_by(Silence.id.desc()).limit(limit)))

    def get(self, silence_id: int) -> Silence:
        silence = self.session.get(Silence, silence_id)
        if silence is None or silence.owner_id != self.owner.id:
            raise NotFound(f"silence {silence_id} not found")
        return silence

    def expire(self, silence_id: int, now: datetime | None = None) -> Silence:
        """End a silence now; one already expired (by hand or by its end) is left as it is."""
        now = now or datetime.now(UTC)
        silence = self.get(silence_id)
        if silence_state(silence, now) != "expired":
            silence.expired_at = now
            self.session.commit()
        return silence


@dataclass(frozen=True)
class SilenceRule:
    """A pending or active silence as the dispatcher reads it: plain values, times in unix seconds."""

    id: int
    owner_id: int
    starts_at: float
    ends_at: float
    matchers: tuple[tuple[str, str, str], ...]  # (name, op, value)


def silence_rules(session: Session, owner_ids: set[int], now: datetime) -> dict[int, list[SilenceRule]]:
    """The silences of these owners that have not ended by ``now`` (pending ones included), by owner, by id."""
    found: dict[int, list[SilenceRule]] = {owner: [] for owner in owner_ids}
    if not owner_ids:
        return found
    query = (select(Silence).where(Silence.owner_id.in_(owner_ids), ~_in_state("expired", now))
             .order_by(Silence.id))
    for s in session.scalars(query):
        # One the dispatcher cannot read is passed on as such: it skips it, logged once, not at every reload.
        matchers = _stored_matchers(s.matchers) or ((UNREADABLE, "", json.dumps(s.matchers, default=str)[:300]),)
        found[s.owner_id].append(SilenceRule(s.id, s.owner_id, as_utc(s.starts_at).timestamp(),
                                             as_utc(s.ends_at).timestamp(), matchers))
    return found


UNREADABLE = "matchers this version cannot read:"  # the name of the one matcher of a row not read


def _stored_matchers(stored: object) -> tuple[tuple[str, str, str], ...] | None:
    """A row's matchers as (name, op, value), or None if they are not what this version writes.

    Rows are written through :class:`SilenceIn`, but one edited by hand or by a newer version (a label or an
    operator this one does not know) must be skipped, never read as something else: a silence nobody can read
    silences nothing, and must not stop the dispatcher. Cheap checks only: this runs at every reload.
    """
    if not isinstance(stored, list) or not stored:
        return None
    matchers = []
    for m in stored:
        if not (isinstance(m, dict) and m.get("name") in MATCHER_NAMES and m.get("op") in MATCHER_OPS
                and isinstance(m.get("value"), str)):
            return None
        matchers.append((m["name"], m["op"], m["value"]))
    return tuple(matchers)
