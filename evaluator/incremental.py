"""Output-sensitive evaluation: a group's values per key id in an array, and which members flip when one changes.

A group (subscriptions asking the same value, evaluator/shard.py) keeps ``values[key id]``
(NaN: no value), updated at each evaluated boundary for the keys whose windows changed only
(:mod:`evaluator.panestore` says which), by array expressions over the running window
aggregates (:meth:`~evaluator.aggregates.Aggregation.column`); QUANTILE and LAST are computed
per changed key from its retained events, since no summary answers them.

Its members for every key (:class:`Members`) are arrays of their accepted ranges (a union
is a row of ranges), and their finite range endpoints sorted once. For a key known before
and after whose value moved from ``o`` to ``n`` (both numbers), the members that flip are
exactly those whose ranges hold one and not the other, so each has an endpoint between
``o`` and ``n``: the candidates are a searchsorted slice of the sorted endpoints per changed
key, verified exactly (:meth:`Members.flips`). A key becoming known or unknown, or its value
appearing or vanishing, has one side with no watched value: the members accepting the other
side flip, found for all such keys against all members at once (:meth:`Members.accepts`). A
copy of the shard brought up to date by replay, whose stored values may be older than its
firing sets, decides every change key by key against the firing sets (:meth:`Members.holding`).
Key-restricted members are kept apart, per key they name, and cost only when one of those keys
changes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from evaluator.admission import Admission
from evaluator.aggregates import AGGREGATES, Columns
from evaluator.comparators import Range
from evaluator.expr import ARITHMETIC, BinOp, Expr, Num, Term, combine
from evaluator.spec import Condition, SubscriptionSpec


def _combine(op: str, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """:func:`evaluator.expr.combine` over arrays: NaN where it gives None."""
    with np.errstate(all="ignore"):
        value = ARITHMETIC[op](left, np.where(right == 0, np.nan, right) if op == "/" else right)
    return np.where(np.isfinite(value), value, np.nan)


def _column(columns: Columns, expr: Expr, window_ms: int, ids: np.ndarray) -> np.ndarray:
    if isinstance(expr, Term):  # over its own window, if it has one (a key against its own baseline)
        return AGGREGATES[expr.aggregate].column(columns, expr, expr.over(window_ms), ids)
    if isinstance(expr, Num):
        return np.full(ids.size, expr.value)
    assert isinstance(expr, BinOp)
    return _combine(expr.op, _column(columns, expr.left, window_ms, ids), _column(columns, expr.right, window_ms, ids))


def values_of(columns: Columns, condition: Condition, ids: np.ndarray) -> np.ndarray:
    """What ``condition`` compares for the keys ``ids`` (NaN: no value), as :meth:`ShardEvaluator.value` does."""
    if condition.events is not None:  # a tuple window: per changed key, from its newest events
        return columns.tuples(condition, ids)
    expr = condition.computes
    if isinstance(expr, Term):
        return AGGREGATES[expr.aggregate].column(columns, expr, condition.window_ms, ids)
    value = _column(columns, expr, condition.window_ms, ids)
    if condition.percent_of is None:
        return value
    last = _column(columns, Term("LAST", condition.percent_of), condition.window_ms, ids)
    with np.errstate(all="ignore"):
        hundred = 100.0 * value
    return _combine("/", np.where(np.isfinite(hundred), hundred, np.nan), last)


def _empty(expr: Expr) -> float | None:
    if isinstance(expr, Term):
        return AGGREGATES[expr.aggregate].empty
    if isinstance(expr, Num):
        return expr.value
    assert isinstance(expr, BinOp)
    left, right = _empty(expr.left), _empty(expr.right)
    return None if left is None or right is None else combine(expr.op, left, right)


def empty_value(condition: Condition) -> float:
    """The value of a key with no pane in the window (NaN: none), the same for every such key."""
    value = _empty(condition.computes)
    if value is not None and condition.percent_of is not None:
        value = None  # LAST of an empty window has no value
    return np.nan if value is None else value


class Members:
    """A group's members for every key: their accepted ranges as arrays, and the sorted range endpoints."""

    def __init__(self, specs: list[SubscriptionSpec]) -> None:
        self.specs = sorted(specs, key=lambda s: s.id)
        self.row = {s.id: i for i, s in enumerate(self.specs)}
        self.sids = np.array([s.id for s in self.specs], dtype=np.int64)
        ranges = [s.condition.accepted for s in self.specs]
        width = max((len(r) for r in ranges), default=1)
        shape = (len(ranges), width)
        self.low, self.high = np.full(shape, np.inf), np.full(shape, -np.inf)
        self.low_inclusive, self.high_inclusive = np.zeros(shape, dtype=bool), np.zeros(shape, dtype=bool)
        ends, owners = [], []
        for m, rs in enumerate(ranges):
            for j, r in enumerate(rs):
                self._set(m, j, r)
                for end in (r.low, r.high):
                    if end is not None:
                        ends.append(end)
                        owners.append(m)
        order = np.argsort(np.array(ends, dtype=np.float64), kind="stable")
        self.ends = np.array(ends, dtype=np.float64)[order]
        self.owners = np.array(owners, dtype=np.int64)[order]

    def _set(self, m: int, j: int, r: Range) -> None:
        self.low[m, j] = -np.inf if r.low is None else r.low
        self.low_inclusive[m, j] = r.low is None or r.low_inclusive
        self.high[m, j] = np.inf if r.high is None else r.high
        self.high_inclusive[m, j] = r.high is None or r.high_inclusive

    def __len__(self) -> int:
        return len(self.specs)

    def holds(self, members: np.ndarray | int, values: np.ndarray) -> np.ndarray:
        """``members[i]`` accepts ``values[i]``, pairwise, or one member (an int) each value: its ranges broadcast,
        not gathered once per value (NaN is accepted by none)."""
        v = values[:, None]
        low, high = self.low[members], self.high[members]
        ok = (((v > low) | ((v == low) & self.low_inclusive[members]))
              & ((v < high) | ((v == high) & self.high_inclusive[members])))
        return ok.any(axis=1)

    def accepting(self, members: np.ndarray, values: np.ndarray, where: np.ndarray) -> list[np.ndarray]:
        """Per member of ``members``: the indices where ``where`` is set whose value it accepts (``holds``), in no
        particular order. Found by binary search in those values sorted once, so a member costs a search per range
        and its matches, not a test of every value: a first evaluation tests thousands of members at once."""
        at = np.flatnonzero(where & ~np.isnan(values))
        by_value = at[np.argsort(values[at], kind="stable")]
        ordered = values[by_value]
        low, high = self.low[members], self.high[members]
        first = np.where(self.low_inclusive[members], np.searchsorted(ordered, low, "left"),
                         np.searchsorted(ordered, low, "right"))
        last = np.where(self.high_inclusive[members], np.searchsorted(ordered, high, "right"),
                        np.searchsorted(ordered, high, "left"))
        nothing = by_value[:0]
        found = []
        for starts, ends in zip(first.tolist(), last.tolist(), strict=True):
            spans = [by_value[a:b] for a, b in zip(starts, ends, strict=True) if b > a]
            found.append(nothing if not spans else spans[0] if len(spans) == 1 else np.unique(np.concatenate(spans)))
        return found

    def holding(self, value: float) -> np.ndarray:
        """Per member: accepts ``value``."""
        return self.holds(np.arange(len(self)), np.full(len(self), value))

    #: :meth:`accepts` builds its (values x members x ranges) comparisons this many cells at a time at most.
    ACCEPTS_CELLS = 1 << 20

    def accepts(self, values: np.ndarray) -> np.ndarray:
        """``[i, m]``: member ``m`` accepts ``values[i]`` (NaN is accepted by none), every value against every member
        at once, in slices of values that keep the comparisons' arrays small."""
        out = np.empty((values.size, len(self)), dtype=bool)
        step = max(1, self.ACCEPTS_CELLS // max(self.low.size, 1))
        for start in range(0, values.size, step):
            v = values[start : start + step, None, None]
            out[start : start + step] = (((v > self.low) | ((v == self.low) & self.low_inclusive))
                                         & ((v < self.high) | ((v == self.high) & self.high_inclusive))).any(axis=2)
        return out

    def flips(self, old: np.ndarray, new: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """For keys moving from ``old[i]`` to ``new[i]`` (numbers, firing exactly where accepted): the
        (key index, member, now accepted) of the members that flip, and how many candidates were verified."""
        low, high = np.minimum(old, new), np.maximum(old, new)
        first = np.searchsorted(self.ends, low, side="left")
        last = np.searchsorted(self.ends, high, side="right")
        lengths = last - first
        total = int(lengths.sum())
        if not total:
            nothing = np.empty(0, dtype=np.int64)
            return nothing, nothing, np.empty(0, dtype=bool), 0
        key = np.repeat(np.arange(old.size), lengths)
        offsets = np.cumsum(lengths) - lengths
        member = self.owners[np.repeat(first - offsets, lengths) + np.arange(total)]
        pair = np.unique(key * len(self) + member)
        key, member = pair // len(self), pair % len(self)
        was, now = self.holds(member, old[key]), self.holds(member, new[key])
        flip = was != now
        return key[flip], member[flip], now[flip], total


#: New members watching every key are admitted in slices of this many: each slice's matches are found at once (one
#: sort of the values), and the batch's budget may end inside it.
ADMISSION_SLICE = 1024


def _by_owner(sid: int) -> tuple[int, bool]:
    """A subscription's members side by side, in subscription id order (its second member has the negated id)."""
    return abs(sid), sid < 0


def _slices(order: list[int]) -> Iterator[list[int]]:
    """``order`` in slices of about ``ADMISSION_SLICE``, none separating a subscription's two members."""
    start = 0
    while start < len(order):
        end = min(start + ADMISSION_SLICE, len(order))
        while end < len(order) and abs(order[end]) == abs(order[end - 1]):
            end += 1
        yield order[start:end]
        start = end


# (group order, subscription, 0 firing / 1 resolved, key, value, window): sorted, the transitions' order
Flip = tuple[str, int, int, str, float | None, int]


@dataclass
class Context:
    """What a group's evaluation at one boundary reads (the shard's state), and the work it counts."""

    columns: Columns
    known: np.ndarray  # per key id: has a pane in the horizon now
    known_before: np.ndarray  # ... at the previous evaluation
    trusted: bool  # values and firing sets agree (False after replaying another copy's batches)
    names: list[str | None]  # key id -> key
    ids: dict[str, int]
    firing: dict[int, set[str]]
    firing_by_key: dict[str, set[int]]
    restricted: np.ndarray  # per key id: named by some key-restricted member
    costs: PlanCosts
    owns: Callable[[str], bool]  # the keys this shard evaluates (a listed key is watched by its shard only)
    work: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("changed", "candidates", "full", "explicit", "scans"), 0))
    admission: Admission | None = None  # new members wait for it (None: every one is evaluated at once)
    key_version: int | None = None  # changes whenever a key gets or loses an id (None: not said; nothing cached)


class Listed:
    """A group's key-restricted members as (member, key it names) pairs in arrays, so the pairs whose key moved are
    decided at once: their members' ranges broadcast over the keys' values (:meth:`Members.holds`), only whether each
    fired before read from the firing sets. Each pair's key id and whether this shard watches the key are kept while
    the key table and the shard's ownership stay the same."""

    def __init__(self, restricted: dict[int, SubscriptionSpec], by_key: dict[str, set[int]]) -> None:
        self.members = Members(list(restricted.values()))
        pairs = sorted((name, sid) for name, sids in by_key.items() for sid in sids)
        self.names = [name for name, _ in pairs]
        self.sids = np.array([sid for _, sid in pairs], dtype=np.int64)
        self.rows = np.array([self.members.row[sid] for _, sid in pairs], dtype=np.int64)
        self._ids: tuple[tuple[int | None, object], np.ndarray, np.ndarray] | None = None

    def ids(self, ctx: Context) -> tuple[np.ndarray, np.ndarray]:
        """Per pair: its key's id (-1: none) and whether this shard watches the key (a listed key is watched by its
        own shard only)."""
        seen = (ctx.key_version, ctx.owns)
        if ctx.key_version is None or self._ids is None or self._ids[0] != seen:
            ids = np.array([ctx.ids.get(name, -1) for name in self.names], dtype=np.int64)
            owned = np.array([ctx.owns(name) for name in self.names], dtype=bool)
            self._ids = (seen, ids, owned)
        return self._ids[1], self._ids[2]


@dataclass
class PlanCosts:
    """Measured seconds per unit of work of the two ways to find a group's flips, so each group and boundary takes
    the cheaper: per changed key (units: changed keys, plus members per key decided explicitly) or a scan of every
    member over the values array (units: members x keys). Both give the same flips; only the cost differs (the
    adaptive choice Arasu & Widom leave as future work). Each plan is measured in the units it is chosen on: a cost
    per unit is only comparable to the units it is multiplied by.

    A plan's cost per unit is its moving sum of seconds over its moving sum of units, not a moving average of each
    call's ratio: a call has a fixed part (a few hundred microseconds a group), so a group with a dozen changed keys
    measures a hundred times the per-unit cost of one with thousands, and averaged ratios made the big groups look
    dear enough to scan (each scan tens of times the per-key plan it replaced, in the pipeline benchmark's mix)."""

    per_key_seconds: float = 1e-3  # the moving sums start at these rates: 1 us a changed key, 50 ns a scanned cell
    per_key_units: float = 1e3
    scan_seconds: float = 5e-3
    scan_units: float = 1e5
    weight: float = 0.2
    force: str | None = None  # "per_key" or "scan": always that way (tests)

    @property
    def per_key(self) -> float:
        return self.per_key_seconds / self.per_key_units

    @property
    def scan(self) -> float:
        return self.scan_seconds / self.scan_units

    def choose(self, per_key_units: float, scan_units: float) -> str:
        if self.force is not None:
            return self.force
        return "scan" if self.scan * scan_units < self.per_key * per_key_units else "per_key"

    def measured(self, plan: str, seconds: float, units: float) -> None:
        if units > 0:
            keep = 1 - self.weight
            setattr(self, f"{plan}_seconds", keep * getattr(self, f"{plan}_seconds") + seconds)
            setattr(self, f"{plan}_units", keep * getattr(self, f"{plan}_units") + units)


def _value(v: float) -> float | None:
    return None if math.isnan(v) else float(v)


class GroupState:
    """One group's members and its values per key id, evaluated output-sensitively."""

    def __init__(self, template: Condition, order: str) -> None:
        self.template = template
        self.order = order
        self.window_ms = template.window_ms  # what its transitions report: the longest window it reads
        self.windows = sorted(template.windows)  # every window it reads: a key changed in any may flip
        self.empty = empty_value(template)
        self.everyone: dict[int, SubscriptionSpec] = {}
        self.restricted: dict[int, SubscriptionSpec] = {}
        self.by_key: dict[str, set[int]] = {}
        self.values: np.ndarray | None = None  # None: not computed yet (a new group)
        self.fresh: set[int] = set()  # members to evaluate in full at the next boundary (new or edited)
        self.waiting: set[int] = set()  # new members not admitted yet (evaluator.admission): not evaluated at all
        self._members: Members | None = None
        self._waiting_rows: tuple[Members, np.ndarray] | None = None  # the members' rows that wait, as a mask
        self._listed: Listed | None = None

    def __len__(self) -> int:
        return len(self.everyone) + len(self.restricted)

    @property
    def members(self) -> Members:
        if self._members is None:
            self._members = Members(list(self.everyone.values()))
        return self._members

    def add(self, spec: SubscriptionSpec) -> None:
        if spec.keys is None:
            self.everyone[spec.id] = spec
            self._members = None
        else:
            self.restricted[spec.id] = spec
            for key in spec.keys:
                self.by_key.setdefault(key, set()).add(spec.id)
            self._listed = None
        self.fresh.add(spec.id)

    def remove(self, sid: int) -> None:
        if self.everyone.pop(sid, None) is not None:
            self._members = None
        spec = self.restricted.pop(sid, None)
        if spec is not None and spec.keys is not None:
            self._listed = None
            for key in spec.keys:
                named = self.by_key[key]
                named.discard(sid)
                if not named:
                    del self.by_key[key]
        self.fresh.discard(sid)
        if sid in self.waiting:
            self.waiting.discard(sid)
            self._waiting_rows = None

    def evaluate(self, ctx: Context, dirty: np.ndarray) -> list[Flip]:
        """The flips at this boundary; updates ``values`` for the keys in ``dirty`` (all keys if new)."""
        capacity = ctx.known.size
        flips: list[Flip] = []
        if self.values is None:
            self.values = values_of(ctx.columns, self.template, np.arange(capacity))
            self.fresh |= set(self.everyone) | set(self.restricted)
            dirty = np.empty(0, dtype=np.int64)
        elif self.values.size < capacity:
            self.values = np.concatenate([self.values, np.full(capacity - self.values.size, self.empty)])
        if dirty.size:
            flips += self._changed(ctx, dirty)
        started = time.perf_counter()
        fresh = self._due(ctx.admission)
        watching_all = [sid for sid in fresh if sid in self.everyone]
        if watching_all:
            flips += self._full(ctx, watching_all)
        for sid in fresh:
            if sid not in self.everyone:
                flips += self._full_listed(ctx, sid)
        self.fresh = set()
        admitted = self._admit(ctx, flips) if self.waiting and ctx.admission is not None and ctx.admission.open else 0
        if fresh or admitted:
            ctx.costs.measured("scan", time.perf_counter() - started, (len(fresh) + admitted) * self.values.size)
        return flips

    def _due(self, admission: Admission | None) -> list[int]:
        """The members to evaluate in full now, in id order; new ones the admission holds back join ``waiting``.
        Costs the fresh members, not the waiting ones: a batch whose budget is spent passes them by."""
        fresh = self.fresh - self.waiting if self.waiting else self.fresh
        if admission is not None and admission.limited:
            new = {sid for sid in fresh if admission.waits(sid)}
            if new:
                self.waiting |= new
                self._waiting_rows = None
                fresh = fresh - new
        return sorted(fresh)

    def _admit(self, ctx: Context, flips: list[Flip]) -> int:
        """Waiting members evaluated in full while the batch's admission budget lasts (``evaluator.admission``),
        in subscription id order, a subscription's two members together; their flips are added to ``flips``.
        Returns how many were admitted. They go in slices, each slice's matches found at once (members watching
        every key) and admitted up to the budget."""
        admission = ctx.admission
        assert admission is not None
        admitted: list[int] = []
        for part in _slices(sorted(self.waiting, key=_by_owner)):
            if not admission.open:
                break
            everyone = [sid for sid in part if sid in self.everyone]
            accepted = dict(zip(everyone, self._accepting(ctx, everyone), strict=True)) if everyone else {}
            listed = {sid: self._full_listed(ctx, sid) for sid in part if sid not in accepted}
            counts = [accepted[sid].size if sid in accepted else len(listed[sid]) for sid in part]
            n = admission.take(counts)
            while 0 < n < len(part) and abs(part[n]) == abs(part[n - 1]):
                n += 1  # a subscription's second member is admitted with it
            chosen = [sid for sid in part[:n] if sid in accepted]
            flips += self._full(ctx, chosen, [accepted[sid] for sid in chosen])
            for sid in part[:n]:
                flips += listed.get(sid, ())
            admission.admit(part[:n], sum(counts[:n]))
            admitted += part[:n]
        self.waiting.difference_update(admitted)
        self._waiting_rows = None
        return len(admitted)

    def _waiting_mask(self, members: Members) -> np.ndarray:
        """Per member row: waiting for admission (cached while neither the members nor the waiting change)."""
        if self._waiting_rows is None or self._waiting_rows[0] is not members:
            waiting = np.fromiter(self.waiting, dtype=np.int64, count=len(self.waiting))
            self._waiting_rows = (members, np.isin(members.sids, waiting))
        return self._waiting_rows[1]

    def _changed(self, ctx: Context, ids: np.ndarray) -> list[Flip]:
        assert self.values is not None
        old = self.values[ids]
        new = values_of(ctx.columns, self.template, ids)
        self.values[ids] = new
        known, before = ctx.known[ids], ctx.known_before[ids]
        same = (old == new) | (np.isnan(old) & np.isnan(new))
        moved = ~same | (known != before) | (not ctx.trusted)
        regular = moved & known & before & ~np.isnan(old) & ~np.isnan(new) & ctx.trusted
        ctx.work["changed"] += int(moved.sum())
        flips: list[Flip] = []
        explicit = moved & ~regular
        scan = False
        if self.everyone:
            n_explicit, n_members = int(explicit.sum()), len(self.everyone)
            # measured in the same units below; trusted, the explicit keys meet every member in one array operation
            # (no more than a scan's), so each counts as a key, not as its members one by one
            per_key_units = int(regular.sum()) + n_explicit * (1 if ctx.trusted else n_members)
            scan = ctx.costs.choose(per_key_units, n_members * self.values.size) == "scan"
        if scan:  # every member over the values array, at the end of evaluate()
            self.fresh |= set(self.everyone)
            ctx.work["scans"] += 1
        elif self.everyone:
            started = time.perf_counter()
            members = self.members
            fresh = np.zeros(len(members), dtype=bool)
            fresh[[members.row[s] for s in self.fresh if s in members.row]] = True
            if self.waiting:
                fresh |= self._waiting_mask(members)
            r = np.flatnonzero(regular)
            key, member, now, candidates = members.flips(old[r], new[r])
            ctx.work["candidates"] += candidates
            keep = ~fresh[member]
            changed = ids[r][key[keep]]
            values = self.values[changed]
            order, window, names = self.order, self.window_ms, ctx.names
            flips += [(order, sid, 0 if accepted else 1, names[k] or "", None if v != v else v, window)
                      for k, sid, accepted, v in zip(changed.tolist(), members.sids[member[keep]].tolist(),
                                                     now[keep].tolist(), values.tolist(), strict=True)]
            e = np.flatnonzero(explicit)
            ctx.work["explicit"] += e.size
            if ctx.trusted:
                flips += self._appeared_or_vanished(ctx, ids[e], old[e], new[e], fresh)
            else:
                flips += self._against_firing(ctx, ids[e], fresh)
            ctx.costs.measured("per_key", time.perf_counter() - started, per_key_units)
        if self.restricted:
            flips += self._listed_moved(ctx, ids[moved & ctx.restricted[ids]])
        return flips

    def _listed_moved(self, ctx: Context, moved: np.ndarray) -> list[Flip]:
        """The flips of this group's key-restricted members for the keys in ``moved`` (ids named by some
        key-restricted member of any group), every (member, key) pair they name decided at once (:class:`Listed`)."""
        assert self.values is not None
        if not moved.size:
            return []
        if self._listed is None:
            self._listed = Listed(self.restricted, self.by_key)
        listed = self._listed
        key_ids, owned = listed.ids(ctx)
        marked = np.zeros(self.values.size, dtype=bool)
        marked[moved] = True
        at = np.flatnonzero((key_ids >= 0) & marked[np.maximum(key_ids, 0)])
        if at.size and (self.fresh or self.waiting):  # evaluated in full at this boundary, or not at all yet
            at = at[~np.isin(listed.sids[at], np.fromiter(self.fresh | self.waiting, dtype=np.int64))]
        if not at.size:
            return []
        values = self.values[key_ids[at]]
        now = owned[at] & listed.members.holds(listed.rows[at], values)
        order, window, firing = self.order, self.window_ms, ctx.firing
        empty: set[str] = set()
        return [(order, sid, 0 if accepted else 1, name, None if v != v else v, window)
                for name, sid, accepted, v in zip((listed.names[i] for i in at.tolist()), listed.sids[at].tolist(),
                                                  now.tolist(), values.tolist(), strict=True)
                if accepted != (name in firing.get(sid, empty))]

    def _appeared_or_vanished(self, ctx: Context, ids: np.ndarray, old: np.ndarray, new: np.ndarray,
                              fresh: np.ndarray) -> list[Flip]:
        """Keys whose value appeared or vanished (NaN on one side) or that became watched or unwatched (data in the
        horizon), while the values agree with the firing sets: a member fired for such a key exactly where the key
        was watched and it accepted the old value, as the regular keys' flips assume too. So only the side with a
        watched value can have members firing, and they flip: every such key against every member at once
        (:meth:`Members.accepts`), not key by key against the firing sets."""
        assert self.values is not None
        was = ctx.known_before[ids] & ~np.isnan(old)
        now = ctx.known[ids] & ~np.isnan(new)
        one_side = np.flatnonzero(was != now)  # both sides watched with values: a regular key, not here
        if not one_side.size:
            return []
        members = self.members
        accepted = members.accepts(np.where(now, new, old)[one_side]) & ~fresh
        at, member = np.nonzero(accepted)
        keys = ids[one_side][at]
        order, window, names = self.order, self.window_ms, ctx.names
        return [(order, sid, 0 if firing else 1, names[k] or "", _value(v), window)
                for k, sid, firing, v in zip(keys.tolist(), members.sids[member].tolist(), now[one_side][at].tolist(),
                                             self.values[keys].tolist(), strict=True)]

    def _against_firing(self, ctx: Context, ids: np.ndarray, fresh: np.ndarray) -> list[Flip]:
        """Keys decided one by one against the firing sets: values that may be older than the firing sets (a copy
        brought up to date by replay) are not evidence of what fired."""
        assert self.values is not None
        members, flips = self.members, []
        for k in ids.tolist():
            name = ctx.names[k] or ""
            was = np.zeros(len(members), dtype=bool)
            was[[members.row[s] for s in ctx.firing_by_key.get(name, ()) if s in members.row]] = True
            now_mask = members.holding(self.values[k]) & bool(ctx.known[k]) & ~fresh  # watched: has data
            for m in np.flatnonzero(now_mask != (was & ~fresh)).tolist():
                flips.append((self.order, members.specs[m].id, 0 if now_mask[m] else 1, name,
                              _value(self.values[k]), self.window_ms))
        return flips

    def _one(self, ctx: Context, sid: int, name: str, k: int | None) -> list[Flip]:
        """One (member, key), decided explicitly."""
        assert self.values is not None
        value = self.empty if k is None else float(self.values[k])
        was = name in ctx.firing.get(sid, ())
        spec = self.restricted[sid]
        now = name in spec.keys and ctx.owns(name) and spec.condition.holds(value)  # type: ignore[operator]  # listed
        return [] if now == was else [(self.order, sid, 0 if now else 1, name, _value(value), self.window_ms)]

    def _accepting(self, ctx: Context, sids: list[int]) -> list[np.ndarray]:
        """Per member watching every key: the key ids it accepts (a key is watched while it has data in the
        horizon)."""
        assert self.values is not None
        members = self.members
        return members.accepting(np.array([members.row[sid] for sid in sids], dtype=np.int64), self.values, ctx.known)

    def _full(self, ctx: Context, sids: list[int], accepted: list[np.ndarray] | None = None) -> list[Flip]:
        """New or edited members that watch every key, against every key at once (``Members.accepting``), or
        against the matches found already (``accepted``)."""
        assert self.values is not None
        if not sids:
            return []
        ctx.work["full"] += len(sids)
        if accepted is None:
            accepted = self._accepting(ctx, sids)
        order, window, names, values = self.order, self.window_ms, ctx.names, self.values
        marked = np.zeros(values.size, dtype=bool)  # set and cleared per member: no set operations (their sorts)
        flips: list[Flip] = []
        for sid, now in zip(sids, accepted, strict=True):
            firing = ctx.firing.get(sid)
            if firing:
                was = np.array([k for name in firing if (k := ctx.ids.get(name)) is not None], dtype=np.int64)
                marked[now] = True
                lost = was[~marked[was]]
                marked[now] = False
                marked[was] = True
                gained = now[~marked[now]]
                marked[was] = False
                flips += [(order, sid, 1, names[k] or "", _value(v), window)
                          for k, v in zip(lost.tolist(), values[lost].tolist(), strict=True)]
                # a key it fired for when it listed keys, never seen (NO DATA): it has no id, and is no longer watched
                flips += [(order, sid, 1, name, _value(self.empty), window) for name in sorted(firing)
                          if name not in ctx.ids]
            else:
                gained = now
            flips += [(order, sid, 0, names[k] or "", v, window)  # accepted: never NaN
                      for k, v in zip(gained.tolist(), values[gained].tolist(), strict=True)]
        return flips

    def _full_listed(self, ctx: Context, sid: int) -> list[Flip]:
        """A new or edited member that lists its keys, key by key."""
        ctx.work["full"] += 1
        spec = self.restricted[sid]
        assert spec.keys is not None
        names = spec.keys | ctx.firing.get(sid, set())  # an edit may have left keys it no longer names
        return [f for name in sorted(names) for f in self._one(ctx, sid, name, ctx.ids.get(name))]
