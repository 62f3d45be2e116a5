"""Admission: a burst of new subscriptions spread over micro-batches, so the stream never waits behind it.

A subscription's first evaluation fires for every key that already matches it: 100,000 subscriptions
started over a backlog are millions of transitions at one boundary, and every other subscription of the
shard, and the stream, would wait behind them. A shard therefore admits new subscriptions at most
``limit`` of their first transitions per micro-batch; the others wait (not evaluated, nothing firing)
and start at the boundary of a later batch that admits them. Whatever was admitted is never held back:
its transitions, an edit's re-evaluation and a restore's check included, are not budgeted.

Decisions depend only on the catalog, the windows and the admitted set, which is kept with the shard
(deltas and snapshots), so a replayed batch admits the same subscriptions at the same boundaries and
its transitions keep their ids. A subscription and its internal second member (``lifecycle.aux_id``)
are admitted together; each shard admits for its own keys.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np


def owner(sid: int) -> int:
    """The subscription a member belongs to (internal second members have the negated id)."""
    return abs(sid)


class Admission:
    """Which subscriptions a shard has admitted, which wait, and this batch's budget of first transitions."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit  # first transitions admitted per batch; None: every new subscription at once
        self.admitted: set[int] = set()
        self.waiting: set[int] = set()  # known to the shard, not admitted yet
        self.admitted_now: list[int] = []  # this batch's, in order (a delta's)
        self.dropped_now: list[int] = []  # admitted ones deleted or paused this batch (a delta's, before its admits)
        self._left: int | None = limit
        self._admit_known = False  # restored from a snapshot written before admission: what it knew was admitted

    @property
    def limited(self) -> bool:
        return self.limit is not None

    @property
    def open(self) -> bool:
        """More may be admitted in this batch."""
        return self._left is None or self._left > 0

    def start_batch(self) -> None:
        self._left, self.admitted_now, self.dropped_now = self.limit, [], []

    def waits(self, sid: int) -> bool:
        return owner(sid) not in self.admitted

    def take(self, first_transitions: Sequence[int]) -> int:
        """How many of these candidates, in order, are admitted now, given each one's first transitions: each
        whose predecessors leave budget (one at least while it is open: every batch makes progress)."""
        if self._left is None:
            return len(first_transitions)
        before = np.cumsum(np.asarray(first_transitions, dtype=np.int64)) - np.asarray(first_transitions)
        return int(np.searchsorted(before, self._left, side="left"))

    def admit(self, sids: Iterable[int], transitions: int) -> None:
        for sid in sids:
            o = owner(sid)
            if o not in self.admitted:
                self.admitted.add(o)
                self.waiting.discard(o)
                self.admitted_now.append(o)
        if self._left is not None:
            self._left -= transitions

    # -- following the catalog ----------------------------------------------------------------------------

    def follow(self, sid: int) -> None:
        """A subscription the shard evaluates (new, edited or rebuilt from the catalog)."""
        if self._admit_known or self.limit is None:
            self.admitted.add(sid)  # nothing waits without a limit: a later limit holds back only what is new
        elif sid not in self.admitted:
            self.waiting.add(sid)

    def drop(self, sid: int) -> None:
        """Deleted or paused (as the catalog stands after the batch's changes): if it comes back, it is new again."""
        if sid in self.admitted:
            self.admitted.discard(sid)
            self.dropped_now.append(sid)
        self.waiting.discard(sid)

    def rebuilt(self, sids: Iterable[int]) -> None:
        """The catalog was read whole (a new or restored shard): ``sids`` is everything it evaluates."""
        known = set(sids)
        self.dropped_now += sorted(self.admitted - known)
        self.admitted &= known
        self.waiting = known - self.admitted
        self._admit_known = False

    # -- persisting ---------------------------------------------------------------------------------------

    def replayed(self, admitted: Iterable[int], dropped: Iterable[int] = ()) -> None:
        """Another copy of the shard dropped, then admitted, these in a batch this copy replays."""
        for sid in dropped:
            self.admitted.discard(sid)
        for sid in admitted:
            self.admitted.add(sid)
            self.waiting.discard(sid)

    def to_json(self) -> list[int]:
        return sorted(self.admitted)

    def restore(self, admitted: list[int] | None) -> None:
        """From a snapshot; None: one written before admission existed, whose subscriptions were all evaluated."""
        if admitted is None:
            self._admit_known = True
        else:
            self.admitted = set(admitted)
