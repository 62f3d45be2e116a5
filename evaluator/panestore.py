"""A shard's panes as arrays, and every window's running aggregates per key, updated by array slices.

Keys get small integer ids (:class:`KeyIds`), recycled once a key has no pane in the
horizon and fires for nobody, so every per-key array is bounded by the keys active at
once, not by every key ever seen. The panes of the horizon sit in one columnar store in
pane order (:class:`PaneStore`); late panes are inserted in place (a duplicate (key, pane)
row simply adds up, as counts, sums, mins and maxs do).

:class:`RunningWindows` keeps, per window length ``T`` in use and for the horizon, each
key's aggregates of its window ``[R - T, R)`` at the store's boundary ``R``. Moving to
``b``, the panes entering a window start in ``[max(R, b - T), b)`` and those leaving it in
``[R - T, min(R, b - T))``: two slices of the store, applied with vectorised scatter ops.
COUNT is exact in int64; SUM is exact in integer units of ``2**-shift`` (Python ints in
object arrays, :func:`units`), so a window sum is its panes' exact sum rounded once,
whatever the key's history (float add/subtract would drift); MIN/MAX grow by scatter-max
as panes enter and are recomputed from the store, vectorised, only for keys whose leaving
pane held the extreme. The keys touched since the last evaluation are kept per window
(``dirty``): the only keys whose values can have changed.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

_BIG = 1 << 62


def units(values: np.ndarray, shift: int) -> tuple[np.ndarray, int]:
    """Finite floats as exact integers (object array) in units of ``2**-s``; ``s`` is ``shift`` or the finer
    unit some value needs (the caller then scales what it holds by ``2**(s - shift)``)."""
    mantissa, exponent = np.frexp(values)
    m = (mantissa * 2.0**53).astype(np.int64)
    nonzero = m != 0
    lowest = np.where(nonzero, m & -m, 1)
    trailing = np.frexp(lowest.astype(np.float64))[1] - 1
    m >>= trailing
    exponent = np.where(nonzero, exponent - 53 + trailing, 0).astype(np.int64)
    need = max(shift, int(-exponent.min()) if exponent.size else 0)
    return m.astype(object) << (exponent + need).astype(object), need


def distinct_ids(parts: Sequence[np.ndarray], capacity: int) -> np.ndarray:
    """The key ids in ``parts`` (each below ``capacity``), distinct and in order, as ``np.unique`` gives them: by
    marking each id in a mask when the parts are not much smaller than the ids in use (linear, where ``np.unique``
    sorts: a boundary's touched keys are several parts of the same few thousand ids)."""
    total = sum(part.size for part in parts)
    if not total:
        return np.empty(0, dtype=np.int64)
    if total * 16 < capacity:
        return np.unique(np.concatenate(parts))
    marked = np.zeros(capacity, dtype=bool)
    for part in parts:
        marked[part] = True
    return np.flatnonzero(marked)


def to_floats(exact: np.ndarray, shift: int) -> np.ndarray:
    """Exact unit sums as the nearest floats (correctly rounded; ±inf beyond the float range)."""
    one = 1 << shift
    try:
        return (exact / one).astype(np.float64)
    except OverflowError:
        return np.array([v / one if abs(v) < one << 1023 else np.copysign(np.inf, v) for v in exact.tolist()],
                        dtype=np.float64)


class KeyIds:
    """Key text <-> small int; ids are reused once released, so arrays indexed by id stay bounded."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.names: list[str | None] = []
        self.free: list[int] = []
        self.version = 0  # changes whenever a key gets or loses an id

    @property
    def capacity(self) -> int:
        return len(self.names)

    def __len__(self) -> int:
        return len(self.ids)

    def of(self, keys: np.ndarray) -> np.ndarray:
        """Ids of ``keys`` (an object array of str), assigning new ones as needed, in the order keys first appear
        (found by hashing: sorting the strings took 2.4 ms for 10,000 rows of Zipf keys, hashing 0.32)."""
        if not keys.size:
            return np.empty(0, dtype=np.int64)
        inverse, distinct = pd.factorize(keys)
        ids = np.empty(distinct.size, dtype=np.int64)
        for i, key in enumerate(distinct.tolist()):
            kid = self.ids.get(key)
            if kid is None:
                if self.free:
                    kid = self.free.pop()
                    self.names[kid] = key
                else:
                    kid = len(self.names)
                    self.names.append(key)
                self.ids[key] = kid
                self.version += 1
            ids[i] = kid
        return ids[inverse.reshape(-1)]

    def get(self, key: str) -> int | None:
        return self.ids.get(key)

    def release(self, ids: Iterable[int]) -> None:
        for kid in ids:
            name = self.names[kid]
            if name is not None:
                del self.ids[name]
                self.names[kid] = None
                self.free.append(kid)
                self.version += 1

    def to_bytes(self) -> bytes:
        names = "\x00".join("" if n is None else n for n in self.names).encode()
        live = np.array([n is not None for n in self.names], dtype=np.uint8)
        free = np.array(self.free, dtype=np.int64)
        return b"".join([struct.pack("<QQQ", len(self.names), len(names), free.size), names, live.tobytes(),
                         free.tobytes()])

    @classmethod
    def from_bytes(cls, blob: bytes) -> KeyIds:
        table = cls()
        n, name_bytes, n_free = struct.unpack_from("<QQQ", blob)
        offset = 24
        names = blob[offset : offset + name_bytes].decode().split("\x00") if n else []
        offset += name_bytes
        live = np.frombuffer(blob, dtype=np.uint8, count=n, offset=offset)
        offset += n
        table.free = np.frombuffer(blob, dtype=np.int64, count=n_free, offset=offset).tolist()
        table.names = [name if alive else None for name, alive in zip(names, live.tolist(), strict=True)]
        table.ids = {name: i for i, name in enumerate(table.names) if name is not None}
        return table


@dataclass
class Panes:
    """Pane rows by key id: the columns the store and the windows work on."""

    ids: np.ndarray  # int64 key ids
    starts: np.ndarray  # int64
    counts: np.ndarray  # int64
    sums: np.ndarray  # (attributes, rows) float64
    mins: np.ndarray
    maxs: np.ndarray

    def __len__(self) -> int:
        return int(self.starts.size)

    def take(self, index: np.ndarray | slice) -> Panes:
        return Panes(self.ids[index], self.starts[index], self.counts[index], self.sums[:, index],
                     self.mins[:, index], self.maxs[:, index])

    @classmethod
    def concat(cls, parts: Sequence[Panes]) -> Panes:
        return cls(*(np.concatenate([getattr(p, f) for p in parts], axis=-1)
                     for f in ("ids", "starts", "counts", "sums", "mins", "maxs")))

    @classmethod
    def empty(cls, n_attributes: int) -> Panes:
        nothing = np.empty((n_attributes, 0), dtype=np.float64)
        return cls(np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64),
                   nothing, nothing.copy(), nothing.copy())


class PaneStore:
    """The horizon's panes in start order, as columns in a buffer with spare capacity: appends are amortised
    O(rows), expiry moves a head, a late pane is merged in (rare)."""

    def __init__(self, n_attributes: int) -> None:
        self.panes = Panes.empty(n_attributes)  # rows [head, end) are live
        self.head = self.end = 0

    @property
    def live(self) -> Panes:
        return self.rows(self.head, self.end)

    def rows(self, lo: int, hi: int) -> Panes:
        return self.panes.take(slice(lo, hi))

    def __len__(self) -> int:
        return self.end - self.head

    def add(self, rows: Panes) -> None:
        """Add rows in start order; rows older than the newest held (late) are merged in place."""
        n = len(rows)
        if not n:
            return
        if self.end > self.head and rows.starts[0] < self.panes.starts[self.end - 1]:
            merged = Panes.concat([self.live, rows])
            self._reset(merged.take(np.argsort(merged.starts, kind="stable")))
        elif self.end + n > len(self.panes):
            self._reset(Panes.concat([self.live, rows]))
        else:
            for name in ("ids", "starts", "counts"):
                getattr(self.panes, name)[self.end : self.end + n] = getattr(rows, name)
            for name in ("sums", "mins", "maxs"):
                getattr(self.panes, name)[:, self.end : self.end + n] = getattr(rows, name)
            self.end += n

    def _reset(self, live: Panes) -> None:
        capacity = max(1024, 2 * len(live))
        spare = Panes(*(np.empty((*a.shape[:-1], capacity), dtype=a.dtype) for a in
                        (live.ids, live.starts, live.counts, live.sums, live.mins, live.maxs)))
        self.panes, self.head, self.end = spare, 0, 0
        self.add(live)

    def span(self, low: int, high: int) -> tuple[int, int]:
        """Row range (absolute) of the panes starting in ``[low, high)``."""
        starts = self.panes.starts[self.head : self.end]
        return (self.head + int(np.searchsorted(starts, low, side="left")),
                self.head + int(np.searchsorted(starts, high, side="left")))

    def expire(self, before: int) -> None:
        """Forget panes starting before ``before``."""
        self.head, _ = self.span(before, before)


class Window:
    """Per key id: the aggregates of one window length over the panes it holds."""

    def __init__(self, ms: int, n_attributes: int, capacity: int, values: bool) -> None:
        self.ms = ms
        self.values = values  # False: counts only (the horizon)
        self.count = np.zeros(capacity, dtype=np.int64)
        a = n_attributes if values else 0
        self.sums = [np.zeros(capacity, dtype=object) for _ in range(a)]
        self.mins = np.full((a, capacity), np.inf)
        self.maxs = np.full((a, capacity), -np.inf)

    def grow(self, capacity: int) -> None:
        more = capacity - self.count.size
        if more <= 0:
            return
        self.count = np.concatenate([self.count, np.zeros(more, dtype=np.int64)])
        self.sums = [np.concatenate([s, np.zeros(more, dtype=object)]) for s in self.sums]
        self.mins = np.concatenate([self.mins, np.full((self.mins.shape[0], more), np.inf)], axis=1)
        self.maxs = np.concatenate([self.maxs, np.full((self.maxs.shape[0], more), -np.inf)], axis=1)


TUPLE = 0  # the "window length" of tuple windows (OVER LAST n EVENTS): changed by events entering or leaving
#: the horizon, which take_dirty([TUPLE]) gives


class RunningWindows:
    """Every window's aggregates at the store's boundary ``at``, and the keys touched since the last evaluation."""

    def __init__(self, n_attributes: int, horizon_ms: int, block_ms: int | None = None) -> None:
        """``block_ms``: the span of the MIN/MAX block summaries (:class:`BlockExtremes`; None: none, every
        recomputation scans its window's panes)."""
        self.n_attributes = n_attributes
        self.horizon_ms = horizon_ms
        self.keys = KeyIds()
        self.store = PaneStore(n_attributes)
        self.blocks = BlockExtremes(n_attributes, block_ms) if block_ms else None
        self.shifts = [0] * n_attributes  # each attribute's exact unit: 2**-shift
        self.windows: dict[int, Window] = {horizon_ms: Window(horizon_ms, n_attributes, 0, values=False)}
        self.at: int | None = None
        self._dirty: dict[int, list[np.ndarray]] = {horizon_ms: []}
        self._dirty_all: list[np.ndarray] = []  # touched for every window (entering, late, leaving the horizon)

    # -- keys ---------------------------------------------------------------------------------------

    def ids_of(self, keys: np.ndarray) -> np.ndarray:
        ids = self.keys.of(keys)
        for window in self.windows.values():
            window.grow(self.keys.capacity)
        return ids

    @property
    def known(self) -> np.ndarray:
        """Per key id: has a pane in the horizon."""
        return self.windows[self.horizon_ms].count > 0

    # -- windows in use -----------------------------------------------------------------------------

    def use(self, lengths: Iterable[int]) -> None:
        """Keep running aggregates for exactly these window lengths (and the horizon); new ones are built from
        the store."""
        lengths = set(lengths)
        wanted = lengths | {self.horizon_ms}
        for ms in [ms for ms in self.windows if ms not in wanted]:
            del self.windows[ms], self._dirty[ms]
        if self.horizon_ms in lengths and not self.windows[self.horizon_ms].values:
            del self.windows[self.horizon_ms]  # a condition's window is the horizon: it needs values too
        for ms in sorted(wanted - self.windows.keys()):
            window = self.windows[ms] = Window(ms, self.n_attributes, self.keys.capacity, values=ms in lengths)
            self._dirty.setdefault(ms, [])
            if self.at is not None:
                lo, hi = self.store.span(self.at - ms, self.at)
                self._enter(window, self.store.rows(lo, hi))

    def window(self, ms: int) -> Window:
        return self.windows[ms]

    def window_at(self, ms: int) -> tuple[Window, list[int]]:
        """Window ``ms``'s aggregates at ``at`` and the units of its sums (per attribute, ``2**-shift``): the
        running window when one is kept, else one summed from the store's panes of ``[at - ms, at)``, exact
        alike. Changes nothing: a preview asks for a window no subscription may use."""
        kept = self.windows.get(ms)
        if kept is not None and kept.values:
            return kept, self.shifts
        window, shifts = Window(ms, self.n_attributes, self.keys.capacity, values=True), list(self.shifts)
        if self.at is not None:
            self._enter(window, self.store.rows(*self.store.span(self.at - ms, self.at)), shifts)
        return window, shifts

    # -- updates ------------------------------------------------------------------------------------

    def _units(self, a: int, values: np.ndarray) -> np.ndarray:
        exact, need = units(values, self.shifts[a])
        if need > self.shifts[a]:
            scale = 1 << (need - self.shifts[a])
            for window in self.windows.values():
                if window.values:
                    window.sums[a] = window.sums[a] * scale
            self.shifts[a] = need
        return exact

    def _enter(self, window: Window, rows: Panes, shifts: list[int] | None = None,
               shared: dict[int, tuple[np.ndarray, int]] | None = None) -> None:
        """Add ``rows`` to ``window``: a running one (the sums' units are the shared ``self.shifts``), or an empty
        private one whose units are ``shifts``, set here (nothing else is rescaled). ``shared``: the rows' exact sums
        per attribute and their units, filled by the first running window that enters these rows and read by the
        others (the same panes enter every window longer than the move). Nothing rescales in between: a row leaving
        a window needs no finer units than it needed when it entered."""
        if not len(rows):
            return
        np.add.at(window.count, rows.ids, rows.counts)
        for a in range(len(window.sums)):
            if shifts is not None:
                exact, shifts[a] = units(rows.sums[a], shifts[a])
            elif shared is not None and a in shared:
                exact, shift = shared[a]
                assert shift == self.shifts[a], "units rescaled by leaving rows"
            else:
                exact = self._units(a, rows.sums[a])  # first: it may rescale window.sums[a]
                if shared is not None:
                    shared[a] = (exact, self.shifts[a])
            np.add.at(window.sums[a], rows.ids, exact)
            np.minimum.at(window.mins[a], rows.ids, rows.mins[a])
            np.maximum.at(window.maxs[a], rows.ids, rows.maxs[a])

    def _leave(self, window: Window, rows: Panes) -> np.ndarray:
        """Take ``rows`` out of ``window``; returns the ids whose MIN or MAX must be recomputed."""
        if not len(rows):
            return np.empty(0, dtype=np.int64)
        np.subtract.at(window.count, rows.ids, rows.counts)
        redo = []
        for a in range(len(window.sums)):
            exact = self._units(a, rows.sums[a])  # first: it may rescale window.sums[a]
            np.subtract.at(window.sums[a], rows.ids, exact)
            redo.append(rows.ids[(rows.mins[a] <= window.mins[a][rows.ids])
                                 | (rows.maxs[a] >= window.maxs[a][rows.ids])])
        return distinct_ids(redo, self.keys.capacity)

    def _recompute(self, window: Window, ids: np.ndarray, boundary: int) -> None:
        """MIN and MAX of ``ids`` over the store's panes of ``[boundary - T, boundary)``, vectorised: from the block
        summaries of the whole blocks inside it and the panes at its two ends, or from all its panes."""
        if not ids.size:
            return
        window.mins[:, ids], window.maxs[:, ids] = np.inf, -np.inf
        chosen = np.zeros(self.keys.capacity, dtype=bool)
        chosen[ids] = True
        low = boundary - window.ms
        spans = [(low, boundary)]
        if self.blocks is not None:
            first, last = self.blocks.inside(low, boundary)
            if first < last:
                spans = [(low, first), (last, boundary)]
                _extremes_into(window, chosen, self.blocks.store.panes, *self.blocks.store.span(first, last))
        for start, end in spans:
            _extremes_into(window, chosen, self.store.panes, *self.store.span(start, end))

    def advance(self, rows: Panes, boundary: int) -> None:
        """Add the panes that became complete (starting in ``[at, boundary)``) and move every window to
        ``boundary``."""
        self.store.add(rows)
        at, store = self.at, self.store
        horizon = self.windows[self.horizon_ms]
        if at is None or boundary - at >= self.horizon_ms:  # first move, or the whole horizon turns over
            entering = store.span(boundary - self.horizon_ms, boundary)
        else:
            entering = store.span(at, boundary)
        touched = [store.panes.ids[entering[0] : entering[1]]]
        shared: dict[int, tuple[np.ndarray, int]] = {}  # exact sums of the rows entering at ``entering`` (_enter)
        for window in self.windows.values():
            t = window.ms
            if at is None:
                enter, leave = store.span(boundary - t, boundary), (0, 0)
            else:
                enter = store.span(max(at, boundary - t), boundary)
                leave = store.span(at - t, min(at, boundary - t))
            left = store.rows(*leave)
            redo = self._leave(window, left)
            self._enter(window, store.rows(*enter), shared=shared if enter == entering else None)
            self._recompute(window, redo, boundary)
            if window is horizon:
                touched.append(left.ids[horizon.count[left.ids] == 0])  # no longer known: every group sees it
                self._dirty.setdefault(TUPLE, []).append(left.ids)  # a tuple window holds events of the horizon
            if window.values:
                self._dirty[t].append(left.ids)
        self._dirty_all += touched
        self.at = boundary
        store.expire(boundary - self.horizon_ms)
        if self.blocks is not None:
            self.blocks.advance(store, boundary, self.horizon_ms)

    def add_late(self, rows: Panes) -> None:
        """Panes older than ``at`` (late): into the store, and into every window that covers them now."""
        if not len(rows):
            return
        assert self.at is not None
        self.store.add(rows)
        if self.blocks is not None:
            self.blocks.add_late(rows)
        for window in self.windows.values():
            covered = (rows.starts >= self.at - window.ms) & (rows.starts < self.at)
            self._enter(window, rows.take(np.flatnonzero(covered)))
        self._dirty_all.append(rows.ids)

    def take_dirty(self, lengths: Iterable[int]) -> np.ndarray:
        """The keys whose window of any of ``lengths`` (or whose being known) may have changed since the last
        evaluation: a condition over several windows (a key against its own baseline) changes with any of them."""
        parts = [part for ms in lengths for part in self._dirty.get(ms, [])] + self._dirty_all
        return distinct_ids(parts, self.keys.capacity)

    def clear_dirty(self) -> np.ndarray:
        """Forget what was touched (after an evaluation); returns every key touched, for recycling."""
        parts = self._dirty_all + [p for ps in self._dirty.values() for p in ps]
        self._dirty_all = []
        self._dirty = {ms: [] for ms in self.windows}
        return distinct_ids(parts, self.keys.capacity)

    def reset_ids(self, ids: np.ndarray) -> None:
        """Clear the aggregates of released ids (their windows are empty already; this drops rounding nothing)."""
        for window in self.windows.values():
            window.count[ids] = 0
            for s in window.sums:
                s[ids] = 0
            window.mins[:, ids], window.maxs[:, ids] = np.inf, -np.inf

    # -- persistence ----------------------------------------------------------------------------------

    def to_parts(self) -> list[bytes]:
        panes = self.store.live
        meta = struct.pack(f"<qQ{self.n_attributes}Q", _BIG if self.at is None else self.at, len(panes),
                           *self.shifts)
        parts = [meta, self.keys.to_bytes()]
        parts += [panes.ids.astype(np.int64).tobytes(), panes.starts.astype(np.int64).tobytes(),
                  panes.counts.astype(np.int64).tobytes(), np.ascontiguousarray(panes.sums).tobytes(),
                  np.ascontiguousarray(panes.mins).tobytes(), np.ascontiguousarray(panes.maxs).tobytes()]
        return parts

    @classmethod
    def from_parts(cls, n_attributes: int, horizon_ms: int, parts: Sequence[bytes],
                   block_ms: int | None = None) -> RunningWindows:
        """The store and key table as saved; window aggregates (:meth:`use`) and block summaries are rebuilt from
        the store."""
        running = cls(n_attributes, horizon_ms, block_ms)
        at, n, *shifts = struct.unpack_from(f"<qQ{n_attributes}Q", parts[0])
        running.keys = KeyIds.from_bytes(parts[1])
        ids, starts, counts = (np.frombuffer(p, dtype=np.int64).copy() for p in parts[2:5])
        sums, mins, maxs = (np.frombuffer(p, dtype=np.float64).reshape(n_attributes, n).copy() for p in parts[5:8])
        running.store.add(Panes(ids, starts, counts, sums, mins, maxs))
        running.shifts = list(shifts)
        running.windows[horizon_ms].grow(running.keys.capacity)
        if at != _BIG:
            running.at = at
            lo, hi = running.store.span(at - horizon_ms, at)
            running._enter(running.windows[horizon_ms], running.store.rows(lo, hi))
            if running.blocks is not None:
                running.blocks.advance(running.store, at, horizon_ms)
        return running


def _extremes_into(window: Window, chosen: np.ndarray, rows: Panes, lo: int, hi: int) -> None:
    """Fold the MIN and MAX of rows ``[lo, hi)`` of the chosen keys into ``window`` (only the columns read: a
    long window holds many rows)."""
    if hi <= lo:
        return
    picked = lo + np.flatnonzero(chosen[rows.ids[lo:hi]])
    picked_ids = rows.ids[picked]
    for a in range(window.mins.shape[0]):
        np.minimum.at(window.mins[a], picked_ids, rows.mins[a, picked])
        np.maximum.at(window.maxs[a], picked_ids, rows.maxs[a, picked])


class BlockExtremes:
    """Each key's MIN and MAX over every complete block of panes (``[k * block_ms, (k + 1) * block_ms)``), so
    recomputing a window's MIN or MAX (its extreme left it) reads a row per key and block inside the window and
    the panes at its two ends, not every pane: a window of an hour of 1 s panes holds 3,600 rows a key, its
    blocks of 64 panes 56 (two-level panes, as B-INT's base intervals). A late pane in a summarised block adds a
    row of its own for that block (MIN and MAX do not mind a second row); blocks leave with the horizon."""

    def __init__(self, n_attributes: int, block_ms: int) -> None:
        self.block_ms = block_ms
        self.store = PaneStore(n_attributes)  # a row per (key, block), starts = the block's start
        self.done: int | None = None  # blocks ending at or before it are summarised

    def inside(self, low: int, high: int) -> tuple[int, int]:
        """The summarised whole blocks within ``[low, high)``, as a span ``[first, last)`` (empty if first >= last)."""
        if self.done is None:
            return 0, 0
        first = -(-low // self.block_ms) * self.block_ms
        return first, min(high // self.block_ms * self.block_ms, self.done)

    def advance(self, store: PaneStore, boundary: int, horizon_ms: int) -> None:
        """Summarise the blocks completed by ``boundary`` (those within the horizon) and forget those that left."""
        complete = boundary // self.block_ms * self.block_ms
        start = boundary - horizon_ms
        start = -(-start // self.block_ms) * self.block_ms  # a block begun before the horizon is never whole in it
        if self.done is not None:
            start = max(start, self.done)
        for block in range(start, complete, self.block_ms):
            self._summarise(store, block)
        self.done = complete if self.done is None else max(self.done, complete)
        self.store.expire(boundary - horizon_ms)

    def _summarise(self, store: PaneStore, block: int) -> None:
        rows = store.rows(*store.span(block, block + self.block_ms))
        if not len(rows):
            return
        ids, inverse = np.unique(rows.ids, return_inverse=True)
        n_attributes = rows.mins.shape[0]
        mins, maxs = np.full((n_attributes, ids.size), np.inf), np.full((n_attributes, ids.size), -np.inf)
        for a in range(n_attributes):
            np.minimum.at(mins[a], inverse, rows.mins[a])
            np.maximum.at(maxs[a], inverse, rows.maxs[a])
        zero = np.zeros(ids.size, dtype=np.int64)
        self.store.add(Panes(ids.astype(np.int64), np.full(ids.size, block, dtype=np.int64), zero,
                             np.zeros((n_attributes, ids.size)), mins, maxs))

    def add_late(self, rows: Panes) -> None:
        """Late panes in blocks already summarised: a row each, in its block."""
        if self.done is None or not len(rows):
            return
        late = np.flatnonzero(rows.starts < self.done)
        if late.size:
            rows = rows.take(late)
            self.store.add(Panes(rows.ids, rows.starts // self.block_ms * self.block_ms, rows.counts, rows.sums,
                                 rows.mins, rows.maxs))
