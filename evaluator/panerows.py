"""Batches of pane aggregates: what Spark's pre-aggregation hands the evaluator.

One row per (key, pane start) of one micro-batch partition: the event count and,
per attribute, sum, min and max. Several rows may share a (key, pane) when a
pane's events arrive over several batches; :meth:`PaneRows.combined` folds them.
Rows serialise to one compact blob for the state store's change log.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_HEADER = struct.Struct("<II")  # rows, attributes


@dataclass(frozen=True)
class PaneRows:
    keys: np.ndarray  # object array of str
    starts: np.ndarray  # int64 pane starts
    counts: np.ndarray  # int64
    sums: np.ndarray  # (attributes, rows) float64
    mins: np.ndarray
    maxs: np.ndarray

    def __len__(self) -> int:
        return int(self.starts.size)

    @classmethod
    def empty(cls, n_attributes: int) -> PaneRows:
        nothing = np.empty((n_attributes, 0), dtype=np.float64)
        return cls(np.empty(0, dtype=object), np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64),
                   nothing, nothing.copy(), nothing.copy())

    @classmethod
    def concat(cls, parts: Sequence[PaneRows], n_attributes: int) -> PaneRows:
        parts = [p for p in parts if len(p)]
        if not parts:
            return cls.empty(n_attributes)
        if len(parts) == 1:
            return parts[0]
        return cls(
            np.concatenate([p.keys for p in parts]),
            np.concatenate([p.starts for p in parts]),
            np.concatenate([p.counts for p in parts]),
            np.concatenate([p.sums for p in parts], axis=1),
            np.concatenate([p.mins for p in parts], axis=1),
            np.concatenate([p.maxs for p in parts], axis=1),
        )

    def select(self, mask: np.ndarray) -> PaneRows:
        return PaneRows(self.keys[mask], self.starts[mask], self.counts[mask], self.sums[:, mask],
                        self.mins[:, mask], self.maxs[:, mask])

    def combined(self) -> PaneRows:
        """One row per (key, pane), ordered by pane start then key."""
        if len(self) <= 1:
            return self
        order = np.lexsort((self.keys.astype(str), self.starts))
        keys, starts = self.keys[order], self.starts[order]
        new_group = np.ones(len(order), dtype=bool)
        new_group[1:] = (starts[1:] != starts[:-1]) | (keys[1:] != keys[:-1])
        if new_group.all():
            return self.select(order)
        first = np.flatnonzero(new_group)
        return PaneRows(
            keys[first],
            starts[first],
            np.add.reduceat(self.counts[order], first),
            np.add.reduceat(self.sums[:, order], first, axis=1),
            np.minimum.reduceat(self.mins[:, order], first, axis=1),
            np.maximum.reduceat(self.maxs[:, order], first, axis=1),
        )

    def to_bytes(self) -> bytes:
        keys = "\x00".join(self.keys.tolist()).encode()
        return b"".join([
            _HEADER.pack(len(self), self.sums.shape[0]),
            struct.pack("<I", len(keys)),
            keys,
            self.starts.astype(np.int64).tobytes(),
            self.counts.astype(np.int64).tobytes(),
            self.sums.astype(np.float64).tobytes(),
            self.mins.astype(np.float64).tobytes(),
            self.maxs.astype(np.float64).tobytes(),
        ])

    @classmethod
    def from_bytes(cls, blob: bytes) -> PaneRows:
        n, a = _HEADER.unpack_from(blob)
        offset = _HEADER.size
        (key_bytes,) = struct.unpack_from("<I", blob, offset)
        offset += 4
        keys = blob[offset : offset + key_bytes].decode().split("\x00") if n else []
        offset += key_bytes

        def take(dtype: type, count: int) -> np.ndarray:
            nonlocal offset
            array = np.frombuffer(blob, dtype=dtype, count=count, offset=offset).copy()
            offset += array.nbytes
            return array

        starts, counts = take(np.int64, n), take(np.int64, n)
        sums, mins, maxs = (take(np.float64, a * n).reshape(a, n) for _ in range(3))
        return cls(np.array(keys, dtype=object), starts, counts, sums, mins, maxs)
