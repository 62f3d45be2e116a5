"""Each key's recent events, for the aggregates no pane summary can answer (QUANTILE, LAST, CHANGE:
evaluator/aggregates.py) and for tuple windows (evaluator/tuples.py).

A quantile needs the window's values themselves, so a shard keeps every event
(time and attribute values) of the last ``retention_ms`` per key, in event-time
order in a growable buffer: appending a pane is amortised O(its events), a late
event is merged in. Beyond the retention each key keeps only its newest event,
which is what LAST needs over longer windows, until the key has had no event for
the whole horizon; with ``keep_last`` it keeps at least its newest ``keep_last`` events
(``TOCSIN_TUPLE_MAX_EVENTS``: the longest tuple window), so memory is bounded by the
active keys times that bound.

Windows are the evaluator's: at boundary ``b`` a window of ``T`` holds the events
with ``b - T <= ts < b`` (panes are aligned and windows whole panes).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import numpy as np
import pandas as pd

from evaluator.panerows import PaneRows


class _Events:
    """One key's events: ``ts[head:end]`` in time order and their values ``vals[:, head:end]``."""

    __slots__ = ("end", "head", "ts", "vals")

    def __init__(self, n_attributes: int, capacity: int = 8) -> None:
        self.ts = np.empty(capacity, dtype=np.int64)
        self.vals = np.empty((n_attributes, capacity), dtype=np.float64)
        self.head = self.end = 0

    def __len__(self) -> int:
        return self.end - self.head

    def live(self) -> tuple[np.ndarray, np.ndarray]:
        return self.ts[self.head : self.end], self.vals[:, self.head : self.end]

    def _reset(self, ts: np.ndarray, vals: np.ndarray) -> None:
        capacity = max(8, 1 << int(len(ts) * 2 - 1).bit_length())
        self.ts = np.empty(capacity, dtype=np.int64)
        self.vals = np.empty((vals.shape[0], capacity), dtype=np.float64)
        self.ts[: len(ts)], self.vals[:, : len(ts)] = ts, vals
        self.head, self.end = 0, len(ts)

    def add(self, ts: np.ndarray, vals: np.ndarray, cut: int | None = None, keep_last: int = 1) -> None:
        """Add events in time order (among equal times, in arrival order): appended in amortised O(len) after the
        newest held, merged if late. A full buffer first drops what :meth:`expire` at ``cut`` would."""
        if len(self) and ts[0] < self.ts[self.end - 1]:  # late: merge, keeping arrival order among equal times
            old_ts, old_vals = self.live()
            all_ts = np.concatenate([old_ts, ts])
            merged = np.argsort(all_ts, kind="stable")
            self._reset(all_ts[merged], np.concatenate([old_vals, vals], axis=1)[:, merged])
            return
        n = len(ts)
        if self.end + n > self.ts.size and cut is not None:
            self.expire(cut, keep_last)
        if self.end + n > self.ts.size:
            self._reset(*(np.concatenate([a, b], axis=-1) for a, b in zip(self.live(), (ts, vals), strict=True)))
            return
        self.ts[self.end : self.end + n], self.vals[:, self.end : self.end + n] = ts, vals
        self.end += n

    def expire(self, before: int, keep_last: int = 1) -> None:
        """Drop events older than ``before``, but keep the newest ``keep_last`` (at least one)."""
        ts, _ = self.live()
        cut = min(int(np.searchsorted(ts, before, side="left")), len(ts) - max(keep_last, 1))
        self.head += max(cut, 0)
        if self.head > self.ts.size // 2 and self.head > 64:
            self._reset(*self.live())

    def window(self, start: int, end: int) -> tuple[int, int]:
        ts, _ = self.live()
        return (self.head + int(np.searchsorted(ts, start, side="left")),
                self.head + int(np.searchsorted(ts, end, side="left")))


class KeyValues:
    """Every key's retained events. Adding only queues the events; the first read (a window, a tuple, a snapshot),
    the periodic sweep or a full queue settles them: one sort of all queued events by (key, time) in NumPy, then
    per key a slice copy into its buffer. A catalog with nothing reading events (no QUANTILE, LAST, CHANGE or tuple
    window) so pays the per-key step once per :attr:`SETTLE_EVENTS`, not at every boundary, yet a subscription that
    starts reading them is exact from its first evaluation. Expiry sweeps the keys held once per
    :attr:`SWEEP_SHARE` of the horizon, not at every boundary (a buffer that fills up is trimmed as it grows). What
    a sweep has not dropped yet is older than every window that reads it: answers are those of expiring at every
    boundary."""

    #: Keys are swept (trimmed to the retention, dropped without an event in the horizon) once per this share of
    #: the horizon: memory holds at most that much more, and a boundary costs no per-key step in between.
    SWEEP_SHARE = 16
    #: Queued events are settled into the keys' buffers once this many wait (or a read or sweep comes first): the
    #: per-key step is paid once per this many events, and the queue's memory stays small.
    SETTLE_EVENTS = 1 << 18

    def __init__(self, attributes: tuple[str, ...], retention_ms: int, keep_last: int = 0) -> None:
        self.attributes = attributes
        self.index = {a: i for i, a in enumerate(attributes)}
        self.retention_ms = retention_ms
        self.keep_last = keep_last
        self._keys: dict[str, _Events] = {}
        self._queued: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # added, not settled: (keys, ts, values)
        self._queued_events = 0
        self._cut: int | None = None  # events before it are only kept as a key's newest (the last expire's)
        self._swept_at: int | None = None

    @property
    def keys(self) -> dict[str, _Events]:
        """Each key's events, every added one settled in."""
        self._settle()
        return self._keys

    def add(self, rows: PaneRows) -> None:
        """Add the events of pane rows (in or out of order)."""
        offsets = rows.event_offsets
        first, last = int(offsets[0]), int(offsets[-1])
        if not len(rows) or first == last:
            return
        self._queued.append((np.repeat(rows.keys, np.diff(offsets)), rows.event_ts[first:last].copy(),
                             rows.event_values[:, first:last].copy()))  # copies: the batch's arrays are not held
        self._queued_events += last - first
        if self._queued_events >= self.SETTLE_EVENTS:
            self._settle()

    def _settle(self) -> None:
        if not self._queued:
            return
        queued, self._queued, self._queued_events = self._queued, [], 0
        event_keys, ts_all, vals_all = (np.concatenate([q[0] for q in queued]), np.concatenate([q[1] for q in queued]),
                                        np.concatenate([q[2] for q in queued], axis=1))
        event_codes, names = pd.factorize(event_keys)
        order = np.lexsort((ts_all, event_codes))  # by key, then time; stable: arrival order among equal times
        sorted_codes = event_codes[order]
        ts = ts_all[order]
        vals = vals_all[:, order]
        bounds = np.flatnonzero(np.r_[True, sorted_codes[1:] != sorted_codes[:-1], True]).tolist()
        keys, n_attributes, cut, keep = self._keys, len(self.attributes), self._cut, max(self.keep_last, 1)
        for first, last, code in zip(bounds[:-1], bounds[1:], sorted_codes[bounds[:-1]].tolist(), strict=True):
            key = names[code]
            events = keys.get(key)
            if events is None:
                events = keys[key] = _Events(n_attributes)
            events.add(ts[first:last], vals[:, first:last], cut, keep)

    def expire(self, boundary: int, horizon_ms: int) -> None:
        """At ``boundary``: keep ``retention_ms`` of events, and keys with an event within the horizon.

        One pass over the keys held, comparing two times each, once per ``horizon_ms / SWEEP_SHARE``; only the keys
        with an event to drop are trimmed (a search each), never anything for a key gone from the horizon.
        """
        gone, cut = boundary - horizon_ms, boundary - self.retention_ms
        self._cut = cut
        if self._swept_at is not None and boundary - self._swept_at < horizon_ms // self.SWEEP_SHARE:
            return
        self._swept_at = boundary
        dropped = []
        for key, events in self.keys.items():
            ts = events.ts
            if ts[events.end - 1] < gone:
                dropped.append(key)
            elif events.end - events.head > max(self.keep_last, 1) and ts[events.head] < cut:
                events.expire(cut, self.keep_last)
        for key in dropped:
            del self._keys[key]

    def window(self, key: str, attribute: str, window_ms: int, boundary: int) -> np.ndarray | None:
        """The attribute's values in ``key``'s window ``[boundary - window_ms, boundary)``, oldest first (a view)."""
        events = self.keys.get(key)
        if events is None:
            return None
        lo, hi = events.window(boundary - window_ms, boundary)
        return events.vals[self.index[attribute], lo:hi] if hi > lo else None

    def last(self, key: str, attribute: str | None, n: int, boundary: int, horizon_ms: int) -> np.ndarray | None:
        """The attribute's values (any, for None) of ``key``'s ``n`` newest events with
        ``boundary - horizon_ms <= ts < boundary``, oldest first: a tuple window (a view)."""
        events = self.keys.get(key)
        if events is None:
            return None
        lo, hi = events.window(boundary - horizon_ms, boundary)
        lo = max(lo, hi - n)
        return events.vals[self.index[attribute] if attribute else 0, lo:hi] if hi > lo else None

    # -- persistence ---------------------------------------------------------------------------------

    def _items(self) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
        for key, events in sorted(self.keys.items()):
            yield key, *events.live()

    def to_bytes(self) -> bytes:
        items = list(self._items())
        names = "\x00".join(k for k, _, _ in items).encode()
        lengths = np.array([len(ts) for _, ts, _ in items], dtype=np.int64)
        ts = np.concatenate([t for _, t, _ in items]) if items else np.empty(0, dtype=np.int64)
        vals = (np.concatenate([v for _, _, v in items], axis=1) if items
                else np.empty((len(self.attributes), 0), dtype=np.float64))
        return b"".join([struct.pack("<III", len(items), len(self.attributes), len(names)), names,
                         lengths.tobytes(), ts.astype(np.int64).tobytes(), vals.astype(np.float64).tobytes()])

    @classmethod
    def from_bytes(cls, blob: bytes, attributes: tuple[str, ...], retention_ms: int, keep_last: int = 0) -> KeyValues:
        store = cls(attributes, retention_ms, keep_last)
        n, a, name_bytes = struct.unpack_from("<III", blob)
        offset = 12
        names = blob[offset : offset + name_bytes].decode().split("\x00") if n else []
        offset += name_bytes
        lengths = np.frombuffer(blob, dtype=np.int64, count=n, offset=offset)
        offset += lengths.nbytes
        total = int(lengths.sum())
        ts = np.frombuffer(blob, dtype=np.int64, count=total, offset=offset)
        offset += ts.nbytes
        vals = np.frombuffer(blob, dtype=np.float64, count=a * total, offset=offset).reshape(a, total)
        start = 0
        for key, length in zip(names, lengths.tolist(), strict=True):
            events = store._keys[key] = _Events(a)
            events._reset(ts[start : start + length].copy(), vals[:, start : start + length].copy())
            start += length
        return store
