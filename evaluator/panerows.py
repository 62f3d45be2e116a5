"""Batches of pane aggregates: what Spark's pre-aggregation hands the evaluator.

One row per (key, pane start) of one micro-batch partition: the event count and,
per attribute, sum, min and max, plus the row's events themselves (time and
values, in CSR form: row ``i`` owns ``event_ts[event_offsets[i]:event_offsets[i+1]]``)
for the aggregates no pane summary answers (QUANTILE, LAST). Several rows may
share a (key, pane) when a pane's events arrive over several batches;
:meth:`PaneRows.combined` folds them. Rows serialise to one compact blob for the
state store's change log.
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
    event_offsets: np.ndarray  # int64, rows + 1
    event_ts: np.ndarray  # int64 event times
    event_values: np.ndarray  # (attributes, events) float64

    def __len__(self) -> int:
        return int(self.starts.size)

    @classmethod
    def empty(cls, n_attributes: int) -> PaneRows:
        nothing = np.empty((n_attributes, 0), dtype=np.float64)
        return cls(np.empty(0, dtype=object), np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64),
                   nothing, nothing.copy(), nothing.copy(), np.zeros(1, dtype=np.int64),
                   np.empty(0, dtype=np.int64), nothing.copy())

    def events_of(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Offsets (from 0) and event indexes of ``rows`` (indexes, in their order): a CSR gather."""
        lengths = np.diff(self.event_offsets)[rows]
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        firsts = self.event_offsets[:-1][rows]
        index = np.repeat(firsts - offsets[:-1], lengths) + np.arange(offsets[-1], dtype=np.int64)
        return offsets, index

    def take(self, rows: np.ndarray) -> PaneRows:
        """The rows at ``rows`` (indexes), in that order, with their events."""
        offsets, index = self.events_of(rows)
        return PaneRows(self.keys[rows], self.starts[rows], self.counts[rows], self.sums[:, rows],
                        self.mins[:, rows], self.maxs[:, rows], offsets, self.event_ts[index],
                        self.event_values[:, index])

    @classmethod
    def concat(cls, parts: Sequence[PaneRows], n_attributes: int) -> PaneRows:
        parts = [p for p in parts if len(p)]
        if not parts:
            return cls.empty(n_attributes)
        if len(parts) == 1:
            return parts[0]
        shifts = np.cumsum([0] + [int(p.event_offsets[-1]) for p in parts[:-1]])
        return cls(
            np.concatenate([p.keys for p in parts]),
            np.concatenate([p.starts for p in parts]),
            np.concatenate([p.counts for p in parts]),
            np.concatenate([p.sums for p in parts], axis=1),
            np.concatenate([p.mins for p in parts], axis=1),
            np.concatenate([p.maxs for p in parts], axis=1),
            np.concatenate([[0]] + [p.event_offsets[1:] + shift for p, shift in zip(parts, shifts, strict=True)]
                           ).astype(np.int64),
            np.concatenate([p.event_ts for p in parts]),
            np.concatenate([p.event_values for p in parts], axis=1),
        )

    def slice(self, start: int, stop: int) -> PaneRows:
        """Rows ``start:stop`` with their events: views of these arrays (only the offsets are new), so taking a
        prefix or a suffix costs its length, not a gather."""
        offsets = self.event_offsets[start:stop + 1]
        first, last = int(offsets[0]), int(offsets[-1])
        return PaneRows(self.keys[start:stop], self.starts[start:stop], self.counts[start:stop],
                        self.sums[:, start:stop], self.mins[:, start:stop], self.maxs[:, start:stop], offsets - first,
                        self.event_ts[first:last], self.event_values[:, first:last])

    def by_start(self) -> PaneRows:
        """The rows in pane-start order, rows of one start in their order (a stable sort): what :meth:`combined`
        makes of any prefix is then what it makes of the same rows in any order."""
        starts = self.starts
        if len(self) <= 1 or bool((starts[1:] >= starts[:-1]).all()):
            return self
        return self.take(np.argsort(starts, kind="stable"))

    def select(self, mask: np.ndarray) -> PaneRows:
        return self.take(np.flatnonzero(mask))

    def combined(self) -> PaneRows:
        """One row per (key, pane), ordered by pane start then key."""
        if len(self) <= 1:
            return self
        ordered = self.take(np.lexsort((self.keys.astype(str), self.starts)))
        keys, starts = ordered.keys, ordered.starts
        new_group = np.ones(len(ordered), dtype=bool)
        new_group[1:] = (starts[1:] != starts[:-1]) | (keys[1:] != keys[:-1])
        if new_group.all():
            return ordered
        first = np.flatnonzero(new_group)
        return PaneRows(
            keys[first],
            starts[first],
            np.add.reduceat(ordered.counts, first),
            np.add.reduceat(ordered.sums, first, axis=1),
            np.minimum.reduceat(ordered.mins, first, axis=1),
            np.maximum.reduceat(ordered.maxs, first, axis=1),
            np.append(ordered.event_offsets[first], ordered.event_offsets[-1]),
            ordered.event_ts,
            ordered.event_values,
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
            self.event_offsets.astype(np.int64).tobytes(),
            self.event_ts.astype(np.int64).tobytes(),
            self.event_values.astype(np.float64).tobytes(),
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
            array: np.ndarray = np.frombuffer(blob, dtype=dtype, count=count, offset=offset).copy()
            offset += array.nbytes
            return array

        starts, counts = take(np.int64, n), take(np.int64, n)
        sums, mins, maxs = (take(np.float64, a * n).reshape(a, n) for _ in range(3))
        offsets = take(np.int64, n + 1)
        events = int(offsets[-1])
        event_ts = take(np.int64, events)
        event_values = take(np.float64, a * events).reshape(a, events)
        return cls(np.array(keys, dtype=object), starts, counts, sums, mins, maxs, offsets, event_ts, event_values)
