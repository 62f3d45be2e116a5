"""The dispatcher's silence stage: whether one of its owner's silences holds an alert back, as in Alertmanager.

Silences are made and validated in ``subscriptions.silences``; here they are matched.
An alert's labels are ``key``, ``subscription`` (the id, in decimal) and
``subscription_name``; a silence holds it back while ``starts_at <= now < ends_at``
if every matcher matches (``=``, ``!=``, and ``=~`` / ``!~`` matching the whole label
with RE2). Only the silences of the alert's subscription's owner are consulted, so one
user's silence never touches another's alerts.

The dispatcher must not ask the database per alert: :class:`SilenceCache` keeps each
owner's pending and active silences and reloads an owner's at most every
``silence_cache_s``, in one query for every owner due. A silence saved or expired
therefore applies to alerts decided at most ``silence_cache_s`` later; a pending one
starts on time without a reload, as the start is checked per alert. Silences that cannot be
read or loaded fail open (``SilenceCache.refresh``): alerts are delivered, never held back or
stuck. Which silences match
a subscription's key is remembered while the owner's silences stay the same: a call into
RE2 costs ~4 µs through its binding, and the same keys fire again and again.

What a silenced transition does to the key's policy state (:func:`silenced_decision`):
a silenced *firing* is not notified, so, as for a muted one, its resolution is not sent
either, and a subscription that re-notifies (``renotify_s``) reminds the key once the
silence has ended if it is still firing - that reminder is the notification
Alertmanager sends when a silence ends. A *resolution* while silenced of a firing that was
notified before the silence is sent all the same (the dispatcher does not hold it back): a
silence stops new noise, while closing what subscribers were told keeps their receivers
right - a PagerDuty incident it opened would otherwise stay open for good. Reminders of silenced keys are held back (not logged, as a
reminder is no transition).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

import re2
import structlog
from prometheus_client import Counter
from sqlalchemy.orm import Session

from notifier.policy import KeyState
from subscriptions.routing import Route
from subscriptions.silences import (
    EVERYTHING,
    MATCHER_NAMES,
    MATCHER_OPS,
    REGEX_OPS,
    UNREADABLE,
    SilenceRule,
    compile_pattern,
    matches_empty,
    silence_rules,
)

log = structlog.get_logger("dispatcher")

LOAD_FAILURES = Counter("tocsin_dispatcher_silence_load_failures_total",
                        "Reloads of owners' silences that failed (their alerts were decided without them)")


def silence_reason(silence_id: int) -> str:
    """The reason a silenced transition is logged with in its subscription's delivery log."""
    return f"silenced by #{silence_id}"


@dataclass(frozen=True)
class Matcher:
    name: str
    op: str  # =, !=, =~, !~
    value: str
    pattern: re2._Regexp | None = None  # compiled value of =~ and !~

    @classmethod
    def of(cls, name: str, op: str, value: str) -> Matcher:
        """ValueError for a label or operator this version does not know (never read as another one)."""
        if name not in MATCHER_NAMES or op not in MATCHER_OPS:
            raise ValueError(f"{name} {value}" if name == UNREADABLE else f"unknown matcher {name!r} {op!r}")
        return cls(name, op, value, compile_pattern(value) if op in REGEX_OPS else None)

    def matches(self, labels: Mapping[str, str]) -> bool:
        label = labels.get(self.name, "")  # Alertmanager: a missing label is the empty string
        if self.pattern is None:
            return (label == self.value) == (self.op == "=")
        return (self.pattern.fullmatch(label) is not None) == (self.op == "=~")


@dataclass(frozen=True)
class ActiveSilence:
    """A silence ready to match: its matchers compiled once, its times in unix seconds."""

    id: int
    starts_at: float
    ends_at: float
    matchers: tuple[Matcher, ...]
    rule: SilenceRule | None = None  # what it was compiled from

    @classmethod
    def of(cls, rule: SilenceRule) -> ActiveSilence:
        """ValueError for a silence the API would refuse: one that cannot be read, or that matches everything."""
        matchers = sorted((Matcher.of(*m) for m in rule.matchers), key=lambda m: m.pattern is not None)
        if all(matches_empty(m.op, m.value, m.pattern) for m in matchers):
            raise ValueError(EVERYTHING)
        return cls(rule.id, rule.starts_at, rule.ends_at, tuple(matchers), rule)  # comparisons before patterns

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(m.matches(labels) for m in self.matchers)

    def active_at(self, now: float) -> bool:
        return self.starts_at <= now < self.ends_at

    def silences(self, labels: Mapping[str, str], now: float) -> bool:
        return self.active_at(now) and self.matches(labels)


def alert_labels(route: Route, key: str) -> dict[str, str]:
    """What matchers compare: the alert's key and its subscription."""
    return {"key": key, "subscription": str(route.subscription_id), "subscription_name": route.name}


def silenced_by(silences: tuple[ActiveSilence, ...], labels: Mapping[str, str], now: float) -> int | None:
    """The id of the oldest silence holding these labels back at ``now``, if any."""
    return next((s.id for s in silences if s.silences(labels, now)), None)


def silenced_decision(silence_id: int, state: KeyState, transition: str) -> tuple[str, KeyState]:
    """The policy decision of a silenced transition: (reason, new key state); see the module's docstring.

    A resolution reaches here only for an episode that was not notified: it stays closed."""
    return silence_reason(silence_id), state if transition == "firing" else replace(state, open=False)


@dataclass
class _OwnerSilences:
    loaded_at: float  # the cache's clock
    rules: tuple[SilenceRule, ...]
    silences: tuple[ActiveSilence, ...]
    # (subscription id, name, key) -> the silences matching its labels, whatever the time: kept while the owner's
    # silences do not change, as an RE2 call costs ~4 µs (most of it the binding's) and the same keys fire again.
    matching: dict[tuple[int, str, str], tuple[ActiveSilence, ...]] = field(default_factory=dict)


MATCHING_MEMO = 100_000  # remembered label sets per owner; beyond, the memo starts over
KEEP_TTLS = 10  # an owner's copy outlives its period this many times: unseen owners, silences that cannot be read


class SilenceCache:
    """Each owner's pending and active silences, reloaded at most every ``ttl_s`` per owner."""

    def __init__(self, ttl_s: float, load: Callable[[Session, set[int], datetime], dict[int, list[SilenceRule]]]
                 = silence_rules, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.load = load
        self.clock = clock
        self._owners: dict[int, _OwnerSilences] = {}

    def refresh(self, session: Session, owner_ids: set[int]) -> None:
        """Reload the silences of the owners whose copy is older than ``ttl_s`` (one query for all of them).

        Fails open: when they cannot be read (the database away, a row it cannot parse, a schema behind), this
        is logged and counted, and each owner keeps its last copy for up to ``KEEP_TTLS`` periods (a blip does
        not end a maintenance window), then has none - silences nobody can read never hold an alert back, and
        never stop the dispatcher. The next refresh tries again.
        """
        now = self.clock()
        stale = {o for o in owner_ids if o not in self._owners or now - self._owners[o].loaded_at >= self.ttl_s}
        if not stale:
            return
        try:
            reloaded = self.load(session, stale, datetime.now(UTC))
        except Exception as exc:  # noqa: BLE001 - whatever it is, alerts go on: delivered, not held back or stuck
            session.rollback()
            LOAD_FAILURES.inc()
            log.error("silences_unavailable_delivering", owners=len(stale), reason=f"{type(exc).__name__}: {exc}")
            reloaded = {}
            for owner in stale:
                known = self._owners.get(owner)
                if known is not None and now - known.loaded_at >= KEEP_TTLS * self.ttl_s:
                    del self._owners[owner]
        for owner, loaded in reloaded.items():
            rules, known = tuple(loaded), self._owners.get(owner)
            if known is not None and known.rules == rules:
                known.loaded_at = now  # unchanged: what was matched stays matched
            else:  # only new or changed silences are compiled: one silence saved does not recompile them all
                ready = {s.rule: s for s in known.silences} if known is not None else {}
                self._owners[owner] = _OwnerSilences(
                    now, rules, tuple(s for r in rules if (s := ready.get(r) or _compiled(r))))
        for owner in [o for o, known in self._owners.items()
                      if o not in owner_ids and now - known.loaded_at >= KEEP_TTLS * self.ttl_s]:
            del self._owners[owner]  # owners not seen for a while: their copy would be reloaded anyway

    def silencing(self, route: Route, key: str, now: float) -> int | None:
        """The silence holding back ``key``'s alert of ``route`` at ``now`` (unix seconds), if any."""
        known = self._owners.get(route.owner_id)
        if known is None or not known.silences:
            return None
        memo = (route.subscription_id, route.name, key)
        matching = known.matching.get(memo)
        if matching is None:
            labels = alert_labels(route, key)
            matching = tuple(s for s in known.silences if s.matches(labels))
            if len(known.matching) >= MATCHING_MEMO:
                known.matching.clear()
            known.matching[memo] = matching
        return next((s.id for s in matching if s.active_at(now)), None)


def _compiled(rule: SilenceRule) -> ActiveSilence | None:
    """A stored silence whose pattern no longer compiles (validated when saved) is skipped: better a notification
    too many than alerts held back by a rule nobody can read."""
    try:
        return ActiveSilence.of(rule)
    except ValueError as exc:
        log.error("silence_skipped", silence_id=rule.id, reason=str(exc))
        return None
