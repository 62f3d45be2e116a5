"""One evaluator shard: the keys hashed to it, their panes and running windows, and their alerts.

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

Panes. A pane joins the store (evaluator/panestore.py: the horizon's panes as columns,
per key id) once complete, in pane order, and every running window aggregate moves with it.
A pane row arriving after that (a late event) is merged into the store and into every
window that covers it now, and counts in every later window that covers it (WID's generous
semantics); one that no window still to come covers (it starts at or before
``evaluated_at - horizon``) is dropped and counted. Because the clock follows the watermark
even while the shard is idle, the same event is late, or too late, whether or not other keys
keep the shard busy. Rows with a non-finite value never reach the store (the parser refuses
them; the shard drops and counts any that get through).

Evaluation. Subscriptions are grouped by (aggregate, attribute, window, ...): the value they
ask per key. The default plan (``plan="incremental"``, evaluator/incremental.py) is output
sensitive: between two evaluated boundaries only keys that gained or lost a pane in some
window (or the horizon), or got a late pane, can change value; per group, a values array
over key ids is updated for those keys only, by array expressions over the running
aggregates (COUNT, exact SUM, MIN, MAX; AVG and expressions combined from them), except
QUANTILE and LAST, computed per changed key from its retained events because no summary
answers them. For a key moving from ``o`` to ``n``, the members that flip are those with a
range endpoint between the two (a searchsorted slice of the group's sorted endpoints),
verified exactly; a key becoming known or unknown, a value appearing or vanishing, or a copy
of the shard that replayed another's batches is decided against the firing sets. Members
new or edited (catalog diffs, applied one subscription at a time) are tested against the
whole values array at the next boundary. Semantics are those of the other plans, which stay:
``plan="index"`` evaluates every group in full by collective index lookups (CI-COUNT /
CI-SUM with verification, the MAX/MIN staircases, built from the store on demand; a CI-SUM
holding a negative value verifies every key it holds), and ``collective=False`` evaluates
every subscription on every key one by one: the baseline. Transitions come in one order
whatever the plan: groups in ``_order``, then subscription id, firing before resolved, then
key.

Previews (:meth:`ShardEvaluator.preview`) read the running windows (or sum a window no
subscription uses from the store) exactly as the incremental plan computes a group's values:
the same answer as a subscription of the condition, whatever the plan and the values' signs,
and nothing the next batch sees changes (no index is built).

Keys. A key is watched by a subscription while it has a pane in the horizon; a key the
subscription lists (``keys``) always. So a no-data alert (``NO DATA FOR 5m``, or any condition
an empty window satisfies, such as ``COUNT(*) OVER 5m < 1``) fires for a listed key until it
reports again, and for any other key until it has been silent for the whole horizon
(``TOCSIN_MAX_WINDOW_MS``): then it resolves, and the key is forgotten. Firing sets are thus
bounded by the keys active in the horizon plus the keys listed, whatever the key churn. A
key's id is released once it has no pane in the horizon and fires for nobody, so memory
follows the active keys, not every key ever seen.
"""

from __future__ import annotations

import json
import struct
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from core.settings import Settings
from evaluator.admission import Admission
from evaluator.aggregates import AGGREGATES, Aggregation, PaneAggregate
from evaluator.catalog import Catalog
from evaluator.collective import CollectiveIndexes
from evaluator.comparators import Range
from evaluator.incremental import Context, Flip, GroupState, Members, PlanCosts, empty_value, values_of
from evaluator.lifecycle import Raw, Tracker, aux_id
from evaluator.panerows import PaneRows
from evaluator.panestore import Panes, RunningWindows, Window, to_floats
from evaluator.rank import EMPTY_KEY, RankBook, RankEntry, first_k
from evaluator.spec import Condition, Expr, Num, SubscriptionSpec, Term, combine
from evaluator.ssf.ci_extreme import CollectiveExtreme
from evaluator.ssf.ci_sum import CollectiveSum
from evaluator.transition import State, Transition, alert_id
from evaluator.tuples import LastEvents, tuple_column, tuple_value
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
    tuple_max_events: int = 0  # each key's newest events kept for tuple windows (the longest: OVER LAST n EVENTS)
    # Collective evaluation: "incremental" updates each group's values for the keys that changed and finds the
    # members that flip; "index" evaluates every group in full by collective index lookups (the former plan).
    plan: str = "incremental"
    #: MIN/MAX block summaries span this many panes (``panestore.BlockExtremes``; 0: none): a window's extreme
    #: that left it is recomputed from its blocks and the panes at its ends, not from all its panes.
    block_panes: int = 64
    #: New subscriptions' first transitions a batch admits at most (``evaluator.admission``; None: all at once).
    admission_transitions: int | None = None

    @property
    def block_ms(self) -> int | None:
        return self.pane_ms * self.block_panes or None

    @classmethod
    def live(cls, settings: Settings, attributes: tuple[str, ...], partitions: int) -> ShardConfig:
        """The configuration the live query's shards run with (a backtest runs with the same, to be exact)."""
        return cls(
            attributes=attributes,
            pane_ms=settings.pane_ms,
            horizon_ms=settings.max_window_ms,
            delay_ms=settings.watermark_delay_ms,
            partitions=partitions,
            p=settings.evaluator_p,
            collective=settings.evaluator_mode == "collective",
            value_retention_ms=settings.quantile_max_window_ms,
            tuple_max_events=settings.tuple_max_events,
            admission_transitions=settings.evaluator_admission_transitions,
        )


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
    tuple_window = () if c.events is None else (c.events,)  # appended only when used: the order of others holds
    return (c.aggregate, c.attribute, c.window_ms, c.q, c.expression, c.percent_of, *tuple_window)


def _book_key(c: Condition) -> tuple:
    """A rank book's: the value and the direction (ranks of any ``k`` share it)."""
    assert c.rank is not None
    return (*_value_key(c), c.rank.top)


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


def aux_member(spec: SubscriptionSpec) -> SubscriptionSpec | None:
    """A lifecycle's internal second member (evaluator/lifecycle.py): the hold range of a resolve threshold, or a
    two-way crossing's lower side, over the same value, so it joins the subscription's group."""
    life = spec.condition.lifecycle
    r = life.aux_range(spec.condition.accepted) if life is not None and spec.id > 0 else None
    if r is None:
        return None
    condition = replace(spec.condition, low=None, high=None, low_inclusive=False, high_inclusive=False,
                        ranges=(r,), lifecycle=None)
    return SubscriptionSpec(aux_id(spec.id), condition, spec.keys)


def _with_aux(specs: tuple[SubscriptionSpec, ...]) -> list[SubscriptionSpec]:
    return [m for spec in specs for m in (spec, aux_member(spec)) if m is not None]


def group_subscriptions(catalog: Catalog) -> list[Group]:
    """Subscriptions by the value they ask for (aggregate, attribute, window, ...), each with its loosest ranges."""
    by: dict[tuple, list[SubscriptionSpec]] = defaultdict(list)
    for spec in _with_aux(catalog.subscriptions):
        by[_value_key(spec.condition)].append(spec)
    groups = []
    for _, specs in sorted(by.items(), key=lambda kv: _order(kv[0])):
        template = specs[0].condition
        accepted = tuple(s.condition.accepted for s in specs)
        ranges = _loosest([r for rs in accepted for r in rs])
        loosest = None
        if ranges != [Range(None, None, True, True)]:
            loosest = tuple(replace(template, low=r.low, high=r.high, low_inclusive=True, high_inclusive=True,
                                    ranges=(), lifecycle=None, no_data=False) for r in ranges)  # plain ranges
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
    lifecycle: dict | None = None  # the lifecycle records this batch changed (evaluator/lifecycle.py Tracker.export)
    ranks: dict[int, list] = field(default_factory=dict)  # the rank lists sent this batch: sid -> [(key, value, listed)]
    admitted: list[int] = field(default_factory=list)  # subscriptions admitted this batch (evaluator/admission.py)
    unadmitted: list[int] = field(default_factory=list)  # admitted ones deleted or paused this batch (before those)

    def to_bytes(self) -> bytes:
        meta = json.dumps({  # changes as three columns: one JSON list of numbers, two strings (fast to read back)
            "progress": self.progress, "evaluated_at": self.evaluated_at, "applied_until": self.applied_until,
            "change_ids": [c[0] for c in self.changes], "change_states": "".join(c[2][0] for c in self.changes),
            "change_keys": "\x00".join(c[1] for c in self.changes),
            "dropped": self.dropped_subscriptions, "stale": self.stale,
            **({"lifecycle": self.lifecycle} if self.lifecycle is not None else {}),
            **({"ranks": self.ranks} if self.ranks else {}),
            **({"admitted": self.admitted} if self.admitted else {}),
            **({"unadmitted": self.unadmitted} if self.unadmitted else {}),
        }).encode()
        return struct.pack("<I", len(meta)) + meta + self.rows.to_bytes()

    @classmethod
    def from_bytes(cls, blob: bytes) -> Delta:
        (n,) = struct.unpack_from("<I", blob)
        meta = json.loads(blob[4 : 4 + n])
        if "changes" in meta:  # written before changes were columns
            changes = [tuple(x) for x in meta["changes"]]
        else:
            states = {"f": "firing", "r": "resolved"}
            keys = meta["change_keys"].split("\x00") if meta["change_ids"] else []
            changes = list(zip(meta["change_ids"], keys, map(states.__getitem__, meta["change_states"]), strict=True))
        return cls(
            PaneRows.from_bytes(blob[4 + n :]),
            {int(p): ts for p, ts in meta["progress"].items()},
            meta["evaluated_at"],
            meta["applied_until"],
            changes,
            meta["dropped"],
            meta.get("stale", True),
            meta.get("lifecycle"),
            _rank_lists(meta.get("ranks", {})),
            meta.get("admitted", []),
            meta.get("unadmitted", []),
        )


def _rank_lists(data: dict) -> dict[int, list[tuple[str, float, bool]]]:
    """Rank lists sent, as JSON gives them back (string ids, lists): ids and tuples again, comparable with new ones."""
    return {int(sid): [(str(k), float(v), bool(listed)) for k, v, listed in entries] for sid, entries in data.items()}


@dataclass
class BatchStats:
    late_events: int = 0  # arrived after their pane joined the indexes, applied by correction
    dropped_events: int = 0  # older than every window still to be evaluated
    boundaries: int = 0
    invalid_events: int = 0  # in rows with a non-finite value: dropped before any index sees them
    candidates: int = 0  # index lookups' values (index), endpoint candidates verified (incremental), per pair (naive)
    matches: int = 0  # (subscription, key) pairs matching after each boundary
    changed_keys: int = 0  # (group, key) values that changed (incremental)
    explicit_keys: int = 0  # (group, key) changes decided against the firing sets (incremental)
    full_members: int = 0  # members evaluated against every key: new, edited, regrouped, scans (incremental)
    scans: int = 0  # groups whose flips were found by scanning every member, measured cheaper (incremental)
    transitions: int = 0
    plans: dict[str, int] = field(default_factory=dict)  # boundaries evaluated per plan
    rank_moved: int = 0  # (book, key) moves: keys whose windows changed, in each rank book
    rank_sent: int = 0  # rank entries sent (evaluator/rank.py)
    admitted: int = 0  # new subscriptions admitted (evaluator/admission.py)
    waiting: int = 0  # new subscriptions waiting for admission after the batch


class _Columns:
    """The running windows and retained events at one boundary, as :class:`~evaluator.aggregates.Columns`."""

    def __init__(self, running: RunningWindows, values: KeyValues, attributes: tuple[str, ...], boundary: int,
                 windows: Mapping[int, tuple[Window, list[int]]] | None = None) -> None:
        """``windows``: the only time windows read, each with its sums' units (``RunningWindows.window_at``); else
        the running windows."""
        self.running, self.values, self.boundary = running, values, boundary
        self.index = {a: i for i, a in enumerate(attributes)}
        self.windows: Mapping[int, Window] = (running.windows if windows is None
                                              else {ms: window for ms, (window, _) in windows.items()})
        self.shifts: Mapping[int, list[int]] | None = (None if windows is None
                                                       else {ms: shifts for ms, (_, shifts) in windows.items()})

    def count(self, window_ms: int, ids: np.ndarray) -> np.ndarray:
        return self.windows[window_ms].count[ids].astype(np.float64)

    def sum(self, window_ms: int, attribute: str, ids: np.ndarray) -> np.ndarray:
        a = self.index[attribute]
        shifts = self.running.shifts if self.shifts is None else self.shifts[window_ms]
        return to_floats(self.windows[window_ms].sums[a][ids], shifts[a])

    def extreme(self, window_ms: int, side: str, attribute: str, ids: np.ndarray) -> np.ndarray:
        window = self.windows[window_ms]
        held = (window.maxs if side == "maxs" else window.mins)[self.index[attribute]][ids]
        return np.where(window.count[ids] > 0, held, np.nan)

    def events(self, window_ms: int, attribute: str, ids: np.ndarray) -> list[np.ndarray | None]:
        names = self.running.keys.names
        return [None if (name := names[k]) is None else self.values.window(name, attribute, window_ms, self.boundary)
                for k in ids.tolist()]

    def tuples(self, condition: Condition, ids: np.ndarray) -> np.ndarray:
        names, values, n, horizon = self.running.keys.names, self.values, condition.events, self.running.horizon_ms
        assert n is not None

        def last_events_of(k: int) -> LastEvents:
            name = names[k]
            return lambda attribute: None if name is None else values.last(name, attribute, n, self.boundary, horizon)

        return tuple_column(condition, last_events_of, ids)


def _everything(key: str) -> bool:  # noqa: ARG001  # a lone shard owns every key
    return True


def _key_order(flip: Flip) -> tuple:
    return flip[:4]


def join_parts(parts: list[bytes]) -> bytes:
    """A snapshot's framing: the part count, each part's length, then the parts."""
    return struct.pack(f"<I{len(parts)}Q", len(parts), *map(len, parts)) + b"".join(parts)


def split_parts(blob: bytes) -> list[bytes]:
    """The parts :func:`join_parts` framed."""
    (count,) = struct.unpack_from("<I", blob)
    sizes = struct.unpack_from(f"<{count}Q", blob, 4)
    offset, parts = 4 + 8 * count, []
    for size in sizes:
        parts.append(blob[offset : offset + size])
        offset += size
    return parts


class ShardEvaluator:
    def __init__(self, config: ShardConfig) -> None:
        self.config = config
        self.running = RunningWindows(len(config.attributes), config.horizon_ms, config.block_ms)
        self._indexes: CollectiveIndexes | None = None  # built from the store when a lookup needs them
        self._backlog: list[tuple[PaneRows | None, bool, int]] = []  # (rows, late, expire before) not applied yet
        self._backlog_rows = 0
        self.values = KeyValues(config.attributes, config.value_retention_ms, config.tuple_max_events)
        self.pending = PaneRows.empty(len(config.attributes))  # panes not complete yet
        self.firing: dict[int, set[str]] = {}
        self._firing_by_key: dict[str, set[int]] = {}  # the same pairs by key
        self.progress: dict[int, int] = {}
        self.evaluated_at: int | None = None  # the last boundary evaluated
        self.applied_until: int | None = None  # panes starting before this are in the store
        self.starts = np.empty(0, dtype=np.int64)  # sorted distinct starts of the panes in the store
        # The next boundary must be evaluated: the panes or the catalog changed since the last evaluation
        # in a way the change points do not show (a late pane, new subscriptions). Evaluating a boundary where
        # nothing changed yields no transition, so True is always safe; it is kept in deltas and snapshots.
        self.stale = True
        self.epoch = 0  # the adapter's batch number this state corresponds to
        self._catalog = Catalog.empty()
        self._groups_cache: tuple[int, list[Group]] | None = None
        self._groups_version: int | None = None
        self._states: dict[tuple, GroupState] = {}  # incremental plan: per value asked
        self._of_spec: dict[int, tuple] = {}  # subscription -> its group's value key
        self._restricted_names: dict[str, int] = {}  # keys named by key-restricted subscriptions (reference counts)
        self._restricted_ids: tuple[tuple, np.ndarray] | None = None
        self._known_before = np.zeros(0, dtype=bool)  # per key id: known at the previous evaluation
        self._trusted = True  # values arrays agree with the firing sets (no replay since the last evaluation)
        self._maybe_free: list[int] = []  # key ids that resolved: released if no longer known nor firing
        self.costs = PlanCosts()  # measured cost per unit of the incremental plan's two ways, per shard copy
        self._unsynced = False  # deltas were replayed since the last evaluation (see _sync)
        self.lifecycle = Tracker(config.pane_ms)  # pending, keep-firing, damping, crossings (evaluator/lifecycle.py)
        # Rank subscriptions (evaluator/rank.py): kept out of the groups; their books by (value, direction), built
        # from the running windows when first needed (so never stale after a replay or a restore: dropped then); the
        # list each sent last (in deltas and snapshots: a resolve's value needs what left it); this batch's entries.
        self._ranks: dict[int, SubscriptionSpec] = {}
        self._books: dict[tuple, RankBook] = {}
        self._rank_sent: dict[int, list[tuple[str, float, bool]]] = {}
        self._rank_due: set[int] = set()  # new or edited (or a copy rebuilt from the catalog): sent at the next boundary
        self.ranked: list[RankEntry] = []
        # Which keys this shard evaluates: a listed key is watched without data (NO DATA), by its own shard only.
        # The Spark operator sets the hash partitioning's; a lone shard owns every key.
        self.owns: Callable[[str], bool] = _everything
        self.admission = Admission(config.admission_transitions if self._incremental else None)

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
        self._sync()
        for partition, ts in progress.items():
            self.progress[partition] = max(self.progress.get(partition, ts), ts)
        rows = self._finite(rows, stats)
        if not len(rows) or self.applied_until is None:
            self._hold(rows)
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
        self._hold(rows.select(~late))
        return rows

    def _hold(self, rows: PaneRows) -> None:
        """Add ``rows`` to the panes not complete yet, kept in pane-start order (see :meth:`_apply_until`)."""
        self.pending = PaneRows.concat([self.pending, rows], len(self.config.attributes)).by_start()

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

    def _panes(self, rows: PaneRows) -> Panes:
        return Panes(self.running.ids_of(rows.keys), rows.starts.astype(np.int64), rows.counts.astype(np.int64),
                     rows.sums, rows.mins, rows.maxs)

    def _apply(self, rows: PaneRows, late: bool = False, boundary: int | None = None) -> None:
        """Complete panes (in pane order) into the store and its windows, moving them to ``boundary``; or late
        panes (out of order) into every window that covers them."""
        if len(rows):
            starts = np.unique(rows.starts)
            if not self.starts.size or starts[0] > self.starts[-1]:
                self.starts = np.concatenate([self.starts, starts])
            else:
                self.starts = np.union1d(self.starts, starts)
            self.values.add(rows)
            self._log(rows, late)
        if late:
            self.running.add_late(self._panes(rows))
        else:
            assert boundary is not None
            self.running.advance(self._panes(rows), boundary)

    def _apply_until(self, boundary: int) -> None:
        """Move the panes that start before ``boundary`` from pending into the store, in pane order."""
        complete = PaneRows.empty(len(self.config.attributes))
        # pending is in pane-start order: the complete panes are a prefix, sliced off (views), so a batch holding
        # many boundaries' panes (a backlog, a backtest's chunk) costs each boundary its own panes, not all held
        done = int(np.searchsorted(self.pending.starts, boundary, side="left")) if len(self.pending) else 0
        if done:
            complete = self.pending.slice(0, done).combined()
            self.pending = self.pending.slice(done, len(self.pending))
        self._apply(complete, boundary=boundary)
        self.applied_until = boundary
        self.starts = self.starts[np.searchsorted(self.starts, boundary - self.config.horizon_ms):]
        self._log(None, False, boundary - self.config.horizon_ms - 1)
        self.values.expire(boundary, self.config.horizon_ms)

    # -- the collective indexes, caught up when a lookup needs them --------------------------------

    def _log(self, rows: PaneRows | None, late: bool, expire: int = 0) -> None:
        if self._indexes is None:
            return  # built from the store when needed
        self._backlog.append((rows, late, expire))
        self._backlog_rows += len(rows) if rows is not None else 0
        if self._backlog_rows > max(len(self.running.store), 1_000):  # cheaper to rebuild than to catch up
            self._indexes, self._backlog, self._backlog_rows = None, [], 0

    @property
    def indexes(self) -> CollectiveIndexes:
        """CI-COUNT, CI-SUM and the staircases over the store's panes, for the index and naive plans: rebuilt from
        the store or caught up with the panes applied since their last use, on demand. Built all or not at all: if
        building or catching up fails, they are dropped (the next use rebuilds them from the store), never left
        half-built to answer wrong."""
        try:
            return self._caught_up()
        except BaseException:
            self._indexes, self._backlog, self._backlog_rows = None, [], 0
            raise

    def _caught_up(self) -> CollectiveIndexes:
        if self._indexes is None:
            self._indexes = CollectiveIndexes(self.config.attributes, p=self.config.p, bucket_ms=self.config.pane_ms)
            panes = self.running.store.live
            if len(panes):
                order = np.lexsort((panes.ids, panes.starts))
                panes = panes.take(order)
                first = np.flatnonzero(np.r_[True, (np.diff(panes.starts) != 0) | (np.diff(panes.ids) != 0)])
                names = np.array(self.running.keys.names, dtype=object)[panes.ids[first]]
                self._indexes.add_panes(names.tolist(), panes.starts[first], np.add.reduceat(panes.counts, first),
                                        np.add.reduceat(panes.sums, first, axis=1),
                                        np.minimum.reduceat(panes.mins, first, axis=1),
                                        np.maximum.reduceat(panes.maxs, first, axis=1))
            self._backlog, self._backlog_rows = [], 0
        for rows, late, expire in self._backlog:
            if rows is None:
                self._indexes.expire(expire)
            elif len(rows):
                self._indexes.add_panes(rows.keys.tolist(), rows.starts, rows.counts, rows.sums, rows.mins,
                                        rows.maxs, late=late)
        self._backlog, self._backlog_rows = [], 0
        return self._indexes

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
        self._sync()
        self.admission.start_batch()
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
        if self.admission.waiting:
            self.stale = True  # the next batch's first boundary is evaluated: it admits the next of them
        delta.evaluated_at, delta.applied_until, delta.stale = self.evaluated_at, self.applied_until, self.stale
        delta.lifecycle = self.lifecycle.export()
        delta.admitted, delta.unadmitted = list(self.admission.admitted_now), list(self.admission.dropped_now)
        stats.admitted += len(delta.admitted)
        stats.waiting += len(self.admission.waiting)
        return transitions, delta

    def _next_boundary(self) -> int | None:
        """The first boundary after ``evaluated_at`` at which a transition can happen (None: none known yet)."""
        pane = self.config.pane_ms
        first_pending = int(self.pending.starts.min()) + pane if len(self.pending) else None
        if self.evaluated_at is None:
            return first_pending  # start with the first pane that holds data
        after = self.evaluated_at + pane
        if first_pending == after or (self.stale and (self.starts.size or self.firing)):
            # Stale with no data in the horizon and nothing firing, only a listed key's NO DATA could fire: it
            # waits for the shard's next pane, so that when it fires does not depend on when the clock started
            # (the first watermark) or on a restart from a snapshot
            return after
        candidates = [] if first_pending is None else [first_pending]
        due = self.lifecycle.next_due()  # a lifecycle timer (pending period, keep firing, damping) falls due
        if due is not None:
            candidates.append(due)
        if self.starts.size:  # a pane at s leaves a window of length T at s + T + pane
            for window in self.running.windows:  # the windows in use, and the horizon
                i = int(np.searchsorted(self.starts, self.evaluated_at - window - pane, side="right"))
                if i < self.starts.size:
                    candidates.append(int(self.starts[i]) + window + pane)
        return max(min(candidates), after) if candidates else None

    @property
    def _incremental(self) -> bool:
        return self.config.collective and self.config.plan == "incremental"

    @property
    def _groups(self) -> list[Group]:
        """Every group at once, for the index and naive plans (built when the catalog changed)."""
        if self._groups_cache is None or self._groups_cache[0] != self._catalog.version:
            self._groups_cache = (self._catalog.version, group_subscriptions(self._catalog))
        return self._groups_cache[1]

    def _refresh(self, catalog: Catalog, delta: Delta) -> None:
        """Follow the catalog: its changes since the version seen are applied to the groups one subscription at a
        time (proportional to the change), or every group is rebuilt when they are not all known."""
        if catalog.version == self._groups_version:
            return
        self.stale = True  # new or edited subscriptions are evaluated at the next boundary
        changes = catalog.changes_since(self._groups_version) if self._groups_version is not None else None
        if changes is None:
            self._states, self._of_spec, self._restricted_names = {}, {}, {}
            self._ranks = {}
            for spec in catalog.subscriptions:
                self._upsert(spec)
            self.admission.rebuilt(sid for sid in self._of_spec if sid > 0)
            self._rank_sent = {sid: sent for sid, sent in self._rank_sent.items() if sid in self._ranks}
            active = set(self._of_spec)  # the subscriptions and their internal lifecycle members
            gone = [sid for sid in self.firing if sid not in active]
            gone += [sid for sid in self.lifecycle.sids() if sid not in active and sid not in self.firing]
        else:
            gone = []
            for change in changes:
                for sid in change.removals:
                    self._remove(sid)
                    gone += [sid, aux_id(sid)]
                for spec in change.upserts:
                    self._upsert(spec)
                    gone.append(aux_id(spec.id))  # an edit may have dropped its internal member
            for sid in dict.fromkeys(sid for change in changes for sid in change.removals):
                if sid not in self._of_spec:  # net of the changes: paused and resumed in one catch-up stays admitted
                    self.admission.drop(sid)
            gone = [sid for sid in dict.fromkeys(gone) if sid not in self._of_spec
                    and (sid in self.firing or self.lifecycle.has(sid))]
        self._catalog = catalog
        self._groups_version = catalog.version
        for sid in gone:  # deleted or paused: forget silently
            self._forget(sid)
            delta.dropped_subscriptions.append(sid)
        # every window a group or a rank reads (a key against its own baseline: several); a tuple window (0) has none
        self.running.use([*(ms for state in self._states.values() for ms in state.windows if ms),
                          *(ms for spec in self._ranks.values() for ms in spec.condition.windows)])
        in_use = {_book_key(spec.condition) for spec in self._ranks.values()}
        self._books = {key: book for key, book in self._books.items() if key in in_use}

    def _upsert(self, spec: SubscriptionSpec) -> None:
        sent = self._rank_sent.get(spec.id)
        self._remove(spec.id)
        if spec.condition.rank is not None:  # evaluated at the next boundary, as a new member is
            self._ranks[spec.id] = spec
            self._rank_due.add(spec.id)  # sent at the next boundary even if unchanged: the merge takes its new rank
            if sent is not None:  # edited: the keys that leave what it sent are sent as such
                self._rank_sent[spec.id] = sent
            return
        key = _value_key(spec.condition)
        state = self._states.get(key)
        if state is None:
            state = self._states[key] = GroupState(spec.condition, _order(key))
        state.add(spec)
        self._of_spec[spec.id] = key
        if spec.id > 0:
            self.admission.follow(spec.id)
        for name in spec.keys or ():
            self._restricted_names[name] = self._restricted_names.get(name, 0) + 1
        self._restricted_ids = None
        if spec.id > 0:
            self.lifecycle.follow(spec.id, spec.condition.lifecycle)
            aux = aux_member(spec)
            if aux is not None:
                self._upsert(aux)

    def _remove(self, sid: int) -> None:
        if self._ranks.pop(sid, None) is not None:
            self._rank_sent.pop(sid, None)
            return
        if sid > 0:
            self._remove(aux_id(sid))
        key = self._of_spec.pop(sid, None)
        if key is None:
            return
        state = self._states[key]
        spec = state.everyone.get(sid) or state.restricted.get(sid)
        state.remove(sid)
        if not len(state):
            del self._states[key]
        for name in (spec.keys if spec is not None else None) or ():
            self._restricted_names[name] -= 1
            if not self._restricted_names[name]:
                del self._restricted_names[name]
        self._restricted_ids = None

    def _forget(self, sid: int) -> None:
        if sid > 0:
            self.lifecycle.forget(sid)
        for key in self.firing.pop(sid, ()):
            self._unfire(sid, key)

    def _unfire(self, sid: int, key: str) -> None:
        sids = self._firing_by_key.get(key)
        if sids is not None:
            sids.discard(sid)
            if not sids:
                del self._firing_by_key[key]
                kid = self.running.keys.get(key)
                if kid is not None:
                    self._maybe_free.append(kid)

    def _set_state(self, sid: int, key: str, state: str) -> None:
        """Record one transition (or a replayed one) in the firing sets."""
        if state == "firing":
            self.firing.setdefault(sid, set()).add(key)
            self._firing_by_key.setdefault(key, set()).add(sid)
            return
        keys = self.firing.get(sid)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self.firing[sid]
        self._unfire(sid, key)

    def _known(self) -> set[str]:
        """Keys with a pane in the retention horizon."""
        names = self.running.keys.names
        return {names[k] for k in np.flatnonzero(self.running.known).tolist()}  # type: ignore[misc]  # live ids

    def _expr(self, expr: Expr, window_ms: int, key: str, now: int) -> float | None:
        if isinstance(expr, Term):  # an aggregate, computed as its declaration says, over its own window if any
            return AGGREGATES[expr.aggregate].value_of(self, expr, expr.over(window_ms), key, now)
        if isinstance(expr, Num):
            return expr.value
        left = self._expr(expr.left, window_ms, key, now)
        right = self._expr(expr.right, window_ms, key, now) if left is not None else None
        if left is None or right is None:
            return None
        return combine(expr.op, left, right)

    def value(self, condition: Condition, key: str, now: int) -> float | None:
        """The exact value ``condition`` compares for one key's window ``(now - T, now]`` (or its tuple window)."""
        if condition.events is not None:
            n, horizon = condition.events, self.config.horizon_ms
            return tuple_value(condition, lambda attribute: self.values.last(key, attribute, n, now + 1, horizon))
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
        listed = {key for spec in group.specs for key in spec.keys or () if self.owns(key)}
        if group.loosest is not None and isinstance(group.aggregate, PaneAggregate) and group.template.events is None:
            index = group.aggregate.index(self.indexes, group.template.attribute)
        if index is not None:
            assert group.loosest is not None
            values = {}
            for loosest in group.loosest:  # a union of ranges is the union of range queries
                values.update(index.query(loosest, now))
            empty = group.aggregate.empty if group.aggregate is not None else None
            if empty is not None and any(c.holds(empty) for c in group.loosest):
                # the indexes forget keys with no data in the horizon; a listed one keeps its empty value
                for key in listed - known:
                    values[key] = empty
            return values
        values = {}
        watched = known | listed
        for key in watched:
            value = self.value(group.template, key, now)
            if value is not None and (group.loosest is None or any(c.holds(value) for c in group.loosest)):
                values[key] = value
        return values

    def preview(self, condition: Condition,
                keys: frozenset[str] | None = None) -> tuple[int | None, dict[str, float], int]:
        """Keys whose window satisfies ``condition`` at the last evaluated boundary, with their values:
        ``(boundary, {key: value}, keys watched)``.

        The same answer as a subscription of ``condition`` evaluated there, whatever the plan and whatever the
        values' signs: its values are computed as the incremental plan computes a group's (``values_of`` over the
        running windows' exact aggregates; a window no subscription uses is summed from the store's panes) and
        tested against its ranges as a member's are. Reads only: it builds no index and leaves nothing the next
        batch sees."""
        if condition.rank is not None:
            return self._rank_preview(condition, keys)
        at, watched, values = self._values(condition, keys)
        if at is None:
            return None, {}, 0
        holds = Members([SubscriptionSpec(0, condition, keys)]).holds(np.zeros(values.size, dtype=np.int64), values)
        matched = {watched[i]: float(values[i]) for i in np.flatnonzero(holds).tolist()}
        return at, matched, len(watched)

    def _rank_preview(self, condition: Condition,
                      keys: frozenset[str] | None) -> tuple[int | None, dict[str, float], int]:
        """A rank's preview: this shard's keys in its first ``k`` now (of ``keys``, if given), with their values, and
        how many keys it ranks. The first ``k`` of every shard's answers are the stream's (``evaluator.rank``)."""
        running, at = self.running, self.evaluated_at
        assert condition.rank is not None
        if at is None or running.at is None:
            return None, {}, 0
        ids = np.flatnonzero(running.known)
        windows = {ms: running.window_at(ms) for ms in condition.windows}
        columns = _Columns(running, self.values, self.config.attributes, running.at, windows)
        ranked = [(key, value) for key, value in self._ranked_values(columns, condition, ids) if value is not None]
        first = first_k(ranked, condition.rank)
        return at, {key: value for key, value in first if keys is None or key in keys}, len(ranked)

    def current_values(self, condition: Condition, keys: frozenset[str] | None = None) -> tuple[int | None, dict[str, float]]:
        """Every watched key's value of ``condition`` at the last evaluated boundary, as :meth:`preview` computes it
        (keys without a value left out): what a backtest charts against the threshold. Reads only."""
        at, watched, values = self._values(condition, keys)
        return at, {watched[i]: float(values[i]) for i in np.flatnonzero(~np.isnan(values)).tolist()}

    def _values(self, condition: Condition, keys: frozenset[str] | None) -> tuple[int | None, list[str], np.ndarray]:
        """The last evaluated boundary, the keys watched (every key with data in the horizon, or the listed keys this
        shard owns, with data or not: NO DATA would fire) and their values of ``condition`` (NaN: none)."""
        running, at = self.running, self.evaluated_at
        if at is None or running.at is None:
            return None, [], np.empty(0)
        names = running.keys.names
        if keys is None:  # every key with data in the horizon
            ids, others = np.flatnonzero(running.known), []
        else:  # the listed keys this shard owns, with data or not (NO DATA would fire)
            owned = sorted(k for k in keys if self.owns(k))
            ids = np.array([kid for k in owned if (kid := running.keys.get(k)) is not None], dtype=np.int64)
            others = [k for k in owned if running.keys.get(k) is None]
        windows = {ms: running.window_at(ms) for ms in condition.windows} if condition.events is None else None
        columns = _Columns(running, self.values, self.config.attributes, running.at, windows)
        values = np.concatenate([values_of(columns, condition, ids), np.full(len(others), empty_value(condition))])
        watched = [*(names[k] for k in ids.tolist()), *others]
        return at, watched, values.astype(np.float64)  # type: ignore[return-value]  # watched keys have names

    def _evaluate(self, boundary: int, stats: BatchStats, delta: Delta) -> list[Transition]:
        plan = self.config.plan if self.config.collective else "naive"
        stats.plans[plan] = stats.plans.get(plan, 0) + 1
        if self._ranks:
            self._rank_step(boundary, delta, stats)
        flips = self._flips(boundary, stats) if self._incremental else self._full_flips(boundary, stats)
        flips.sort(key=_key_order)
        transitions = []
        firing, by_key, changes = self.firing, self._firing_by_key, delta.changes
        managed = self.lifecycle.manages if self.lifecycle else None
        flipped: set[tuple[int, str]] = set()  # raw flips of subscriptions with a lifecycle
        for _, sid, state_rank, key, value, window_ms in flips:
            state: State = "firing" if state_rank == 0 else "resolved"
            if managed is not None and managed(sid):
                flipped.add((sid, key))
            else:  # a tuple window (window_ms 0) reports the horizon it looks within
                transitions.append(Transition(alert_id(sid, key, state, boundary), sid, key, state, value,
                                              boundary - (window_ms or self.config.horizon_ms), boundary, boundary))
            changes.append((sid, key, state))
            if state_rank == 0:  # _set_state, inlined: this loop is per transition
                firing.setdefault(sid, set()).add(key)
                by_key.setdefault(key, set()).add(sid)
            else:
                self._set_state(sid, key, state)
        if managed is not None:
            transitions += self._lifecycle_step(boundary, flipped)
        stats.transitions += len(transitions)
        if self._incremental:  # the other plans count their matches as they find them
            stats.matches += sum(map(len, firing.values()))
        self._recycle()
        return transitions

    def _rank_step(self, boundary: int, delta: Delta, stats: BatchStats) -> None:
        """Move the keys whose windows changed in each book, then send each rank subscription's first ``k`` if they
        differ from what it sent last (``ranked``): O(changed log n + k), never every key."""
        running = self.running
        columns = _Columns(running, self.values, self.config.attributes, boundary)
        sent_before = len(self.ranked)
        for key, condition in {_book_key(spec.condition): spec.condition for spec in self._ranks.values()}.items():
            book = self._books.get(key)
            if book is None:  # first needed (a new rank, a restart, a replay): every key with data in the horizon
                book = self._books[key] = RankBook(key[-1])
                ids = np.flatnonzero(running.known)
            else:
                ids = running.take_dirty(condition.windows)
            book.update(self._ranked_values(columns, condition, ids))
            stats.rank_moved += ids.size
        for sid, spec in sorted(self._ranks.items()):
            c, rank = spec.condition, spec.condition.rank
            assert rank is not None  # only rank subscriptions are here
            book = self._books[_book_key(c)]
            first = [(key, value, spec.keys is None or key in spec.keys) for key, value in book.first(rank.k)]
            before = self._rank_sent.get(sid)
            if before == first and sid not in self._rank_due:
                continue
            self._rank_sent[sid] = delta.ranks[sid] = first
            start = boundary - c.window_ms
            self.ranked += [RankEntry(0, sid, boundary, start, key, value, listed, rank) for key, value, listed in first]
            if not first:
                self.ranked.append(RankEntry(0, sid, boundary, start, EMPTY_KEY, 0.0, False, rank))
            now = {key for key, _, _ in first}
            self.ranked += [RankEntry(0, sid, boundary, start, key, book.value(key), listed, rank, out=True)
                            for key, _, listed in before or () if key not in now]
        self._rank_due.clear()
        stats.rank_sent += len(self.ranked) - sent_before

    def _ranked_values(self, columns: _Columns, condition: Condition,
                       ids: np.ndarray) -> list[tuple[str, float | None]]:
        """Keys ``ids`` with their values of ``condition``; None for a key with no event in the window or no value."""
        if not ids.size:
            return []
        values = values_of(columns, condition, ids)
        counts = columns.count(condition.window_ms, ids)
        names = self.running.keys.names
        return [(names[kid], None if count == 0 or value != value else float(value))
                for kid, value, count in zip(ids.tolist(), values.tolist(), counts.tolist(), strict=True)]

    def take_ranked(self) -> list[RankEntry]:
        """The rank entries of the batch (the shard id 0: the adapter stamps its own)."""
        ranked, self.ranked = self.ranked, []
        return ranked

    def _lifecycle_step(self, boundary: int, flipped: set[tuple[int, str]]) -> list[Transition]:
        """The transitions of the subscriptions with a lifecycle: from their raw flips and the timers due."""
        out = []
        for sid, key, state, kind in self.lifecycle.step(boundary, Raw(self.firing, flipped), self._lifecycle_of):
            spec = self._spec(sid)
            assert spec is not None  # the tracker forgets removed subscriptions
            c = spec.condition
            start = boundary - (c.window_ms or self.config.horizon_ms)  # a tuple window: the horizon it looks within
            out.append(Transition(alert_id(sid, key, state, boundary), sid, key, state,  # type: ignore[arg-type]
                                  self._value_now(c, key, boundary), start, boundary, boundary, kind))
        return out

    def _spec(self, sid: int) -> SubscriptionSpec | None:
        key = self._of_spec.get(sid)
        if key is None:
            return None
        state = self._states[key]
        return state.everyone.get(sid) or state.restricted.get(sid)

    def _lifecycle_of(self, sid: int):  # noqa: ANN202
        spec = self._spec(sid)
        return spec.condition.lifecycle if spec is not None else None

    def _value_now(self, condition: Condition, key: str, boundary: int) -> float | None:
        """``condition``'s value for ``key`` at ``boundary`` from the running windows (a timer has no flip to carry
        it): one key's columns, whatever the plan."""
        kid = self.running.keys.get(key)
        if kid is None:
            value = empty_value(condition)
        else:
            columns = _Columns(self.running, self.values, self.config.attributes, boundary)
            value = float(values_of(columns, condition, np.array([kid], dtype=np.int64))[0])
        return None if value != value else value

    def _restricted_mask(self) -> np.ndarray:
        """Per key id: named by some key-restricted subscription (cached until the catalog or the key table change)."""
        version = (id(self._restricted_names), len(self._restricted_names), self.running.keys.version)
        if self._restricted_ids is None or self._restricted_ids[0] != version:
            mask = np.zeros(self.running.keys.capacity, dtype=bool)
            ids = self.running.keys.ids
            mask[[k for name in self._restricted_names if (k := ids.get(name)) is not None]] = True
            self._restricted_ids = (version, mask)
        return self._restricted_ids[1]

    def _flips(self, boundary: int, stats: BatchStats) -> list[Flip]:
        """The incremental plan: per group, the keys whose windows changed, and the members they cross."""
        running = self.running
        capacity = running.keys.capacity
        if self._known_before.size < capacity:
            self._known_before = np.concatenate([self._known_before,
                                                 np.zeros(capacity - self._known_before.size, dtype=bool)])
        ctx = Context(_Columns(running, self.values, self.config.attributes, boundary), running.known,
                      self._known_before, self._trusted, running.keys.names, running.keys.ids, self.firing,
                      self._firing_by_key, self._restricted_mask(), self.costs, self.owns, admission=self.admission,
                      key_version=running.keys.version)
        flips: list[Flip] = []
        states: Iterable[GroupState] = self._states.values()
        if self.admission.waiting:  # admitted in the groups' order: the same whatever order they were built in
            states = sorted(states, key=lambda state: state.order)
        for state in states:
            flips += state.evaluate(ctx, running.take_dirty(state.windows))
        stats.changed_keys += ctx.work["changed"]
        stats.candidates += ctx.work["candidates"]
        stats.explicit_keys += ctx.work["explicit"]
        stats.full_members += ctx.work["full"]
        stats.scans += ctx.work["scans"]
        self._known_before = running.known.copy()
        self._trusted = True
        self._maybe_free += running.clear_dirty().tolist()
        return flips

    def _recycle(self) -> None:
        """Release the ids of keys with no pane in the horizon that fire for nobody: memory follows active keys."""
        candidates = np.unique(np.array(self._maybe_free, dtype=np.int64))
        self._maybe_free = []
        if not candidates.size:
            return
        names = self.running.keys.names
        known = self.running.known
        free = [k for k in candidates[~known[candidates]].tolist()
                if (name := names[k]) is not None and name not in self._firing_by_key]
        if not free:
            return
        ids = np.array(free, dtype=np.int64)
        self.running.reset_ids(ids)
        for state in self._states.values():
            if state.values is not None:
                state.values[ids[ids < state.values.size]] = state.empty
        self._known_before[ids[ids < self._known_before.size]] = False
        self.running.keys.release(free)
        self._restricted_ids = None

    def _full_flips(self, boundary: int, stats: BatchStats) -> list[Flip]:
        """The index plan (every group by collective index lookups) or naive (every subscription on every key)."""
        now = boundary - 1  # panes starting in [b - T, b) are the elements stamped in (b - 1 - T, b - 1]
        known = self._known()
        flips: list[Flip] = []
        values: dict[str, float] | None = None  # the candidates' exact values (collective), reused by transitions
        for group in self._groups:
            order = _order(_value_key(group.template))
            if self.config.collective:
                values = self._candidate_values(group, now, known)
                stats.candidates += len(values)
                keys = np.array(list(values), dtype=object)
                sorted_values = np.fromiter(values.values(), dtype=np.float64, count=len(values))
                ordering = np.argsort(sorted_values, kind="stable")
                keys, sorted_values = keys[ordering], sorted_values[ordering]
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
                    # a listed key is always watched, any other while it has data in the horizon
                    matched &= known if spec.keys is None else {k for k in spec.keys if self.owns(k)}
                else:
                    matched = set()
                    # a key is watched while it has data in the horizon, a listed key always
                    for key in known if spec.keys is None else [k for k in spec.keys if self.owns(k)]:
                        stats.candidates += 1
                        if c.holds(self.value(c, key, now)):
                            matched.add(key)
                    values = None
                stats.matches += len(matched)
                for key in matched - was:
                    value = values.get(key) if values is not None else None
                    flips.append((order, spec.id, 0, key, self.value(c, key, now) if value is None else value,
                                  c.window_ms))
                for key in was - matched:
                    flips.append((order, spec.id, 1, key, self.value(c, key, now), c.window_ms))
        self._trusted = False  # the incremental state was not kept up to date
        self._maybe_free += self.running.clear_dirty().tolist()
        return flips

    def held_rows(self, keep: Callable[[str], bool]) -> PaneRows:
        """The pane rows this shard holds for the keys ``keep`` admits: the store's panes (with the retained events
        of their panes) and the pending ones. Fed to a fresh shard with the same progress and brought to the same
        clock, they give it the windows and retained events this one has for those keys (a view's warm-up,
        ``evaluator.substreams``)."""
        n = len(self.config.attributes)
        live = self.running.store.live
        names = np.array(self.running.keys.names, dtype=object)
        ids = np.unique(live.ids)
        admitted = np.zeros(max(len(names), 1), dtype=bool)
        admitted[ids] = np.fromiter((keep(names[i]) for i in ids.tolist()), dtype=bool, count=ids.size)
        panes = live.take(np.flatnonzero(admitted[live.ids]))
        keys = names[panes.ids]
        # Events join the first stored row of their (key, pane); older ones (kept for LAST beyond the horizon)
        # are in no window still to come and are left out.
        pane = self.config.pane_ms
        event_keys, event_ts, event_values = [], [], []
        for key, events in self.values.keys.items():
            if keep(key):
                ts, vals = events.live()
                event_keys.append(np.full(ts.size, key, dtype=object))
                event_ts.append(ts)
                event_values.append(vals)
        rows = PaneRows(keys, panes.starts, panes.counts, panes.sums, panes.mins, panes.maxs,
                        np.zeros(len(panes) + 1, dtype=np.int64), np.empty(0, dtype=np.int64),
                        np.empty((n, 0), dtype=np.float64))
        if event_ts and len(panes):
            row_index = pd.MultiIndex.from_arrays([keys, panes.starts])
            first = np.flatnonzero(~row_index.duplicated())
            ts = np.concatenate(event_ts)
            where = pd.MultiIndex.from_arrays([np.concatenate(event_keys), (ts // pane) * pane])
            owner = np.full(ts.size, -1, dtype=np.int64)
            found = row_index[first].get_indexer(where)
            owner[found >= 0] = first[found[found >= 0]]
            kept = np.flatnonzero(owner >= 0)
            order = kept[np.lexsort((ts[kept], owner[kept]))]
            offsets = np.zeros(len(panes) + 1, dtype=np.int64)
            np.cumsum(np.bincount(owner[order], minlength=len(panes)), out=offsets[1:])
            rows = PaneRows(keys, panes.starts, panes.counts, panes.sums, panes.mins, panes.maxs, offsets, ts[order],
                            np.concatenate(event_values, axis=1)[:, order])
        pending = self.pending
        if len(pending):
            mask = np.fromiter((keep(k) for k in pending.keys.tolist()), dtype=bool, count=len(pending))
            pending = pending.select(mask)
        return PaneRows.concat([rows, pending], n)

    # -- catching up and persisting -------------------------------------------------------------------

    def replay(self, delta: Delta) -> None:
        """Apply a batch another copy of this shard processed, without evaluating again: array appends, and the
        firing sets; the values this copy holds are then checked against the firing sets at its next evaluation."""
        stats = BatchStats()
        self.ingest(delta.rows, delta.progress, stats)
        if stats.late_events:
            # The copy that evaluated may not have evaluated since this late row (a batch whose watermark did not
            # move): its values do not hold it yet, so _sync must not count it as seen. Every key it touched is
            # then decided against the firing sets at the next evaluation.
            self._trusted = False
        if delta.applied_until is not None and delta.applied_until != self.applied_until:
            self._apply_until(delta.applied_until)
        self.evaluated_at = delta.evaluated_at
        self.stale = delta.stale
        for sid in delta.dropped_subscriptions:
            self._forget(sid)
        for sid, key, state in delta.changes:
            self._set_state(sid, key, state)
        self.lifecycle.apply(delta.lifecycle)
        self.admission.replayed(delta.admitted, delta.unadmitted)
        self._unsynced = True
        self._books = {}  # the windows moved without them: rebuilt when next needed
        self._rank_sent.update(delta.ranks)

    def _sync(self) -> None:
        """After replays: bring each group's values to the last evaluated boundary for the keys that changed, so
        they agree with the replayed firing sets again (the same arrays the copy that evaluated holds). Done once,
        before the next rows arrive (a late row would otherwise count as already seen)."""
        if not self._unsynced:
            return
        self._unsynced = False
        running = self.running
        if not self._incremental or self.evaluated_at is None or not self._trusted:
            return
        if running.at != self.evaluated_at:  # the windows are not those of the last evaluation: check every change
            self._trusted = False
            return
        columns = _Columns(running, self.values, self.config.attributes, self.evaluated_at)
        capacity = running.keys.capacity
        for state in self._states.values():
            if state.values is None:
                continue
            if state.values.size < capacity:
                state.values = np.concatenate([state.values, np.full(capacity - state.values.size, state.empty)])
            ids = running.take_dirty(state.windows)
            state.values[ids] = values_of(columns, state.template, ids)
        self._known_before = running.known.copy()
        self._maybe_free += running.clear_dirty().tolist()

    def snapshot(self) -> bytes:
        parts = self.running.to_parts()
        meta = {"progress": self.progress, "evaluated_at": self.evaluated_at, "applied_until": self.applied_until,
                "firing": {sid: sorted(keys) for sid, keys in self.firing.items()}, "stale": self.stale,
                "lifecycle": self.lifecycle.to_json(), **({"rank_sent": self._rank_sent} if self._rank_sent else {}),
                "admitted": self.admission.to_json()}
        parts += [self.values.to_bytes(), self.pending.to_bytes(), json.dumps(meta).encode()]
        return join_parts(parts)

    @classmethod
    def from_snapshot(cls, config: ShardConfig, blob: bytes) -> ShardEvaluator:
        parts = split_parts(blob)
        shard = cls(config)
        shard.running = RunningWindows.from_parts(len(config.attributes), config.horizon_ms, parts[:-3], config.block_ms)
        shard.values = KeyValues.from_bytes(parts[-3], config.attributes, config.value_retention_ms,
                                            config.tuple_max_events)
        shard.pending = PaneRows.from_bytes(parts[-2]).by_start()  # written unsorted before pending was kept so
        meta = json.loads(parts[-1])
        shard.progress = {int(p): ts for p, ts in meta["progress"].items()}
        shard.evaluated_at, shard.applied_until = meta["evaluated_at"], meta["applied_until"]
        for sid, keys in meta["firing"].items():
            for key in keys:
                shard._set_state(int(sid), key, "firing")
        shard.stale = meta.get("stale", True)
        shard.lifecycle.apply(meta.get("lifecycle"))
        shard._rank_sent = _rank_lists(meta.get("rank_sent", {}))
        shard.admission.restore(meta.get("admitted"))
        shard.starts = np.unique(shard.running.store.live.starts)
        shard._trusted = False
        return shard
