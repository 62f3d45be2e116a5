"""CI-COUNT and CI-SUM: collective indexes for ``{k | SUM(S_k[T, 0]) in (v1, v2)}``.

Think of key k's substream *value-expanded*: an element of value ``a`` occupies ``a``
consecutive positions, so its SUM is the COUNT of the expanded stream (CI-COUNT is
CI-SUM with every value 1, or a pane's count). Let ``n`` be the expanded length and,
at level ``l`` with block size ``s = unit * 2^l``, ``m = floor(n / s) * s``.
``TSTAMP[k, l, j]`` is the timestamp of the element covering position ``m - j s``
(just after it). Then for the window start ``t0``:

- ``TSTAMP[k, l, j] > t0``  implies  ``SUM(k) >= j s``   (the whole tail after it is in the window);
- ``SUM(k) >= (j + 1) s``   implies  ``TSTAMP[k, l, j] > t0``.

So for a threshold ``c`` the keys whose ``TSTAMP[k, l, j]`` exceeds ``t0`` for the
``(l, j)`` with ``(j + 1) s <= c`` and the largest ``j s`` are a superset of the
answer whose members all have ``SUM >= j s``. With ``j = 1`` only (p = 1) that
bound is ``> c / 4``: ε = 3/4. Keeping p stamps per level, ``j`` in ``[p, 2p)``
(p-parameterised), raises it to ``(1 - ε) c`` with ``ε = 2 / (p + 2)`` (:attr:`epsilon`),
for every threshold of at least ``(p + 1) * unit``. One ordered index per ``(l, j)`` answers
``TSTAMP > t0`` in O(log K + output).

A stamp at level ``l`` moves only when ``m`` does, i.e. when the expanded stream
crosses a multiple of ``s``: an element of value ``a`` moves stamps on the O(log a)
levels with ``s <= a`` plus, amortised, O(1) more — the batched update.
Candidates are then verified against each key's exact window sum (binary search
over its prefix sums), so answers are exact.

Positions are exact: integers in the units of :class:`~evaluator.exactsum.FixedPoint`,
not float prefix sums, so a window's sum is its elements' exact sum rounded once
(relative error at most 2^-53, whatever the key's history), and the stamps' guarantees
hold for the true sums (float positions lose a small element after a large history:
its stamps would never move and its key could be missed).

Signs. A value-expanded stream has no element of negative length, so the stamps exist only while every
element held is non-negative. An attribute that may be negative (a declared stream's attribute with no
``min``) is still answered exactly: while the index holds a negative element (:attr:`CollectiveSum.negatives`)
it keeps no stamp, and a lookup verifies every key held against its exact window sum (what an aggregate with
no index costs); once the last negative element has expired, the stamps are rebuilt from the substreams,
O(elements held), and lookups use them again. Exact sums (:meth:`CollectiveSum.value`) hold for any sign.

Key churn. The index holds a key only while it has an element (of any value, zero
included) in the retained horizon: :meth:`CollectiveSum.expire` trims just the keys
whose oldest element it passes (found in a stamp index of oldest elements), and
forgets a key it empties — substream, stamps, name — recycling its id. Memory,
``expire`` and the below-bound lookups (``SUM < v``) therefore cost in proportion to
the keys with data in the horizon, not to every key ever seen; a key that comes back
starts a fresh substream.
"""

from __future__ import annotations

import bisect
import math
import struct
from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np

from evaluator.exactsum import FixedPoint
from evaluator.spec import Condition
from evaluator.ssf.base import KeyTable, SubstreamIndex
from evaluator.ssf.encoding import StampIndex


@dataclass
class _Substream:
    id: int
    ts: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)  # expanded position after each element, in exact units
    base: int = 0  # expanded position before the first retained element

    @property
    def total(self) -> int:
        return self.ends[-1] if self.ends else self.base

    def sum_after(self, t0: int) -> int:
        """Exact SUM of the elements with ``ts > t0``, in units."""
        i = bisect.bisect_right(self.ts, t0)
        return self.total - (self.ends[i - 1] if i else self.base)

    def stamp_at(self, position: int) -> int | None:
        """Timestamp of the element covering the expanded position just after ``position``."""
        if position < self.base:
            return None  # expired
        i = bisect.bisect_right(self.ends, position)
        return self.ts[i] if i < len(self.ts) else None


def _negatives(base: int, ends: list[int]) -> int:
    """How many of the elements ending at ``ends`` (the first starting at ``base``) are negative."""
    return sum(b < a for a, b in pairwise([base, *ends]))


@dataclass(frozen=True)
class Candidates:
    """A superset of an SSF answer and what every member is guaranteed to satisfy."""

    keys: frozenset[str]
    guaranteed_at_least: float | None  # every candidate's SUM is at least this (None: no bound)
    exact: bool  # True when the candidate set is already the exact answer of the low bound


class CollectiveSum(SubstreamIndex):
    """CI-SUM (CI-COUNT when each value is a count): stamped lookups over non-negative values, exact
    verification of every key held while a negative value is held (see the module doc)."""

    def __init__(self, p: int = 1, unit: float = 1.0, bucket_ms: int = 1_000) -> None:
        if p < 1:
            raise ValueError("p must be at least 1")
        if unit <= 0:
            raise ValueError("unit must be positive")
        self.p = p
        self.unit = unit
        self.fixed = FixedPoint()  # positions are exact integers in its units
        self.unit_units, _ = self.fixed.units(unit)
        self.bucket_ms = bucket_ms
        self.js: tuple[int, ...] = tuple(range(p, 2 * p))  # p stamps per level; j = 2p is j = p one level up
        self.indexes: dict[tuple[int, int], StampIndex] = {}
        self.last = StampIndex(bucket_ms)  # newest element of positive value per key: exact for SUM > 0
        self.first = StampIndex(bucket_ms)  # oldest retained element per key: what expiry must trim
        self.keys: KeyTable[_Substream] = KeyTable()
        self.substreams = self.keys.by_name  # the keys held: each has an element in the retained horizon
        self.by_id = self.keys.by_id
        self.names = self.keys.names
        self.latest_ts: int | None = None
        self.negatives = 0  # elements held with a negative value: while any, no stamps (lookups verify every key)

    @property
    def epsilon(self) -> float:
        """Every candidate of a threshold ``c >= (p + 1) unit`` has ``SUM >= (1 - ε) c``."""
        return 0.75 if self.p == 1 else 2 / (self.p + 2)

    # -- updates ----------------------------------------------------------------------

    def _substream(self, key: str) -> _Substream:
        return self.keys.get(key, _Substream)

    def held(self) -> list[str]:
        """The keys with an element in the retained horizon (every key the index holds)."""
        return list(self.substreams)

    def _units(self, value: float) -> int:
        """``value`` in exact units, refining every stored position first if it needs a finer unit."""
        if not math.isfinite(value):
            raise ValueError(f"CI-SUM needs finite values, got {value}")
        units, grow = self.fixed.units(value)
        if grow:
            self.unit_units <<= grow
            for sub in self.substreams.values():
                sub.base <<= grow
                sub.ends = [e << grow for e in sub.ends]
        return units

    def add(self, key: str, ts: int, value: float) -> None:
        """Append one element (or a pane's count/sum) to key's substream; ts must not decrease per key."""
        units = self._units(value)
        sub = self._substream(key)
        if sub.ts and ts < sub.ts[-1]:
            raise ValueError(f"{key}: timestamp {ts} is older than {sub.ts[-1]}")
        self.latest_ts = ts if self.latest_ts is None else max(self.latest_ts, ts)
        if not sub.ts:
            self.first.set(sub.id, ts)
        old = sub.total
        new = old + units
        sub.ts.append(ts)  # a zero element too: it keeps its key held (SUM < v sees it), moving no stamp
        sub.ends.append(new)
        if units < 0:
            self._negative()
        if units <= 0 or self.negatives:
            return
        self.last.set(sub.id, ts)
        level, size = 0, self.unit_units
        while size <= new:
            m_new = new // size * size
            if m_new == old // size * size:
                break  # no multiple of this block size crossed, so none of any larger one either
            for j in self.js:
                q = m_new - j * size
                index = self.indexes.get((level, j))
                if index is None:
                    index = self.indexes[(level, j)] = StampIndex(self.bucket_ms)
                stamp = None if q < 0 else (ts if q >= old else sub.stamp_at(q))
                if stamp is None:
                    index.discard(sub.id)
                else:
                    index.set(sub.id, stamp)
            level += 1
            size <<= 1

    def add_late(self, key: str, ts: int, value: float) -> None:
        """Insert an element older than key's newest (a late event) and re-derive the key's stamps.

        Stamps are a function of the substream alone, so the result is what adding the
        elements in time order would have built: O(elements of the key + levels).
        """
        sub = self.substreams.get(key)
        if sub is None or not sub.ts or ts >= sub.ts[-1]:
            self.add(key, ts, value)
            return
        units = self._units(value)
        i = bisect.bisect_right(sub.ts, ts)
        sub.ts.insert(i, ts)
        sub.ends.insert(i, (sub.ends[i - 1] if i else sub.base) + units)
        if not i:
            self.first.set(sub.id, ts)
        if not units:
            return
        for n in range(i + 1, len(sub.ends)):
            sub.ends[n] += units
        if units < 0:
            self._negative()
        if self.negatives:
            return
        self.last.set(sub.id, max(self.last.stamp.get(sub.id, ts), ts))  # the key's newest zero may be newer
        self._restamp(sub)

    def _negative(self) -> None:
        """A negative element joined: the first one drops every stamp (they need non-negative elements)."""
        self.negatives += 1
        if self.negatives == 1:
            self.indexes, self.last = {}, StampIndex(self.bucket_ms)

    def _stamp_all(self) -> None:
        """Every key's stamps and newest positive element, from its substream (every element non-negative)."""
        for sub in self.substreams.values():
            sub.ends = [e - sub.base for e in sub.ends]  # positions from 0 again: stamps start at position 0
            sub.base = 0
            starts = [0, *sub.ends[:-1]]
            newest = next((sub.ts[n] for n in reversed(range(len(sub.ts))) if sub.ends[n] > starts[n]), None)
            if newest is not None:
                self.last.set(sub.id, newest)
            self._restamp(sub)

    def _restamp(self, sub: _Substream) -> None:
        total = sub.total
        level, size = 0, self.unit_units
        while size <= total or any(lv >= level for lv, _ in self.indexes):
            m = total // size * size
            for j in self.js:
                q = m - j * size
                stamp = None if q < 0 else sub.stamp_at(q)
                index = self.indexes.get((level, j))
                if stamp is None:
                    if index is not None:
                        index.discard(sub.id)
                    continue
                if index is None:
                    index = self.indexes[(level, j)] = StampIndex(self.bucket_ms)
                index.set(sub.id, stamp)
            level += 1
            size <<= 1

    def expire(self, before_ts: int) -> None:
        """Forget elements with ``ts <= before_ts`` (no window will reach them again), and the keys left empty.

        Visits only the keys holding such an element: O(log B + those keys' expired elements), plus a rebuild of
        the stamps when the last negative element held leaves (see the module doc).
        """
        by_id, signed = self.by_id, self.negatives > 0
        for i in self.first.at_most(before_ts):
            sub = by_id[i]
            cut = bisect.bisect_right(sub.ts, before_ts)
            if signed:
                self.negatives -= _negatives(sub.base, sub.ends[:cut])
            if cut == len(sub.ts):
                self._forget(sub)
                continue
            sub.base = sub.ends[cut - 1]
            del sub.ts[:cut], sub.ends[:cut]
            self.first.set(i, sub.ts[0])
        if signed and not self.negatives:
            self._stamp_all()

    def _forget(self, sub: _Substream) -> None:
        """Drop a key with no element left: its stamps, its id and name.

        A stamp ``(l, j)`` exists only if ``j s <= m <= total``: only those indexes are visited.
        """
        key_id, indexes = sub.id, self.indexes
        self.first.discard(key_id)
        self.last.discard(key_id)
        level, size, total = 0, self.unit_units, sub.total
        while self.p * size <= total:
            for j in self.js:
                if j * size > total:
                    break
                index = indexes.get((level, j))
                if index is not None:
                    index.discard(key_id)
            level += 1
            size <<= 1
        self.keys.drop(sub)

    # -- lookups ----------------------------------------------------------------------

    def value(self, key: str, duration: int, now: int) -> float:
        """Exact SUM of key's window; 0 for a key not held (nothing in the horizon)."""
        sub = self.substreams.get(key)
        return 0.0 if sub is None else self.fixed.to_float(sub.sum_after(now - duration))

    def _best_lower(self, c: float) -> tuple[int, int, float] | None:
        """``(level, j, j*s)`` with ``(j + 1) s <= c`` and the largest ``j s``."""
        best = None
        for j in self.js:
            ratio = c / ((j + 1) * self.unit)
            if ratio < 1:
                continue
            level = math.floor(math.log2(ratio))
            while self.unit * 2 ** (level + 1) * (j + 1) <= c:  # guard against log2 rounding
                level += 1
            while level > 0 and self.unit * 2**level * (j + 1) > c:
                level -= 1
            bound = j * self.unit * 2**level
            if best is None or bound > best[2]:
                best = (level, j, bound)
        return best

    def _smallest_guarantee(self, c: float, strict: bool) -> tuple[int, int] | None:
        """``(level, j)`` whose stamp guarantees ``SUM >= j s`` with ``j s >= c`` (``> c`` if strict), smallest."""
        best = None
        for (level, j), _index in self.indexes.items():
            bound = j * self.unit * 2**level
            if (bound > c if strict else bound >= c) and (best is None or bound < best[0]):
                best = (bound, (level, j))
        return None if best is None else best[1]

    def _ids(self, index: StampIndex | None, t0: int) -> set[int]:
        return index.newer_than(t0) if index is not None else set()

    def _candidate_ids(self, condition: Condition, t0: int) -> tuple[set[int], set[int], float | None, bool]:
        """``(ids to verify, ids matching with SUM exactly 0, guarantee, exact)``.

        While a negative element is held, every key held is a candidate. Otherwise, when the low
        bound admits 0 (``SUM < v`` alone), every key held is a candidate, but
        those without a positive element in the window (no ``last`` stamp after ``t0``) have
        SUM exactly 0: one test decides them all, and only keys with a positive element in the
        window are left to verify. The set work is O(keys held) at C speed; nothing visits a
        key the index no longer holds.
        """
        zero: set[int] = set()
        if self.negatives:  # no stamps: every key held is verified
            return set(self.keys.live), zero, None, False
        low = condition.low
        if low is not None and low > 0:
            best = self._best_lower(low)
            if best is None:  # below the finest block: every key with anything in the window
                ids, bound, exact = self._ids(self.last, t0), None, False
            else:
                ids, bound, exact = self._ids(self.indexes.get(best[:2]), t0), best[2], False
        elif low is not None and low == 0 and not condition.low_inclusive:
            ids, bound, exact = self._ids(self.last, t0), None, True  # SUM > 0 exactly
        else:
            ids, bound, exact = self._ids(self.last, t0), None, True
            if condition.holds(0.0):
                zero = self.keys.live - ids
        if condition.high is not None and (low is None or low <= 0):
            # SUM below a bound: drop the keys a stamp proves are at or above it
            guard = self._smallest_guarantee(condition.high, strict=condition.high_inclusive)
            if guard is not None:
                ids -= self._ids(self.indexes.get(guard), t0)
            exact = False
        return ids, zero, bound, exact

    def candidates(self, condition: Condition, now: int) -> Candidates:
        """A superset of ``{k | SUM_k(now - T, now] satisfies condition}`` and its guarantee."""
        ids, zero, bound, exact = self._candidate_ids(condition, now - condition.window_ms)
        return Candidates(frozenset(self.names[i] for i in ids | zero), bound, exact)

    def query(self, condition: Condition, now: int) -> dict[str, float]:
        """The exact answer: candidates, each verified against its exact window sum.

        O(log B + buckets spanned + candidates): a lower bound's candidates are the keys its
        stamps report; below-bound-only conditions add the keys held with no positive element
        in the window (see :meth:`_candidate_ids`), never a key that has left the horizon.
        """
        t0 = now - condition.window_ms
        ids, zero, _bound, _exact = self._candidate_ids(condition, t0)
        by_id, names, holds, to_float = self.by_id, self.names, condition.holds, self.fixed.to_float
        found = dict.fromkeys((names[i] for i in zero), 0.0)
        for i in ids:
            value = to_float(by_id[i].sum_after(t0))
            if holds(value):
                found[names[i]] = value
        return found

    def matching_keys(self, condition: Condition, now: int) -> set[str]:
        """The exact answer as a key set, verifying only what no stamp already proves.

        For a lower bound ``c`` alone, the keys stamped at the smallest ``(l, j)`` with
        ``j s >= c`` (``> c`` when strict) certainly match; only the other candidates,
        the ε-band, are checked against their exact sums. Cost as :meth:`query`.
        """
        t0 = now - condition.window_ms
        ids, zero, _bound, _exact = self._candidate_ids(condition, t0)
        sure: set[int] = set()
        if condition.high is None and condition.low is not None and condition.low > 0:
            guard = self._smallest_guarantee(condition.low, strict=not condition.low_inclusive)
            if guard is not None:
                sure = self._ids(self.indexes.get(guard), t0)
        by_id, holds, to_float = self.by_id, condition.holds, self.fixed.to_float
        matched = sure | zero | {i for i in ids - sure if holds(to_float(by_id[i].sum_after(t0)))}
        names = self.names
        return {names[i] for i in matched}

    # -- state ---------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        """Per-key element arrays only; the stamp indexes are rebuilt from them.

        Each element's value is one float's units (a difference of exact positions), so it
        is stored exactly; the base only aligns the stamps' blocks, any base will do. Only the
        keys held are written, in id order (the reader numbers them 0, 1, ...): forgotten keys
        leave no trace, and the layout is the one written before keys were forgotten.
        """
        held = self.keys.ordered()
        parts = [struct.pack("<Idqi", self.p, self.unit, self.bucket_ms, len(held))]
        to_float = self.fixed.to_float
        for sub in held:
            encoded = self.names[sub.id].encode()
            base = to_float(sub.base)
            parts.append(struct.pack("<HId", len(encoded), len(sub.ts), base if math.isfinite(base) else 0.0) + encoded)
            parts.append(np.asarray(sub.ts, dtype=np.int64).tobytes())
            values = [to_float(b - a) for a, b in pairwise([sub.base, *sub.ends])]
            parts.append(np.asarray(values, dtype=np.float64).tobytes())
        return b"".join(parts)

    @classmethod
    def from_bytes(cls, blob: bytes) -> CollectiveSum:
        p, unit, bucket_ms, count = struct.unpack_from("<Idqi", blob)
        offset = struct.calcsize("<Idqi")
        index = cls(p, unit, bucket_ms)
        for _ in range(count):
            length, n, base = struct.unpack_from("<HId", blob, offset)
            offset += struct.calcsize("<HId")
            name = blob[offset : offset + length].decode()
            offset += length
            ts = np.frombuffer(blob, dtype=np.int64, count=n, offset=offset)
            offset += 8 * n
            values = np.frombuffer(blob, dtype=np.float64, count=n, offset=offset)
            offset += 8 * n
            if not n:
                continue  # a key whose elements all expired (written before keys were forgotten): not held
            sub = index._substream(name)
            sub.base = index._units(base)  # replaying from the base reproduces the expanded positions, every stamp
            for t, v in zip(ts.tolist(), values.tolist(), strict=True):
                index.add(name, t, v)
        return index
