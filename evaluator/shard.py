"""One evaluator shard: the keys hashed to it, their collective indexes, and their alerts.

Pure (no I/O); the Spark adapter feeds it pane rows and source progress each
micro-batch and stores what it returns.

Time. Each shard follows every Kafka partition's progress (the newest event or
heartbeat time seen in it, broadcast to all shards), so a shard without events
of its own still advances. The watermark is the slowest partition's progress
minus the allowed delay; every pane boundary ``b`` at or below it is evaluated,
in order, over windows ``[b - T, b)``. Evaluation instants depend only on the
data, so a replayed or restarted run produces the same transitions and ids.

Idle time costs O(1). Between two boundaries at which no pane enters or leaves
any window (nor the horizon), every window holds the same panes, so every
condition has the same value and no transition can happen: such boundaries are
skipped, and the shard's clock (``evaluated_at``) moves to the watermark's boundary
whatever it is watching, in one step. The boundaries evaluated are the "change
points": a pane entering (``s + pane`` for a pending pane at ``s``), a pane leaving a
window of length ``T`` or the horizon (``s + T + pane``), and the next boundary after
a catalog change or a late pane (``stale``). So a day with nothing to do costs one
step, not 86,400, whatever is firing; and the clock never depends on what other
keys of the shard are doing.

Panes. A pane joins the collective indexes once complete (its boundary passed),
in pane order, as the indexes require. A pane row arriving after that (a late
event) is inserted out of order by the indexes' correction path and counts in
every later window that covers it (WID's generous semantics); one that no window
still to come covers (it starts at or before ``evaluated_at - horizon``) is dropped
and counted. Because the clock follows the watermark even while the shard is
idle, the same event is late, or too late, whether or not other keys keep the
shard busy. Rows with a non-finite value never reach an index (the parser
refuses them; the shard drops and counts any that get through).

Evaluation. Subscriptions are grouped by (aggregate, attribute, window). Per
group and boundary, one index lookup per range of the group's loosest ranges
(the members' accepted ranges, merged) returns the candidates with their exact
values (CI-COUNT / CI-SUM with verification, the MAX/MIN staircases); aggregates
without an index (AVG, those over each key's events, expressions) are computed
per watched key. Which index answers an aggregate, and how its value is computed,
is declared in evaluator/aggregates.py. Each subscription then takes its ranges
of the values sorted once. ``collective=False`` evaluates every subscription on
every key one by one instead: the baseline.
"""

from __future__ import annotations

import json
import struct
from collections import defaultdict
from dataclasses import dataclass, field, replace

import numpy as np

from evaluator.aggregates import AGGREGATES, Aggregation, PaneAggregate
from evaluator.catalog import Catalog
from evaluator.collective import CollectiveIndexes
from evaluator.comparators import Range
from evaluator.panerows import PaneRows
from evaluator.spec import Condition, Expr, Num, SubscriptionSpec, Term, combine
from evaluator.ssf.ci_extreme import CollectiveExtreme
from evaluator.ssf.ci_sum import CollectiveSum
from evaluator.transition import State, Transition, alert_id
from evaluator.values import KeyValues


@dataclass(frozen=True)
class ShardConfig:
    attributes: tuple[str, ...]
    pane_ms: int
    horizon_ms: int  # the longest window any condition may use
    delay_ms: int  # allowed event-time disorder
    partitions: int  # source partitions whose progress makes the watermark
    p: int = 4  # CI-COUNT / CI-SUM stamps per level: ε = 2 / (p + 2)
    collective: bool = True
    value_retention_ms: int = 0  # how long every event value is kept, for QUANTILE (the longest quantile window)


@dataclass(frozen=True)
class Group:
    """Subscriptions asking for the same value per key: they differ only in their ranges."""

    template: Condition  # a member's condition: what the value is
    specs: tuple[SubscriptionSpec, ...]
    # One single-range condition per range a candidate's value must lie in: the members' accepted ranges, merged
    # (closed). None: together they accept every value, every key is a candidate.
    loosest: tuple[Condition, ...] | None
    aggregate: Aggregation | None = None  # the declared aggregate, None for an expression
    accepted: tuple[tuple[Range, ...], ...] = ()  # each member's ranges, in the order of ``specs``


def _value_key(c: Condition) -> tuple:
    return (c.aggregate, c.attribute, c.window_ms, c.q, c.expression, c.percent_of)


def _order(key: tuple) -> str:
    """Groups are evaluated in this order (as when expressions were tuples), so transitions come in a stable order."""
    expression = key[4]
    return str((*key[:4], _tuples(expression.to_json()) if expression is not None else None, *key[5:]))


def _tuples(value: object) -> object:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _loosest(ranges: list[Range]) -> list[Range]:
    """The union of ``ranges`` as few closed ranges as cover it: one range query each."""
    merged: list[Range] = []
    for r in sorted(ranges, key=lambda r: float("-inf") if r.low is None else r.low):
        last = merged[-1] if merged else None
        if last is not None and (last.high is None or r.low is None or r.low <= last.high):
            high = None if last.high is None or r.high is None else max(last.high, r.high)
            merged[-1] = Range(last.low, high, True, True)
        else:
            merged.append(Range(r.low, r.high, True, True))
    return merged


def group_subscriptions(catalog: Catalog) -> list[Group]:
    """Subscriptions by the value they ask for (aggregate, attribute, window, ...), each with its loosest ranges."""
    by: dict[tuple, list[SubscriptionSpec]] = defaultdict(list)
    for spec in catalog.subscriptions:
        by[_value_key(spec.condition)].append(spec)
    groups = []
    for _, specs in sorted(by.items(), key=lambda kv: _order(kv[0])):
        template = specs[0].condition
        accepted = tuple(s.condition.accepted for s in specs)
        ranges = _loosest([r for rs in accepted for r in rs])
        loosest = None
        if ranges != [Range(None, None, True, True)]:
            loosest = tuple(replace(template, low=r.low, high=r.high, low_inclusive=True, high_inclusive=True,
                                    ranges=()) for r in ranges)
        groups.append(Group(template, tuple(specs), loosest, AGGREGATES.get(template.aggregate.value), accepted))
    return groups


@dataclass
class Delta:
    """What one micro-batch changed, enough to bring a stale copy of the shard up to date."""

    rows: PaneRows
    progress: dict[int, int]
    evaluated_at: int | None
    applied_until: int | None
    changes: list[tuple[int, str, str]] = field(default_factory=list)  # (subscription, key, state), in order
    dropped_subscriptions: list[int] = field(default_factory=list)
    stale: bool = True  # the next boundary must be evaluated (see ShardEvaluator.stale)

    def to_bytes(self) -> bytes:
        meta = json.dumps({
            "progress": self.progress, "evaluated_at": self.evaluated_at, "applied_until": self.applied_until,
            "changes": self.changes, "dropped": self.dropped_subscriptions, "stale": self.stale,
        }).encode()
        return struct.pack("<I", len(meta)) + meta + self.rows.to_bytes()

    @classmethod
    def from_bytes(cls, blob: bytes) -> Delta:
        (n,) = struct.unpack_from("<I", blob)
        meta = json.loads(blob[4 : 4 + n])
        return cls(
            PaneRows.from_bytes(blob[4 + n :]),
            {int(p): ts for p, ts in meta["progress"].items()},
            meta["evaluated_at"],
            meta["applied_until"],
            [tuple(x) for x in meta["changes"]],
            meta["dropped"],
            meta.get("stale", True),
        )


@dataclass
class BatchStats:
    late_events: int = 0  # arrived after their pane joined the indexes, applied by correction
    dropped_events: int = 0  # older than every window still to be evaluated
    boundaries: int = 0
    invalid_events: int = 0  # in rows with a non-finite value: dropped before any index sees them
    candidates: int = 0  # values computed by index lookups (collective) or per (key, subscription) (naive)
    matches: int = 0


class ShardEvaluator:
    def __init__(self, config: ShardConfig) -> None:
        self.config = config
        self.indexes = CollectiveIndexes(config.attributes, p=config.p, bucket_ms=config.pane_ms)
        self.values = KeyValues(config.attributes, config.value_retention_ms)
        self.pending = PaneRows.empty(len(config.attributes))  # panes not complete yet
        self.firing: dict[int, set[str]] = {}
        self.progress: dict[int, int] = {}
        self.evaluated_at: int | None = None  # the last boundary evaluated
        self.applied_until: int | None = None  # panes starting before this are in the indexes
        self.starts = np.empty(0, dtype=np.int64)  # sorted distinct starts of the panes in the indexes
        # The next boundary must be evaluated: the indexes or the catalog changed since the last evaluation
        # in a way the change points do not show (a late pane, new subscriptions). Evaluating a boundary where
        # nothing changed yields no transition, so True is always safe; it is kept in deltas and snapshots.
        self.stale = True
        self.epoch = 0  # the adapter's batch number this state corresponds to
        self._groups: list[Group] = []
        self._groups_version: int | None = None

    # -- time -----------------------------------------------------------------------------------

    @property
    def watermark(self) -> int | None:
        """Events older than this are late; None until every partition has reported."""
        if len(self.progress) < self.config.partitions:
            return None
        return min(self.progress.values()) - self.config.delay_ms

    # -- input ----------------------------------------------------------------------------------

    def ingest(self, rows: PaneRows, progress: dict[int, int], stats: BatchStats | None = None) -> PaneRows:
        """Take a batch's pane rows and partition progress; returns the rows kept (for the change log)."""
        stats = stats or BatchStats()
        for partition, ts in progress.items():
            self.progress[partition] = max(self.progress.get(partition, ts), ts)
        rows = self._finite(rows, stats)
        if not len(rows) or self.applied_until is None:
            self.pending = PaneRows.concat([self.pending, rows], len(self.config.attributes))
            return rows
        assert self.evaluated_at is not None
        # The windows still to come end at b >= evaluated_at + pane and start at b - T >= b - horizon.
        too_old = rows.starts < self.evaluated_at + self.config.pane_ms - self.config.horizon_ms
        if too_old.any():
            stats.dropped_events += int(rows.counts[too_old].sum())
            rows = rows.select(~too_old)
        late = rows.starts < self.applied_until
        if late.any():
            stats.late_events += int(rows.counts[late].sum())
            self._apply(rows.select(late).combined(), late=True)
            self.stale = True
        self.pending = PaneRows.concat([self.pending, rows.select(~late)], len(self.config.attributes))
        return rows

    @staticmethod
    def _finite(rows: PaneRows, stats: BatchStats) -> PaneRows:
        """``rows`` without those holding a non-finite value (which would poison every index they reach)."""
        if not len(rows):
            return rows
        ok = (np.isfinite(rows.sums).all(axis=0) & np.isfinite(rows.mins).all(axis=0)
              & np.isfinite(rows.maxs).all(axis=0) & (rows.counts > 0))
        if rows.event_values.size and not np.isfinite(rows.event_values).all():
            bad_event = ~np.isfinite(rows.event_values).all(axis=0)
            row_of_event = np.repeat(np.arange(len(rows)), np.diff(rows.event_offsets))
            ok &= np.bincount(row_of_event[bad_event], minlength=len(rows)) == 0
        if ok.all():
            return rows
        stats.invalid_events += int(np.maximum(rows.counts[~ok], 1).sum())
        return rows.select(ok)

    def _apply(self, rows: PaneRows, late: bool = False) -> None:
        if not len(rows):
            return
        starts = np.unique(rows.starts)
        if not self.starts.size or starts[0] > self.starts[-1]:
            self.starts = np.concatenate([self.starts, starts])
        else:
            self.starts = np.union1d(self.starts, starts)
        self.indexes.add_panes(rows.keys.tolist(), rows.starts, rows.counts, rows.sums, rows.mins, rows.maxs,
                               late=late)
        self.values.add(rows)

    def _apply_until(self, boundary: int) -> None:
        """Move the panes that start before ``boundary`` from pending into the indexes, in pane order."""
        if len(self.pending):
            complete = self.pending.starts < boundary
            if complete.any():
                self._apply(self.pending.select(complete).combined())
                self.pending = self.pending.select(~complete)
        self.applied_until = boundary
        self.starts = self.starts[np.searchsorted(self.starts, boundary - self.config.horizon_ms):]
        self.indexes.expire(boundary - self.config.horizon_ms - 1)
        self.values.expire(boundary, self.config.horizon_ms)

    # -- evaluation -------------------------------------------------------------------------------

    def step(
        self, rows: PaneRows, progress: dict[int, int], catalog: Catalog, stats: BatchStats | None = None
    ) -> tuple[list[Transition], Delta]:
        """One micro-batch: take its rows and progress, evaluate what became complete."""
        stats = stats or BatchStats()
        kept = self.ingest(rows, progress, stats)
        transitions, delta = self.advance(catalog, stats)
        delta.rows = kept
        return transitions, delta

    def advance(self, catalog: Catalog, stats: BatchStats | None = None) -> tuple[list[Transition], Delta]:
        """Evaluate every boundary the watermark passed; returns the transitions and this batch's delta.

        Only boundaries where something can change are evaluated (see the module docstring); the
        clock then moves to the watermark's boundary, so what is late afterwards is the same
        whether this shard was busy or idle.
        """
        stats = stats or BatchStats()
        delta = Delta(PaneRows.empty(len(self.config.attributes)), dict(self.progress), None, None)
        transitions: list[Transition] = []
        self._refresh(catalog, delta)
        watermark = self.watermark
        if watermark is not None:
            last = (watermark // self.config.pane_ms) * self.config.pane_ms
            if self.evaluated_at is None and (not len(self.pending) or int(self.pending.starts.min()) >= last):
                self._apply_until(last)  # nothing to evaluate yet: the clock starts at the watermark
                self.evaluated_at = last
            boundary = self._next_boundary()
            while boundary is not None and boundary <= last:
                self._apply_until(boundary)
                transitions += self._evaluate(boundary, stats, delta)
                self.evaluated_at = boundary
                self.stale = False
                stats.boundaries += 1
                boundary = self._next_boundary()
            if self.evaluated_at is not None and self.evaluated_at < last:  # nothing can change up to last
                self._apply_until(last)
                self.evaluated_at = last
        delta.evaluated_at, delta.applied_until, delta.stale = self.evaluated_at, self.applied_until, self.stale
        return transitions, delta

    def _next_boundary(self) -> int | None:
        """The first boundary after ``evaluated_at`` at which a transition can happen (None: none known yet)."""
        pane = self.config.pane_ms
        first_pending = int(self.pending.starts.min()) + pane if len(self.pending) else None
        if self.evaluated_at is None:
            return first_pending  # start with the first pane that holds data
        after = self.evaluated_at + pane
        if self.stale or first_pending == after:
            return after
        candidates = [] if first_pending is None else [first_pending]
        if self.starts.size:  # a pane at s leaves a window of length T at s + T + pane
            windows = {g.template.window_ms for g in self._groups} | {self.config.horizon_ms}
            for window in windows:
                i = int(np.searchsorted(self.starts, self.evaluated_at - window - pane, side="right"))
                if i < self.starts.size:
                    candidates.append(int(self.starts[i]) + window + pane)
        return max(min(candidates), after) if candidates else None

    def _refresh(self, catalog: Catalog, delta: Delta) -> None:
        if catalog.version == self._groups_version:
            return
        self.stale = True  # new or edited subscriptions are evaluated at the next boundary
        self._groups = group_subscriptions(catalog)
        self._groups_version = catalog.version
        active = {s.id for s in catalog.subscriptions}
        for sid in [sid for sid in self.firing if sid not in active]:  # deleted or paused: forget silently
            del self.firing[sid]
            delta.dropped_subscriptions.append(sid)

    def _known(self) -> set[str]:
        """Keys with a pane in the retention horizon."""
        return {key for key, sub in self.indexes.count.substreams.items() if sub.ts}

    def _expr(self, expr: Expr, window_ms: int, key: str, now: int) -> float | None:
        if isinstance(expr, Term):  # an aggregate, computed as its declaration says
            return AGGREGATES[expr.aggregate].value_of(self, expr, window_ms, key, now)
        if isinstance(expr, Num):
            return expr.value
        left = self._expr(expr.left, window_ms, key, now)
        right = self._expr(expr.right, window_ms, key, now) if left is not None else None
        if left is None or right is None:
            return None
        return combine(expr.op, left, right)

    def value(self, condition: Condition, key: str, now: int) -> float | None:
        """The exact value ``condition`` compares for one key's window ``(now - T, now]``."""
        expr = condition.computes
        if isinstance(expr, Term):
            return AGGREGATES[expr.aggregate].value_of(self, expr, condition.window_ms, key, now)
        value = self._expr(expr, condition.window_ms, key, now)
        if value is None or condition.percent_of is None:
            return value
        last_term = Term("LAST", condition.percent_of)
        last = AGGREGATES[last_term.aggregate].value_of(self, last_term, condition.window_ms, key, now)
        return combine("/", 100.0 * value, last) if last is not None else None

    def _candidate_values(self, group: Group, now: int, known: set[str]) -> dict[str, float]:
        """Keys that may satisfy some member of ``group``, with their exact values.

        Without an index (AVG, QUANTILE, LAST, expressions, or members that together
        accept every value) the candidates are the keys watched: those with data in the
        horizon and those firing for a member.
        """
        index: CollectiveSum | CollectiveExtreme | None = None
        if group.loosest is not None and isinstance(group.aggregate, PaneAggregate):
            index = group.aggregate.index(self.indexes, group.template.attribute)
        if index is not None:
            assert group.loosest is not None
            values = {}
            for loosest in group.loosest:  # a union of ranges is the union of range queries
                values.update(index.query(loosest, now))
            empty = group.aggregate.empty if group.aggregate is not None else None
            if empty is not None and any(c.holds(empty) for c in group.loosest):
                # the indexes forget keys with no data in the horizon; one still firing keeps its empty value
                for key in set().union(*(self.firing.get(spec.id, ()) for spec in group.specs)) - known:
                    values[key] = empty
            return values
        values = {}
        watched = known.union(*(self.firing.get(spec.id, ()) for spec in group.specs))
        for key in watched:
            value = self.value(group.template, key, now)
            if value is not None and (group.loosest is None or any(c.holds(value) for c in group.loosest)):
                values[key] = value
        return values

    def preview(self, condition: Condition,
                keys: frozenset[str] | None = None) -> tuple[int | None, dict[str, float], int]:
        """Keys whose window satisfies ``condition`` at the last evaluated boundary, by the same lookups as
        subscriptions: ``(boundary, {key: value}, keys watched)``. Changes nothing."""
        if self.evaluated_at is None:
            return None, {}, 0
        now = self.evaluated_at - 1
        known = self._known()
        [group] = group_subscriptions(Catalog(0, (SubscriptionSpec(0, condition, keys),)))
        if self.config.collective:
            values = self._candidate_values(group, now, known)
        else:
            values = {k: v for k in known if (v := self.value(condition, k, now)) is not None}
        matched = {k: v for k, v in values.items() if k in known and condition.holds(v)
                   and (keys is None or k in keys)}
        return self.evaluated_at, matched, len(known if keys is None else known & keys)

    def _evaluate(self, boundary: int, stats: BatchStats, delta: Delta) -> list[Transition]:
        now = boundary - 1  # panes starting in [b - T, b) are the elements stamped in (b - 1 - T, b - 1]
        known = self._known()
        transitions: list[Transition] = []
        values: dict[str, float] | None = None  # the candidates' exact values (collective), reused by transitions
        for group in self._groups:
            empty = group.aggregate.empty if group.aggregate is not None else None
            if self.config.collective:
                values = self._candidate_values(group, now, known)
                stats.candidates += len(values)
                keys = np.array(list(values), dtype=object)
                sorted_values = np.fromiter(values.values(), dtype=np.float64, count=len(values))
                order = np.argsort(sorted_values, kind="stable")
                keys, sorted_values = keys[order], sorted_values[order]
            for spec, accepted in zip(group.specs, group.accepted, strict=True):
                was = self.firing.get(spec.id, set())
                c = spec.condition
                if self.config.collective:
                    matched = set()
                    for r in accepted:
                        lo = 0 if r.low is None else int(np.searchsorted(
                            sorted_values, r.low, side="left" if r.low_inclusive else "right"))
                        hi = len(sorted_values) if r.high is None else int(np.searchsorted(
                            sorted_values, r.high, side="right" if r.high_inclusive else "left"))
                        matched.update(keys[lo:hi].tolist())
                    if empty is not None and c.holds(empty):  # an empty window matches only keys still watched
                        matched = {k for k in matched if k in known or k in was}
                    if spec.keys is not None:
                        matched &= spec.keys
                else:
                    matched = set()
                    eligible = known | was  # a key is watched while it has data or is firing
                    for key in eligible if spec.keys is None else eligible & spec.keys:
                        stats.candidates += 1
                        if c.holds(self.value(c, key, now)):
                            matched.add(key)
                    values = None
                stats.matches += len(matched)
                if matched == was:
                    continue
                changes: list[tuple[str, State]] = [*((k, "firing") for k in matched - was),
                                                     *((k, "resolved") for k in was - matched)]
                for key, state in changes:
                    value = values.get(key) if values is not None and state == "firing" else None
                    if value is None:
                        value = self.value(c, key, now)
                    transitions.append(Transition(alert_id(spec.id, key, state, boundary), spec.id, key, state,
                                                  value, boundary - c.window_ms, boundary, boundary))
                    delta.changes.append((spec.id, key, state))
                if matched:
                    self.firing[spec.id] = matched
                else:
                    self.firing.pop(spec.id, None)
        return transitions

    # -- catching up and persisting -------------------------------------------------------------------

    def replay(self, delta: Delta) -> None:
        """Apply a batch another copy of this shard processed, without evaluating again."""
        self.ingest(delta.rows, delta.progress)
        if delta.applied_until is not None and delta.applied_until != self.applied_until:
            self._apply_until(delta.applied_until)
        self.evaluated_at = delta.evaluated_at
        self.stale = delta.stale
        for sid in delta.dropped_subscriptions:
            self.firing.pop(sid, None)
        for sid, key, state in delta.changes:
            if state == "firing":
                self.firing.setdefault(sid, set()).add(key)
                continue
            keys = self.firing.get(sid)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self.firing[sid]

    def snapshot(self) -> bytes:
        parts = self.indexes.to_parts()
        meta = {"progress": self.progress, "evaluated_at": self.evaluated_at, "applied_until": self.applied_until,
                "firing": {sid: sorted(keys) for sid, keys in self.firing.items()}, "stale": self.stale}
        parts += [self.values.to_bytes(), self.pending.to_bytes(), json.dumps(meta).encode()]
        return struct.pack(f"<I{len(parts)}Q", len(parts), *map(len, parts)) + b"".join(parts)

    @classmethod
    def from_snapshot(cls, config: ShardConfig, blob: bytes) -> ShardEvaluator:
        (n,) = struct.unpack_from("<I", blob)
        sizes = struct.unpack_from(f"<{n}Q", blob, 4)
        offset, parts = 4 + 8 * n, []
        for size in sizes:
            parts.append(blob[offset : offset + size])
            offset += size
        shard = cls(config)
        shard.indexes = CollectiveIndexes.from_parts(config.attributes, parts[:-3])
        shard.values = KeyValues.from_bytes(parts[-3], config.attributes, config.value_retention_ms)
        shard.pending = PaneRows.from_bytes(parts[-2])
        meta = json.loads(parts[-1])
        shard.progress = {int(p): ts for p, ts in meta["progress"].items()}
        shard.evaluated_at, shard.applied_until = meta["evaluated_at"], meta["applied_until"]
        shard.firing = {int(sid): set(keys) for sid, keys in meta["firing"].items()}
        shard.stale = meta.get("stale", True)
        held = [sub.ts for sub in shard.indexes.count.substreams.values() if sub.ts]
        shard.starts = np.unique(np.concatenate(held)).astype(np.int64) if held else shard.starts
        return shard
