"""Ordered indexes of (timestamp, key) pairs packed into single integers.

Packing makes every comparison one integer comparison, which is what keeps the
sorted containers fast; ``key_bits`` bounds the number of keys an index can hold.
"""

from __future__ import annotations

from collections.abc import Iterator

from sortedcontainers import SortedList

KEY_BITS = 24
KEY_MASK = (1 << KEY_BITS) - 1
MAX_KEYS = 1 << KEY_BITS


class StampIndex:
    """For each key at most one timestamp; reports the keys whose timestamp exceeds a bound."""

    __slots__ = ("entries", "stamp")

    def __init__(self) -> None:
        self.entries = SortedList()
        self.stamp: dict[int, int] = {}

    def set(self, key_id: int, ts: int) -> None:
        old = self.stamp.get(key_id)
        if old == ts:
            return
        if old is not None:
            self.entries.remove((old << KEY_BITS) | key_id)
        self.stamp[key_id] = ts
        self.entries.add((ts << KEY_BITS) | key_id)

    def discard(self, key_id: int) -> None:
        old = self.stamp.pop(key_id, None)
        if old is not None:
            self.entries.remove((old << KEY_BITS) | key_id)

    def newer_than(self, t0: int) -> Iterator[int]:
        """Key ids whose timestamp is > ``t0``: O(log K + answer)."""
        start = self.entries.bisect_left((t0 + 1) << KEY_BITS)
        for encoded in self.entries.islice(start):
            yield encoded & KEY_MASK

    def __len__(self) -> int:
        return len(self.stamp)
