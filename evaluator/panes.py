"""Per-key pane synopsis: count, sum, min and max of each attribute per time slice.

Panes (Golab's basic windows, Li et al.'s panes) are the unit Spark
pre-aggregates into, so a window of any multiple of the pane width is answered by
combining whole panes. A late event updates the pane it belongs to, which makes it
count in every later window extent that still covers that pane (WID's generous
semantics). The store is a handful of NumPy arrays so it serialises compactly
into Spark's state store.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

_HEADER = struct.Struct("<II")  # panes, attributes


@dataclass(frozen=True, slots=True)
class WindowAggregate:
    count: int
    sums: np.ndarray
    mins: np.ndarray
    maxs: np.ndarray


class PaneStore:
    """Panes of one key, sorted by start time."""

    __slots__ = ("n_attributes", "starts", "counts", "sums", "mins", "maxs")

    def __init__(self, n_attributes: int) -> None:
        self.n_attributes = n_attributes
        self.starts = np.empty(0, dtype=np.int64)
        self.counts = np.empty(0, dtype=np.int64)
        self.sums = np.empty((n_attributes, 0), dtype=np.float64)
        self.mins = np.empty((n_attributes, 0), dtype=np.float64)
        self.maxs = np.empty((n_attributes, 0), dtype=np.float64)

    def __len__(self) -> int:
        return int(self.starts.size)

    def merge(
        self, starts: np.ndarray, counts: np.ndarray, sums: np.ndarray, mins: np.ndarray, maxs: np.ndarray
    ) -> None:
        """Fold pane aggregates (possibly for panes already present) into the store."""
        if starts.size == 0:
            return
        all_starts = np.concatenate([self.starts, starts.astype(np.int64)])
        unique, inverse = np.unique(all_starts, return_inverse=True)
        n = unique.size
        counts_out = np.zeros(n, dtype=np.int64)
        np.add.at(counts_out, inverse, np.concatenate([self.counts, counts.astype(np.int64)]))
        sums_out = np.zeros((self.n_attributes, n))
        mins_out = np.full((self.n_attributes, n), np.inf)
        maxs_out = np.full((self.n_attributes, n), -np.inf)
        for a in range(self.n_attributes):
            np.add.at(sums_out[a], inverse, np.concatenate([self.sums[a], sums[a]]))
            np.minimum.at(mins_out[a], inverse, np.concatenate([self.mins[a], mins[a]]))
            np.maximum.at(maxs_out[a], inverse, np.concatenate([self.maxs[a], maxs[a]]))
        self.starts, self.counts, self.sums, self.mins, self.maxs = unique, counts_out, sums_out, mins_out, maxs_out

    def expire(self, before_ms: int) -> None:
        """Drop panes that start before ``before_ms``: no window will need them again."""
        keep = int(np.searchsorted(self.starts, before_ms, side="left"))
        if keep:
            self.starts = self.starts[keep:]
            self.counts = self.counts[keep:]
            self.sums = self.sums[:, keep:]
            self.mins = self.mins[:, keep:]
            self.maxs = self.maxs[:, keep:]

    def window(self, start_ms: int, end_ms: int) -> WindowAggregate:
        """Aggregate of the panes starting in ``[start_ms, end_ms)``."""
        lo = int(np.searchsorted(self.starts, start_ms, side="left"))
        hi = int(np.searchsorted(self.starts, end_ms, side="left"))
        if hi <= lo:
            empty = np.full(self.n_attributes, np.nan)
            return WindowAggregate(0, np.zeros(self.n_attributes), empty, empty)
        return WindowAggregate(
            int(self.counts[lo:hi].sum()),
            self.sums[:, lo:hi].sum(axis=1),
            self.mins[:, lo:hi].min(axis=1),
            self.maxs[:, lo:hi].max(axis=1),
        )

    def to_bytes(self) -> bytes:
        return b"".join(
            [
                _HEADER.pack(len(self), self.n_attributes),
                self.starts.tobytes(),
                self.counts.tobytes(),
                self.sums.tobytes(),
                self.mins.tobytes(),
                self.maxs.tobytes(),
            ]
        )

    @classmethod
    def from_bytes(cls, blob: bytes) -> PaneStore:
        n, n_attributes = _HEADER.unpack_from(blob)
        store = cls(n_attributes)
        offset = _HEADER.size
        vector, matrix = n * 8, n * n_attributes * 8

        def take(size: int, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
            nonlocal offset
            array = np.frombuffer(blob, dtype=dtype, count=size // 8, offset=offset).reshape(shape).copy()
            offset += size
            return array

        store.starts = take(vector, np.int64, (n,))
        store.counts = take(vector, np.int64, (n,))
        store.sums = take(matrix, np.float64, (n_attributes, n))
        store.mins = take(matrix, np.float64, (n_attributes, n))
        store.maxs = take(matrix, np.float64, (n_attributes, n))
        return store
