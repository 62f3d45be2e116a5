"""All the collective indexes one evaluator shard needs, fed directly by pane aggregates.

Spark pre-aggregates each (key, pane) into count, sum, min and max per attribute;
a pane is one element of the value-expanded streams: its count feeds CI-COUNT, its
sums CI-SUM, its min and max the MIN and MAX staircases, all stamped with the pane
start. Panes are applied in pane order, once complete.

The indexes persist as parts (:meth:`CollectiveIndexes.to_parts`): COUNT, then per
attribute SUM, MAX and MIN, each its structure's own bytes; the shard snapshot
stores them as they come and hands them back to :meth:`CollectiveIndexes.from_parts`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from evaluator.spec import Aggregate, Condition
from evaluator.ssf.ci_extreme import CollectiveExtreme
from evaluator.ssf.ci_sum import CollectiveSum


class CollectiveIndexes:
    def __init__(self, attributes: Sequence[str], p: int = 4, bucket_ms: int = 1_000) -> None:
        self.attributes = tuple(attributes)
        self.count = CollectiveSum(p=p, bucket_ms=bucket_ms)
        self.sums = {a: CollectiveSum(p=p, bucket_ms=bucket_ms) for a in self.attributes}
        self.maxs = {a: CollectiveExtreme("MAX", bucket_ms=bucket_ms) for a in self.attributes}
        self.mins = {a: CollectiveExtreme("MIN", bucket_ms=bucket_ms) for a in self.attributes}

    def add_panes(
        self,
        keys: Sequence[str],
        pane_starts: np.ndarray,
        counts: np.ndarray,
        sums: np.ndarray,
        mins: np.ndarray,
        maxs: np.ndarray,
        late: bool = False,
    ) -> None:
        """Fold pane aggregates; ``sums/mins/maxs`` are ``(attributes, panes)`` arrays.

        ``late`` panes may be older than what the indexes hold (the correction path for
        late events); others must not be, and are applied in pane order.
        """
        order = np.argsort(pane_starts, kind="stable")
        keys = [keys[i] for i in order]
        starts = [int(t) for t in pane_starts[order]]
        if not late:
            self.count.add_batch(keys, starts, counts[order])
            for a, name in enumerate(self.attributes):
                self.sums[name].add_batch(keys, starts, sums[a][order])
                self.maxs[name].add_batch(keys, starts, maxs[a][order])
                self.mins[name].add_batch(keys, starts, mins[a][order])
            return
        for key, t, n in zip(keys, starts, counts[order].tolist(), strict=True):
            self.count.add_late(key, t, float(n))
        for a, name in enumerate(self.attributes):
            for key, t, v in zip(keys, starts, sums[a][order].tolist(), strict=True):
                self.sums[name].add_late(key, t, v)
            self.maxs[name].add_late(keys, starts, maxs[a][order].tolist())
            self.mins[name].add_late(keys, starts, mins[a][order].tolist())

    def to_parts(self) -> list[bytes]:
        """The indexes' serialised form: COUNT, then per attribute (in order) SUM, MAX and MIN."""
        parts = [self.count.to_bytes()]
        for a in self.attributes:
            parts += [self.sums[a].to_bytes(), self.maxs[a].to_bytes(), self.mins[a].to_bytes()]
        return parts

    @classmethod
    def from_parts(cls, attributes: Sequence[str], parts: Sequence[bytes]) -> CollectiveIndexes:
        """The indexes :meth:`to_parts` gave (each structure restores its own parameters)."""
        attributes = tuple(attributes)
        if len(parts) != 1 + 3 * len(attributes):
            raise ValueError(f"{len(parts)} index parts for {len(attributes)} attributes; expected {1 + 3 * len(attributes)}")
        indexes = cls(attributes)
        indexes.count = CollectiveSum.from_bytes(parts[0])
        for i, a in enumerate(attributes):
            indexes.sums[a] = CollectiveSum.from_bytes(parts[1 + 3 * i])
            indexes.maxs[a] = CollectiveExtreme.from_bytes(parts[2 + 3 * i])
            indexes.mins[a] = CollectiveExtreme.from_bytes(parts[3 + 3 * i])
        return indexes

    def expire(self, before_ts: int) -> None:
        for index in (self.count, *self.sums.values(), *self.maxs.values(), *self.mins.values()):
            index.expire(before_ts)

    def matching(self, condition: Condition, now: int) -> set[str]:
        """Keys whose window ``(now - T, now]`` satisfies ``condition``, exactly."""
        attribute = condition.attribute or ""  # COUNT(*) has none; SUM, MIN and MAX always name one (check_term)
        if condition.aggregate is Aggregate.COUNT:
            return self.count.matching_keys(condition, now)
        if condition.aggregate is Aggregate.SUM:
            return self.sums[attribute].matching_keys(condition, now)
        if condition.aggregate is Aggregate.MAX:
            return set(self.maxs[attribute].query(condition, now))
        if condition.aggregate is Aggregate.MIN:
            return set(self.mins[attribute].query(condition, now))
        raise NotImplementedError(f"no collective index for {condition.aggregate}")
