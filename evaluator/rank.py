"""Rank conditions: "alert when a key enters the top 10 of its stream by 5-minute volume".

A key's rank is its place among every key of the condition's view (its stream, ``WHERE`` filters
and key prefix) with at least one event in the window, ordered by the condition's value: the
highest first for ``IN TOP k`` (ties by key, ascending), the lowest first for ``IN BOTTOM k``.
The alert fires when a key enters the first ``k`` at a boundary and resolves when it leaves them.

Keys are spread over shards, so a rank needs every shard's keys. The work is split so that a
boundary costs in proportion to ``k`` and to the keys that changed, never to every key:

- **In each shard** (:class:`RankBook`): the shard's keys in rank order, one sorted list per
  (value, direction); at a boundary only the keys whose windows changed move (``O(changed log n)``),
  and each rank subscription's first ``k`` are read off the front (``O(k)``). A shard sends its list
  (:class:`RankEntry` rows, one per key, or one empty row) only when it differs from the one it
  sent last, or the subscription is new or edited. The global first ``k`` are among the union of every
  shard's first ``k``.
- **In the merge** (:class:`RankMerge`, run by the sink on the driver with its state in Redis): per
  subscription, each shard's last list; at each boundary the lists sent then replace the old ones,
  the union is cut to ``k`` (``O(k x shards)``), and the keys that entered or left are its
  transitions. A boundary is merged only once every shard has evaluated it (``through``): lists of
  later boundaries wait in the state, so a shard a batch behind the others never leaves a stale list
  in a merge. The state records the last boundary merged; lists at or before it are a replayed
  batch's and change nothing, so a merge is exactly once with the sink's dedupe marks.

A resolve carries the key's value now: from a list, or from the ``out`` entry its shard sends when the key
leaves its list (the lists sent are kept in the shard's deltas and snapshots, so a restarted shard knows them).
A key with no event in the window has no value.

The subscription's key list does not narrow the ranking (the top 10 of the stream), only whose
entering and leaving alert: each entry says whether its key is listed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sortedcontainers import SortedList

from evaluator.transition import State, Transition, alert_id

MAX_RANK = 100  # the largest k: a merge costs k x shards per boundary, and a list of k travels per change
EMPTY_KEY = ""  # an entry with this key says the shard's list is empty (no key can be empty)


@dataclass(frozen=True, slots=True)
class Rank:
    """``IN TOP k`` (``top``) or ``IN BOTTOM k``."""

    k: int
    top: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.k <= MAX_RANK:
            raise ValueError(f"a rank is within the first 1 to {MAX_RANK} keys, not {self.k}")

    def to_dict(self) -> dict[str, Any]:
        return {"k": self.k, "top": self.top}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Rank:
        return cls(int(data["k"]), bool(data["top"]))

    def order(self, value: float, key: str) -> tuple[float, str]:
        return order(value, key, self.top)


def order(value: float, key: str, top: bool) -> tuple[float, str]:
    """Where (value, key) stands in a ranking, smaller first: the highest value first for a top one, then by key."""
    return (-value if top else value, key)


@dataclass(frozen=True, slots=True)
class RankEntry:
    """One key of a shard's first ``k`` for a rank subscription at a boundary (``key`` empty: the list is empty).

    The contract between the shard operator and the sink, in ``evaluator.spark.sink.TRANSITIONS_SCHEMA``'s rows
    (:meth:`to_row`, :meth:`from_row`)."""

    shard: int
    subscription_id: int
    boundary: int
    window_start: int
    key: str
    value: float | None  # None: the key has no value now (an ``out`` entry only)
    listed: bool  # the subscription alerts on this key (its key list, if it has one, holds it)
    rank: Rank  # the subscription's, so the merge needs no catalog
    out: bool = False  # the key left the shard's list here: not in it, its value for a resolve

    def to_row(self) -> tuple:
        """As ``TRANSITIONS_SCHEMA``'s columns: the shard travels as the alert id, the rank, ``listed`` and ``out``
        as the kind (``top 10 listed``, ``bottom 5 unlisted out``)."""
        kind = f"{'top' if self.rank.top else 'bottom'} {self.rank.k} {'listed' if self.listed else 'unlisted'}"
        return (str(self.shard), self.subscription_id, self.key, RANK_STATE, self.value, self.window_start,
                self.boundary, self.boundary, kind + (" out" if self.out else ""))

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> RankEntry:
        shard, sid, key, state, value, start, boundary, _, kind = row
        words = str(kind).split()
        if state != RANK_STATE or len(words) not in (3, 4) or words[0] not in ("top", "bottom") \
                or not words[1].isdigit() or words[2] not in ("listed", "unlisted") or words[3:] not in ([], ["out"]):
            raise ValueError(f"not a rank entry: state {state!r}, kind {kind!r}")
        value = None if value is None or value != value else float(value)
        return cls(int(shard), int(sid), int(boundary), int(start), str(key), value, words[2] == "listed",
                   Rank(int(words[1]), words[0] == "top"), len(words) == 4)


RANK_STATE = "rank"  # an output row carrying a rank entry, not a transition


def first_k(entries: Iterable[tuple[str, float]], rank: Rank) -> list[tuple[str, float]]:
    """The first ``rank.k`` of ``(key, value)`` pairs in rank order."""
    return sorted(entries, key=lambda kv: rank.order(kv[1], kv[0]))[: rank.k]


class RankBook:
    """One shard's keys of one view in rank order by one value, one direction: moved as they change."""

    def __init__(self, top: bool) -> None:
        self.top = top
        self._sorted: SortedList = SortedList()
        self._values: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self._values)

    def update(self, changes: Iterable[tuple[str, float | None]]) -> None:
        """Keys with their new values (None: unranked, no event in the window or no value)."""
        for key, value in changes:
            old = self._values.pop(key, None)
            if old is not None:
                self._sorted.remove(order(old, key, self.top))
            if value is not None:
                self._values[key] = value
                self._sorted.add(order(value, key, self.top))

    def value(self, key: str) -> float | None:
        return self._values.get(key)

    def first(self, k: int) -> list[tuple[str, float]]:
        return [(key, self._values[key]) for _, key in self._sorted.islice(0, k)]


@dataclass
class RankState:
    """The merge's state of one rank subscription: what each shard sent last, who is in its first ``k``."""

    lists: dict[int, list[tuple[str, float, bool]]] = field(default_factory=dict)  # shard -> its last list
    members: dict[str, tuple[float, bool]] = field(default_factory=dict)  # key -> (value, listed): the first k
    merged_at: int | None = None  # the last boundary merged
    waiting: list[RankEntry] = field(default_factory=list)  # entries of boundaries not every shard has evaluated

    def to_dict(self) -> dict[str, Any]:
        return {"lists": {str(s): [list(e) for e in entries] for s, entries in self.lists.items()},
                "members": {key: list(v) for key, v in self.members.items()}, "merged_at": self.merged_at,
                "waiting": [list(e.to_row()) for e in self.waiting]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RankState:
        return cls({int(s): [(str(k), float(v), bool(listed)) for k, v, listed in entries]
                    for s, entries in data["lists"].items()},
                   {key: (float(v), bool(listed)) for key, (v, listed) in data["members"].items()},
                   data["merged_at"], [RankEntry.from_row(row) for row in data["waiting"]])


class RankMerge:
    """Every shard's lists of one rank subscription merged into its transitions, boundary by boundary."""

    def __init__(self, subscription_id: int, state: RankState | None = None) -> None:
        self.sid = subscription_id
        self.state = state or RankState()

    def merge(self, entries: Iterable[RankEntry], through: int) -> list[Transition]:
        """Take this subscription's new entries; merge every boundary up to ``through`` (every shard evaluated it).

        Returns the transitions in boundary order, firing before resolved, then by key."""
        state = self.state
        fresh = [e for e in entries if state.merged_at is None or e.boundary > state.merged_at]
        pending = list(dict.fromkeys(state.waiting + fresh))  # a replayed batch's entries wait once
        state.waiting = [e for e in pending if e.boundary > through]
        by_boundary: dict[int, dict[int, list[RankEntry]]] = {}
        for e in pending:
            if e.boundary <= through:
                by_boundary.setdefault(e.boundary, {}).setdefault(e.shard, []).append(e)
        transitions: list[Transition] = []
        for boundary in sorted(by_boundary):
            left: dict[str, float | None] = {}
            for shard, own in by_boundary[boundary].items():
                state.lists[shard] = [(e.key, e.value, e.listed) for e in own  # type: ignore[misc]  # in: a value
                                      if e.key != EMPTY_KEY and not e.out]
                left.update((e.key, e.value) for e in own if e.out)
            last = own[-1]  # an edit may change the rank: the newest entry's
            transitions += self._diff(last.rank, boundary, last.window_start, left)
            state.merged_at = boundary
        return transitions

    def _diff(self, rank: Rank, boundary: int, window_start: int, left: dict[str, float | None]) -> list[Transition]:
        """The keys that entered the first ``k`` (firing) and left them (resolved, with their value now: from a list
        or, for one no list holds, its shard's ``out`` entry)."""
        state = self.state
        every = {key: (value, listed) for entries in state.lists.values() for key, value, listed in entries}
        now = {key: every[key] for key, _ in first_k(((k, v) for k, (v, _) in every.items()), rank)}
        out = []
        for key in sorted(now.keys() - state.members.keys()):
            value, listed = now[key]
            if listed:
                out.append(self._transition(key, "firing", value, window_start, boundary))
        for key in sorted(state.members.keys() - now.keys()):
            listed = state.members[key][1]
            if listed:
                now_value = every[key][0] if key in every else left.get(key)
                out.append(self._transition(key, "resolved", now_value, window_start, boundary))
        state.members = now
        return out

    def _transition(self, key: str, state: State, value: float | None, start: int, boundary: int) -> Transition:
        return Transition(alert_id(self.sid, key, state, boundary), self.sid, key, state, value, start, boundary,
                          boundary)
