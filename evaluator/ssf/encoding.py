"""The ordered index behind every collective index: which keys have a stamp newer than t0?

Stamps are bucketed by time (a calendar): moving a key's stamp is two set
operations, O(1), and "newer than t0" unions the buckets after t0's bucket (C-speed
set unions) and filters only t0's own bucket. A sorted list of the non-empty bucket
numbers finds the first bucket by binary search. Lookup cost is
O(log B + buckets spanned + output): choose ``bucket_ms`` near a sixteenth of the
shortest window.
"""

from __future__ import annotations

import builtins

from sortedcontainers import SortedList


class StampIndex:
    """For each key at most one timestamp; reports the keys whose timestamp exceeds a bound."""

    __slots__ = ("bucket_ms", "buckets", "order", "stamp")

    def __init__(self, bucket_ms: int = 1_000) -> None:
        self.bucket_ms = bucket_ms
        self.stamp: dict[int, int] = {}
        self.buckets: dict[int, set[int]] = {}
        self.order = SortedList()  # non-empty bucket numbers

    def set(self, key_id: int, ts: int) -> None:
        old = self.stamp.get(key_id)
        if old == ts:
            return
        self.stamp[key_id] = ts
        new_bucket = ts // self.bucket_ms
        if old is not None:
            old_bucket = old // self.bucket_ms
            if old_bucket == new_bucket:
                return
            self._leave(old_bucket, key_id)
        members = self.buckets.get(new_bucket)
        if members is None:
            members = self.buckets[new_bucket] = set()
            self.order.add(new_bucket)
        members.add(key_id)

    def _leave(self, bucket: int, key_id: int) -> None:
        members = self.buckets[bucket]
        members.discard(key_id)
        if not members:
            del self.buckets[bucket]
            self.order.remove(bucket)

    def discard(self, key_id: int) -> None:
        old = self.stamp.pop(key_id, None)
        if old is not None:
            self._leave(old // self.bucket_ms, key_id)

    def newer_than(self, t0: int) -> builtins.set[int]:  # in this class ``set`` is the method
        """Key ids whose timestamp is > ``t0``."""
        first = t0 // self.bucket_ms
        found: set[int] = set()
        start = self.order.bisect_left(first)
        if start < len(self.order) and self.order[start] == first:
            stamp = self.stamp
            found.update(k for k in self.buckets[first] if stamp[k] > t0)
            start += 1
        for bucket in self.order.islice(start):
            found.update(self.buckets[bucket])
        return found

    def at_most(self, t: int) -> builtins.set[int]:
        """Key ids whose timestamp is <= ``t``: O(log B + buckets spanned + output)."""
        last = t // self.bucket_ms
        found: set[int] = set()
        for bucket in self.order.irange(maximum=last):
            members = self.buckets[bucket]
            if bucket == last:
                stamp = self.stamp
                found.update(k for k in members if stamp[k] <= t)
            else:
                found.update(members)
        return found

    def __len__(self) -> int:
        return len(self.stamp)
