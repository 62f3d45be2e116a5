"""An alert's lifecycle: pending, firing, keep-firing, resolved, and crossings, on top of the raw condition truth.

Pure (no I/O). The shard finds, at each evaluated boundary, which (subscription, key)
pairs start or stop satisfying their condition (its firing sets are this *raw* truth).
A subscription without lifecycle clauses notifies exactly those edges. One with clauses
(:class:`Lifecycle`, carried by its condition) is run through :class:`Tracker`, which
turns the raw edges plus the timers that fall due into the transitions users see::

                 raw true              held FOR
    inactive ───────────────► pending ─────────► firing ◄──────────────┐
       ▲   (FOR 0: straight to firing)  │           │ raw false         │ raw true again
       │            raw false           │           ▼                   │ (no notification)
       └────────────────────────────────┘      keep-firing ─────────────┘
       ▲                                            │ stayed false KEEP FIRING FOR,
       └──────────────── resolved ◄─────────────────┘ and DAMPEN since it fired

* ``FOR d``: a key fires only at the first boundary at least ``d`` after the condition
  became true, if it held at every boundary in between (Prometheus ``for``).
* ``KEEP FIRING FOR d``: a firing key resolves only once its condition stayed false for
  ``d`` (Prometheus ``keep_firing_for``).
* ``RESOLVE BELOW x`` / ``RESOLVE ABOVE x`` (hysteresis): once firing, a key stays firing
  while its value is in the *hold* range (``>= x`` / ``<= x``), which contains the firing
  range; "false" above means out of the hold range. Its raw truth is a second, internal
  member of the same group (id ``-subscription``), so it costs what a subscription costs.
* ``DAMPEN d``: a key that fired stays firing at least ``d``: a resolve that would come
  earlier waits until ``d`` after the firing (and happens only if still false then). So a
  key notifies at most one firing (and one resolved) per ``d``, however its value flaps.
* ``CROSSES ABOVE x`` / ``CROSSES BELOW x`` / ``CROSSES x``: an event, not a state. The
  raw truth is "above x" (or "below x"; for ``CROSSES x`` both, the second an internal
  member); each raw rise is one transition of kind ``crossing`` (state ``firing``), and
  nothing else: no resolved notification, no firing state kept downstream. A key that
  gets a value already beyond ``x`` (no value before) crosses too, as an edge would fire.
  With ``DAMPEN d`` at most one crossing per key per ``d``.

Every duration counts in whole panes, rounded up (boundaries are pane multiples).
Time only moves at boundaries; the raw truth is constant between the boundaries the
shard evaluates, so the timers (a heap of due boundaries) make it evaluate the boundary
at which one falls due. Work per boundary is proportional to the raw flips and the due
timers, never to the pairs tracked.

Edits. The lifecycle a subscription's state follows is recorded (``applied``); when a
catalog edit changes it (to, from or between clauses), every pair of that subscription
is re-examined at the next evaluated boundary under the new clauses: what users saw
(firing or not) is kept, timers restart from the recorded instants with the new
durations, and a pair whose visible state differs from what the new clauses say gets
its firing or resolved transition then (a subscription turned into a crossing resolves
its firing keys).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from evaluator.comparators import CROSSINGS, Range

PENDING, FIRING, KEEP, CROSSED = "pending", "firing", "keep", "crossed"
STATE, CROSSING = "state", "crossing"  # transition kinds


@dataclass(frozen=True, slots=True)
class Lifecycle:
    """A subscription's lifecycle clauses (durations in ms; 0: absent)."""

    for_ms: int = 0
    keep_firing_ms: int = 0
    dampen_ms: int = 0
    resolve: Range | None = None  # the hold range: a firing key stays firing while its value is in it
    crossing: str | None = None  # "above", "below" or "either": the condition is a crossing, an event

    def __post_init__(self) -> None:
        if min(self.for_ms, self.keep_firing_ms, self.dampen_ms) < 0:
            raise ValueError("lifecycle durations cannot be negative")
        if self.crossing is not None:
            if self.crossing not in {c.direction for c in CROSSINGS}:
                raise ValueError(f"unknown crossing {self.crossing!r}")
            if self.for_ms or self.keep_firing_ms or self.resolve is not None:
                raise ValueError("a crossing is an event: it takes DAMPEN only")
        if self.resolve is not None and (self.resolve.low is None) == (self.resolve.high is None):
            raise ValueError("a resolve range is bounded on one side")

    @property
    def trivial(self) -> bool:
        """No clause at all: plain edges."""
        return self == Lifecycle()

    def aux_range(self, ranges: tuple[Range, ...]) -> Range | None:
        """The range of the internal second member: the hold range, or a two-way crossing's lower side."""
        if self.resolve is not None:
            return self.resolve
        if self.crossing == "either":
            return Range(high=ranges[0].low)
        return None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {k: v for k, v in (("for_ms", self.for_ms), ("keep_firing_ms", self.keep_firing_ms),
                                                   ("dampen_ms", self.dampen_ms), ("crossing", self.crossing)) if v}
        if self.resolve is not None:
            r = self.resolve
            data["resolve"] = [r.low, r.high, r.low_inclusive, r.high_inclusive]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Lifecycle:
        resolve = data.get("resolve")
        return cls(int(data.get("for_ms", 0)), int(data.get("keep_firing_ms", 0)), int(data.get("dampen_ms", 0)),
                   Range(*resolve) if resolve else None, data.get("crossing"))


def contains(outer: Range, inner: Range) -> bool:
    """Whether every value of ``inner`` lies in ``outer``."""
    if outer.low is not None:
        if inner.low is None or inner.low < outer.low:
            return False
        if inner.low == outer.low and inner.low_inclusive and not outer.low_inclusive:
            return False
    if outer.high is not None:
        if inner.high is None or inner.high > outer.high:
            return False
        if inner.high == outer.high and inner.high_inclusive and not outer.high_inclusive:
            return False
    return True


def aux_id(sid: int) -> int:
    """The id of a subscription's internal second member (subscription ids are positive)."""
    return -sid


@dataclass(slots=True)
class Record:
    """One (subscription, key) pair's lifecycle state; a pair with none is inactive (not firing, not pending)."""

    phase: str  # PENDING, FIRING, KEEP or CROSSED
    since: int  # pending since, firing since, false since (keep), last crossing (crossed)
    fired_at: int | None  # the last firing notification (None: before the subscription had a lifecycle)
    due: int | None  # the boundary at which its timer falls due

    def to_list(self) -> list:
        return [self.phase, self.since, self.fired_at, self.due]

    @classmethod
    def from_list(cls, data: list) -> Record:
        return cls(*data)


Out = tuple[int, str, str, str]  # (subscription, key, state, kind)


@dataclass
class Raw:
    """What the shard knows at a boundary, after applying its raw flips."""

    firing: dict[int, set[str]]  # raw firing sets, by member id (aux members negative)
    flipped: set[tuple[int, str]]  # (member id, key) whose raw truth changed at this boundary

    def now(self, member: int, key: str) -> bool:
        return key in self.firing.get(member, ())

    def before(self, member: int, key: str) -> bool:
        return self.now(member, key) != ((member, key) in self.flipped)

    def rose(self, member: int, key: str) -> bool:
        return (member, key) in self.flipped and self.now(member, key)


def _kind(life: Lifecycle | None) -> str | None:
    """None: plain edges; STATE: pending/keep-firing/hysteresis/damping; CROSSING: an event."""
    return None if life is None else CROSSING if life.crossing is not None else STATE


def _ceil(ms: int, pane: int) -> int:
    return -(-ms // pane) * pane


class Tracker:
    """Every lifecycle subscription's pairs: their records, timers, and the clauses their state follows."""

    def __init__(self, pane_ms: int) -> None:
        self.pane = pane_ms
        self.records: dict[tuple[int, str], Record] = {}
        self.by_sid: dict[int, set[str]] = {}
        self.heap: list[tuple[int, int, str]] = []  # (due, subscription, key); stale entries skipped lazily
        self.applied: dict[int, Lifecycle] = {}  # the clauses each lifecycle subscription's state follows
        self.reconcile: set[int] = set()  # subscriptions whose clauses changed: re-examined at the next boundary
        self._dirty: set[tuple[int, str]] = set()  # pairs changed since the last export (for the change log)
        self._dirty_applied: set[int] = set()

    def __bool__(self) -> bool:
        return bool(self.applied or self.reconcile or self.records)

    def sids(self) -> list[int]:
        """Subscriptions with lifecycle state."""
        return sorted({*self.applied, *self.by_sid, *self.reconcile})

    def has(self, sid: int) -> bool:
        return sid in self.applied or sid in self.by_sid or sid in self.reconcile

    def manages(self, sid: int) -> bool:
        """Whether ``sid``'s raw flips go through the tracker (else they are its transitions, as they are)."""
        return sid < 0 or sid in self.applied or sid in self.reconcile

    def follow(self, sid: int, lifecycle: Lifecycle | None) -> None:
        """A catalog upsert: re-examine the subscription at the next boundary if its clauses changed."""
        if lifecycle != self.applied.get(sid):
            self.reconcile.add(sid)
        else:
            self.reconcile.discard(sid)

    def forget(self, sid: int) -> None:
        """A deleted or paused subscription: silently."""
        for key in self.by_sid.pop(sid, ()):
            del self.records[(sid, key)]
            self._dirty.add((sid, key))
        if self.applied.pop(sid, None) is not None:
            self._dirty_applied.add(sid)
        self.reconcile.discard(sid)

    def next_due(self) -> int | None:
        heap = self.heap
        while heap:
            due, sid, key = heap[0]
            record = self.records.get((sid, key))
            if record is not None and record.due == due:
                return due
            heapq.heappop(heap)
        return None

    def _set(self, sid: int, key: str, record: Record | None) -> None:
        pair = (sid, key)
        if record is None:
            if self.records.pop(pair, None) is not None:
                keys = self.by_sid[sid]
                keys.discard(key)
                if not keys:
                    del self.by_sid[sid]
                self._dirty.add(pair)
            return
        old = self.records.get(pair)
        if old != record:
            self.records[pair] = record
            self.by_sid.setdefault(sid, set()).add(key)
            self._dirty.add(pair)
        if record.due is not None and (old is None or old.due != record.due):
            heapq.heappush(self.heap, (record.due, sid, key))

    # -- one boundary ----------------------------------------------------------------------------

    def step(self, boundary: int, raw: Raw, lifecycle_of: Callable[[int], Lifecycle | None]) -> list[Out]:
        """The transitions users see at ``boundary``: from the managed subscriptions' raw flips (already applied
        to ``raw.firing``), the timers due, and the subscriptions whose clauses changed."""
        pairs: dict[int, set[str]] = {}
        while self.heap and self.heap[0][0] <= boundary:
            due, sid, key = heapq.heappop(self.heap)
            record = self.records.get((sid, key))
            if record is not None and record.due == due:
                pairs.setdefault(sid, set()).add(key)
        for member, key in raw.flipped:
            pairs.setdefault(abs(member), set()).add(key)
        before: dict[int, Lifecycle | None] = {}
        for sid in sorted(self.reconcile):
            before[sid] = self.applied.get(sid)
            new = lifecycle_of(sid)
            if new is None:
                self.applied.pop(sid, None)
            else:
                self.applied[sid] = new
            self._dirty_applied.add(sid)
            pairs.setdefault(sid, set()).update(self.by_sid.get(sid, ()), raw.firing.get(sid, ()))
        self.reconcile.clear()
        out: list[Out] = []
        for sid in sorted(pairs):
            new = self.applied.get(sid)
            old = before.get(sid, new)
            for key in sorted(pairs[sid]):
                out += self._pair(boundary, sid, key, old, new, raw)
        return out

    def _pair(self, b: int, sid: int, key: str, old: Lifecycle | None, new: Lifecycle | None, raw: Raw) -> list[Out]:
        record = self.records.get((sid, key))
        if old is None:  # plain edges: what users saw is the raw truth before this boundary
            shown = raw.before(sid, key)
        else:
            shown = old.crossing is None and record is not None and record.phase in (FIRING, KEEP)
        if _kind(old) != _kind(new):  # records carry over between lifecycles of one kind only
            record = Record(FIRING, b, None, None) if shown and _kind(new) == STATE else None
        out: list[Out] = []
        if new is None:  # turned plain: the raw truth from now on
            self._set(sid, key, None)
            now = raw.now(sid, key)
            if now != shown:
                out.append((sid, key, "firing" if now else "resolved", STATE))
            return out
        if new.crossing is not None:
            if shown:
                out.append((sid, key, "resolved", STATE))
            if record is not None and record.phase == CROSSED and record.since + _ceil(new.dampen_ms, self.pane) <= b:
                record = None  # the damping period is over
            crossed = raw.rose(sid, key) or (new.crossing == "either" and raw.rose(aux_id(sid), key))
            if crossed and record is None:
                out.append((sid, key, "firing", CROSSING))
                if new.dampen_ms:
                    record = Record(CROSSED, b, b, b + _ceil(new.dampen_ms, self.pane))
            elif record is not None:
                record = Record(CROSSED, record.since, record.fired_at,
                                record.since + _ceil(new.dampen_ms, self.pane))
            self._set(sid, key, record)
            return out
        record = self._advance(b, record, raw.now(sid, key),
                               raw.now(aux_id(sid), key) if new.resolve is not None else raw.now(sid, key), new)
        self._set(sid, key, record)
        visible = record is not None and record.phase in (FIRING, KEEP)
        if visible != shown:
            out.append((sid, key, "firing" if visible else "resolved", STATE))
        return out

    def _advance(self, b: int, record: Record | None, true: bool, holds: bool, life: Lifecycle) -> Record | None:
        """The state machine of the module docstring, for one pair at boundary ``b``."""
        pane = self.pane
        phase = record.phase if record is not None else None
        if phase is None or phase == PENDING:
            if not true:
                return None
            since = b if record is None else record.since
            due = since + _ceil(life.for_ms, pane)
            if b >= due:
                return Record(FIRING, b, b, None)
            return Record(PENDING, since, None, due)
        assert record is not None
        if holds:
            return Record(FIRING, record.since if phase == FIRING else b, record.fired_at, None)
        false_since = record.since if phase == KEEP else b
        due = false_since + _ceil(life.keep_firing_ms, pane)
        if record.fired_at is not None:
            due = max(due, record.fired_at + _ceil(life.dampen_ms, pane))
        if b >= due:
            return None
        return Record(KEEP, false_since, record.fired_at, due)

    # -- persistence --------------------------------------------------------------------------------

    def export(self) -> dict[str, Any] | None:
        """What changed since the last export (a change log entry), or None when nothing did."""
        if not (self._dirty or self._dirty_applied or self.reconcile):
            return None
        data = {
            "records": [[sid, key, r.to_list() if (r := self.records.get((sid, key))) else None]
                        for sid, key in sorted(self._dirty)],
            "applied": [[sid, life.to_dict() if (life := self.applied.get(sid)) is not None else None]
                        for sid in sorted(self._dirty_applied)],
            "reconcile": sorted(self.reconcile),
        }
        self._dirty, self._dirty_applied = set(), set()
        return data

    def apply(self, data: dict[str, Any] | None) -> None:
        """Replay an :meth:`export` (or load a :meth:`to_json`)."""
        if data is None:
            self.reconcile = set()
            return
        for sid, key, record in data["records"]:
            self._set(int(sid), key, Record.from_list(record) if record is not None else None)
        for sid, life in data["applied"]:
            if life is None:
                self.applied.pop(int(sid), None)
            else:
                self.applied[int(sid)] = Lifecycle.from_dict(life)
        self.reconcile = {int(s) for s in data["reconcile"]}
        self._dirty, self._dirty_applied = set(), set()

    def to_json(self) -> dict[str, Any]:
        """The whole state, for a snapshot."""
        return {"records": [[sid, key, r.to_list()] for (sid, key), r in sorted(self.records.items())],
                "applied": [[sid, life.to_dict()] for sid, life in sorted(self.applied.items())],
                "reconcile": sorted(self.reconcile)}

