"""MAX and MIN collective index: ``{k | MAX(S_k[T, 0]) in (v1, v2)}`` (MIN by negation).

Key k's window maximum exceeds ``v`` iff k has an element ``> v`` newer than
``t0 = now - T``. Only elements no newer element dominates can ever be a window's
maximum, so each key keeps its *dominance staircase* (values strictly decreasing
from oldest to newest). All staircase points of all keys sit in one array in time
order under a max segment tree: the keys with a point newer than ``t0`` and above
``v`` are reported by descending only into subtrees whose maximum exceeds ``v`` —
O((1 + output) log N), sublinear in the number of keys. A point leaves the tree
when a newer, at-least-as-large element of its key arrives. Below-bound queries
(``MAX < v``) are the keys with anything in the window minus those reported above
``v``. Every answer is checked against the key's exact window maximum, read off its
staircase by binary search.

Key churn. Points are appended in time order, so the expired points are a prefix of
the array: :meth:`CollectiveExtreme.expire` walks only the points added since the last
expiry that it now passes, trims their keys' staircases and forgets a key left with no
point (no element in the horizon: a key's newest element is always a point), recycling
its id. The array is compacted to the live points when full, so memory and expiry cost
in proportion to the keys (and points) held, not to every key ever seen.
"""

from __future__ import annotations

import bisect
import math
import struct
from dataclasses import dataclass, field

import numpy as np

from evaluator.spec import Condition
from evaluator.ssf.base import KeyTable, SubstreamIndex
from evaluator.ssf.encoding import StampIndex

NEG = -math.inf
_NO_STAMP = np.iinfo(np.int64).min


@dataclass
class _Staircase:
    id: int
    points: list[int] = field(default_factory=list)  # point indices, oldest first, values decreasing
    ts: list[int] = field(default_factory=list)


class CollectiveExtreme(SubstreamIndex):
    def __init__(self, agg: str = "MAX", capacity: int = 1024, bucket_ms: int = 1_000) -> None:
        if agg not in ("MAX", "MIN"):
            raise ValueError("agg must be MAX or MIN")
        self.agg = agg
        self.sign = 1.0 if agg == "MAX" else -1.0
        self.keys: KeyTable[_Staircase] = KeyTable()
        self.stairs = self.keys.by_name  # the keys held: each has a point in the retained horizon
        self.names = self.keys.names
        self.last = StampIndex(bucket_ms)
        self._reset(capacity)

    def _reset(self, capacity: int) -> None:
        self.capacity = 1 << max(capacity - 1, 1).bit_length()
        self.tree = [NEG] * (2 * self.capacity)
        self.point_ts: list[int] = []
        self.point_key: list[int] = []
        self.point_x: list[float] = []
        self.expired = 0  # points before this index were passed by expire()

    def held(self) -> list[str]:
        """The keys with an element in the retained horizon (every key the index holds)."""
        return list(self.stairs)

    # -- the segment tree over points ----------------------------------------------------

    def _set(self, i: int, x: float) -> None:
        tree = self.tree
        j = i + self.capacity
        tree[j] = x
        j >>= 1
        while j:
            best = tree[2 * j] if tree[2 * j] >= tree[2 * j + 1] else tree[2 * j + 1]
            if tree[j] == best:
                break
            tree[j] = best
            j >>= 1

    def _report(self, first: int, v: float, inclusive: bool) -> set[int]:
        """Key ids of live points at index >= first whose value is > v (>= v if inclusive)."""
        found: set[int] = set()
        tree, cap, n = self.tree, self.capacity, len(self.point_ts)
        stack = [(1, 0, cap)]
        while stack:
            node, lo, hi = stack.pop()
            if hi <= first or lo >= n:
                continue
            best = tree[node]
            if best == NEG or best < v or (best == v and not inclusive):
                continue
            if hi - lo == 1:
                found.add(self.point_key[lo])
                continue
            mid = (lo + hi) // 2
            stack.append((2 * node + 1, mid, hi))
            stack.append((2 * node, lo, mid))
        return found

    def _compact(self) -> None:
        """Rebuild the point array from the live staircase points (dead points are dropped)."""
        live = sorted(p for s in self.stairs.values() for p in s.points)
        remap = {old: new for new, old in enumerate(live)}
        ts, keys, xs = self.point_ts, self.point_key, self.point_x
        self._reset(max(2 * len(live), 1024))
        for old in live:
            self._append_point(ts[old], keys[old], xs[old])
        for stair in self.stairs.values():
            stair.points = [remap[p] for p in stair.points]

    def _append_point(self, ts: int, key_id: int, x: float) -> int:
        i = len(self.point_ts)
        self.point_ts.append(ts)
        self.point_key.append(key_id)
        self.point_x.append(x)
        self._set(i, x)
        return i

    # -- updates ---------------------------------------------------------------------------

    def add(self, key: str, ts: int, value: float) -> None:
        """Append one element; timestamps must not decrease across the whole index."""
        if math.isnan(value):
            raise ValueError("NaN has no order")
        if self.point_ts and ts < self.point_ts[-1]:
            raise ValueError(f"timestamp {ts} is older than {self.point_ts[-1]}")
        stair = self.keys.get(key, _Staircase)
        x = self.sign * value
        while stair.points and self.point_x[stair.points[-1]] <= x:  # dominated: can never be a maximum again
            self._set(stair.points.pop(), NEG)
            stair.ts.pop()
        if len(self.point_ts) == self.capacity:
            self._compact()
        stair.points.append(self._append_point(ts, stair.id, x))
        stair.ts.append(ts)
        self.last.set(stair.id, ts)

    def add_late(self, keys: list[str], ts: list[int], values: list[float]) -> None:
        """Insert elements that may be older than the newest point (late events).

        Each touched key's staircase is recomputed with the new elements, then the
        point array is rebuilt in time order from all live staircase points:
        O(live points), paid only when late data arrives.
        """
        if not keys:
            return
        if all(t >= (self.point_ts[-1] if self.point_ts else t) for t in ts) and list(ts) == sorted(ts):
            for key, t, v in zip(keys, ts, values, strict=True):
                self.add(key, t, v)
            return
        touched: dict[str, list[tuple[int, float]]] = {}
        for key, t, v in zip(keys, ts, values, strict=True):
            if math.isnan(v):
                raise ValueError("NaN has no order")
            stair = self.keys.get(key, _Staircase)
            points = touched.get(key)
            if points is None:
                points = touched[key] = [(self.point_ts[p], self.point_x[p]) for p in stair.points]
            points.append((t, self.sign * v))
            self.last.set(stair.id, max(self.last.stamp.get(stair.id, t), t))
        live: list[tuple[int, int, float]] = []
        for key, stair in self.stairs.items():
            points = touched.get(key)
            if points is None:
                live.extend((self.point_ts[p], stair.id, self.point_x[p]) for p in stair.points)
                continue
            points.sort()
            kept, best = [], NEG
            for t, x in reversed(points):  # newest first: keep what no newer point dominates
                if x > best:
                    kept.append((t, x))
                    best = x
            live.extend((t, stair.id, x) for t, x in reversed(kept))
        live.sort(key=lambda point: point[0])
        self._reset(max(2 * len(live), 1024))
        for stair in self.stairs.values():
            stair.points, stair.ts = [], []
        for t, key_id, x in live:
            stair = self.stairs[self.names[key_id]]
            stair.points.append(self._append_point(t, key_id, x))
            stair.ts.append(t)

    def expire(self, before_ts: int) -> None:
        """Drop staircase points with ``ts <= before_ts``, and the keys left without one.

        Visits the keys of the points passed since the last call only: O(those points), as
        points are in time order (a recycled id may bring its new key along: harmless).
        """
        end = bisect.bisect_right(self.point_ts, before_ts, lo=self.expired)
        by_id, live = self.keys.by_id, self.keys.live
        for key_id in {self.point_key[p] for p in range(self.expired, end)} & live:
            stair = by_id[key_id]
            i = bisect.bisect_right(stair.ts, before_ts)
            for p in stair.points[:i]:
                self._set(p, NEG)
            del stair.points[:i], stair.ts[:i]
            if not stair.points:
                self.last.discard(key_id)
                self.keys.drop(stair)
        self.expired = max(self.expired, end)

    # -- lookups ----------------------------------------------------------------------------

    def value(self, key: str, duration: int, now: int) -> float | None:
        """Exact MAX (MIN) of key's window, or None when the window is empty (or the key not held)."""
        stair = self.stairs.get(key)
        if stair is None:
            return None
        i = bisect.bisect_right(stair.ts, now - duration)
        return self.sign * self.point_x[stair.points[i]] if i < len(stair.points) else None

    def query(self, condition: Condition, now: int) -> dict[str, float]:
        t0 = now - condition.window_ms
        # bounds on the signed value x (MIN's bounds flip)
        if self.sign > 0:
            low, low_inc, high, high_inc = condition.low, condition.low_inclusive, condition.high, condition.high_inclusive
        else:
            low = None if condition.high is None else -condition.high
            high = None if condition.low is None else -condition.low
            low_inc, high_inc = condition.high_inclusive, condition.low_inclusive
        first = bisect.bisect_right(self.point_ts, t0)
        if low is not None:
            ids = self._report(first, low, low_inc)
        else:
            ids = self.last.newer_than(t0)
            if high is not None:
                ids -= self._report(first, high, not high_inc)
        found = {}
        for i in ids:
            key = self.names[i]
            value = self.value(key, condition.window_ms, now)
            if value is not None and condition.holds(value):
                found[key] = value
        return found

    # -- state ---------------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        """Only the staircases (time, value per point, per key); the tree is rebuilt on load.

        Only the keys held are written, renumbered 0, 1, ... in id order: forgotten keys leave
        no trace, and the layout is the one written before keys were forgotten.
        """
        held = self.keys.ordered()
        number = {stair.id: n for n, stair in enumerate(held)}
        order = sorted((p, number[stair.id]) for stair in held for p in stair.points)
        header = struct.pack("<4sqi", self.agg.encode(), self.last.bucket_ms, len(held))
        names = b"".join(struct.pack("<H", len(n.encode())) + n.encode() for n in (self.names[s.id] for s in held))
        last = np.array([self.last.stamp.get(s.id, _NO_STAMP) for s in held], dtype=np.int64)
        points = np.array(
            [(self.point_ts[p], key_id, self.sign * self.point_x[p]) for p, key_id in order],
            dtype=[("ts", "<i8"), ("key", "<i4"), ("value", "<f8")],
        )
        return header + names + last.tobytes() + struct.pack("<q", len(points)) + points.tobytes()

    @classmethod
    def from_bytes(cls, blob: bytes) -> CollectiveExtreme:
        agg, bucket_ms, count = struct.unpack_from("<4sqi", blob)
        offset = struct.calcsize("<4sqi")
        index = cls(agg.rstrip(b"\0").decode(), bucket_ms=bucket_ms)
        for _ in range(count):
            (length,) = struct.unpack_from("<H", blob, offset)
            name = blob[offset + 2 : offset + 2 + length].decode()
            offset += 2 + length
            index.keys.get(name, _Staircase)
        last = np.frombuffer(blob, dtype=np.int64, count=count, offset=offset)
        offset += 8 * count
        (n_points,) = struct.unpack_from("<q", blob, offset)
        points = np.frombuffer(blob, dtype=[("ts", "<i8"), ("key", "<i4"), ("value", "<f8")], count=n_points,
                               offset=offset + 8)
        index._reset(max(2 * n_points, 1024))
        for ts, key_id, value in points.tolist():
            stair = index.keys.by_id[key_id]
            stair.points.append(index._append_point(ts, key_id, index.sign * value))
            stair.ts.append(ts)
        for key_id, ts in enumerate(last.tolist()):
            if ts != _NO_STAMP:
                index.last.set(key_id, ts)
        for stair in [s for s in index.stairs.values() if not s.points]:  # expired (bytes from before forgetting)
            index.last.discard(stair.id)
            index.keys.drop(stair)
        return index

    def candidates(self, condition: Condition, now: int) -> frozenset[str]:
        """The reported set before verification (exact for one-sided conditions)."""
        return frozenset(self.query(condition, now))
