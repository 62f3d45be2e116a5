"""A stream's shard with every view its subscriptions ask for: one :class:`ShardEvaluator` per view.

A condition is over its view's events (``evaluator.views``): dimension filters, a key prefix,
the optional attributes it names. Each view in use gets its own evaluator, fed the batch's
rows of the view's cells with the cell reduced to the key, holding the subscriptions on that
view; so a filtered subscription aggregates exactly the events that pass its filter, with every
plan, index and lifecycle the shard has, and subscriptions on different views never share a
group. Transitions come base first, then view by view in view order.

Layouts. ``trades`` (``cells=False``): the base evaluator is fed the plain rows and holds the
whole-stream subscriptions, exactly as before views (so its state and alert ids are unchanged);
a key-prefix view gets its own evaluator. A declared stream (``cells=True``): the parser writes
cell rows (``evaluator.views``); the base evaluator is fed them and holds no subscription: it
is the store every view, the whole stream included, is warmed from.

Warm-up. A view first asked for (a new subscription, an edited filter) gets a fresh evaluator
fed the base's held rows of the view's cells (``ShardEvaluator.held_rows``) and the base's
progress, brought to the base's clock with no subscription, hence no transition. It then holds
the windows and retained events an evaluator fed the view's rows all along would hold, and its
subscriptions are first evaluated at the next boundary, like a new subscription on a view in
use (tests/evaluator/test_substreams.py checks both against such an evaluator, with hypothesis).
A view whose last subscription went is dropped after the batch that removed it (it forgets its
firing pairs silently, as a deleted subscription does).

Persistence. A delta is the base's and each view's, plus the views created and dropped; a
snapshot the base's and each view's. When there is nothing but the base (``trades`` without a
key-prefix subscription), both are the base's own bytes, as written before views, so an existing
checkpoint reads on. Restoring widens every part to the query's attributes (``evaluator.evolution``).

Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field

from evaluator.catalog import Catalog, CatalogChange
from evaluator.evolution import widened_delta, widened_snapshot
from evaluator.panerows import PaneRows
from evaluator.rank import RankEntry
from evaluator.shard import BatchStats, Delta, ShardConfig, ShardEvaluator, join_parts, split_parts
from evaluator.spec import Condition, SubscriptionSpec
from evaluator.transition import Transition
from evaluator.views import Cells, View, rows_in

#: Starts a delta or snapshot with views. A base-only one starts with a 4-byte count or length, never all ones.
MAGIC = b"\xff\xff\xff\xffviews1"


def _order(view: View) -> str:
    return view.order


def _everything(key: str) -> bool:  # noqa: ARG001  # a lone shard owns every key
    return True


@dataclass
class ViewShares:
    """Each view's share of a stream's catalog, with the whole catalog's versions, following its changes (a
    change to another view's subscription is a no-op removal), as ``evaluator.streams.StreamCatalogs`` does for
    streams. A view left with no subscription keeps an empty share for one split, then is forgotten."""

    view_of: Callable[[SubscriptionSpec], View]
    keep: int = 1_000
    version: int | None = None
    shares: dict[View, Catalog] = field(default_factory=dict)

    def split(self, whole: Catalog) -> dict[View, Catalog]:
        if whole.version == self.version:
            return self.shares
        changes = whole.changes_since(self.version) if self.version is not None else None
        held = {v: c for v, c in self.shares.items() if c.subscriptions}
        if changes is None:
            by: dict[View, list[SubscriptionSpec]] = {}
            for spec in whole.subscriptions:
                by.setdefault(self.view_of(spec), []).append(spec)
            self.shares = {v: Catalog(whole.version) for v in held} | {
                v: Catalog(whole.version, specs) for v, specs in by.items()}
        else:
            self.shares = held
            for change in changes:
                views = [self.view_of(s) for s in change.upserts]
                for view in views:
                    if view not in self.shares:
                        self.shares[view] = Catalog(change.version - 1)
                for view, share in list(self.shares.items()):
                    kept = tuple(s for s, v in zip(change.upserts, views, strict=True) if v == view)
                    moved = tuple(s.id for s, v in zip(change.upserts, views, strict=True) if v != view)
                    self.shares[view] = share.applied(CatalogChange(change.version, kept, (*change.removals, *moved)),
                                                      self.keep)
        self.version = whole.version
        return self.shares


@dataclass
class SubstreamDelta:
    """What one batch changed in a :class:`SubstreamShard`: the base's delta, each view's, the views created
    (warmed up before the batch) and dropped (after it)."""

    base: Delta
    views: dict[View, Delta] = field(default_factory=dict)
    created: list[View] = field(default_factory=list)
    dropped: list[View] = field(default_factory=list)
    cells: bool = False  # the shard's layout: a declared stream's always writes the framed form
    legacy: bool = False  # read from a base-only delta

    def to_bytes(self) -> bytes:
        if not self.cells and not self.views and not self.created and not self.dropped:
            return self.base.to_bytes()  # trades without views: as written before views
        order = list(self.views)
        meta = {"views": [v.to_json() for v in order], "created": [v.to_json() for v in self.created],
                "dropped": [v.to_json() for v in self.dropped]}
        return MAGIC + join_parts([json.dumps(meta).encode(), self.base.to_bytes(),
                                   *(self.views[v].to_bytes() for v in order)])

    @classmethod
    def from_bytes(cls, blob: bytes, width: int) -> SubstreamDelta:
        """Read, widened to ``width`` attributes."""
        if not blob.startswith(MAGIC):
            return cls(widened_delta(Delta.from_bytes(blob), width), legacy=True)
        meta, base, *views = split_parts(blob[len(MAGIC):])
        data = json.loads(meta)
        order = [View.from_json(v) for v in data["views"]]
        return cls(widened_delta(Delta.from_bytes(base), width),
                   {v: widened_delta(Delta.from_bytes(d), width) for v, d in zip(order, views, strict=True)},
                   [View.from_json(v) for v in data["created"]], [View.from_json(v) for v in data["dropped"]])


class SubstreamShard:
    """One shard of a stream: the base evaluator and one evaluator per view in use (see the module doc)."""

    def __init__(self, config: ShardConfig, optional: frozenset[str] = frozenset(), cells: bool = False) -> None:
        self.config = config
        self.optional = optional
        self.cells = cells
        self.base = ShardEvaluator(config)
        self.views: dict[View, ShardEvaluator] = {}
        self._shares = ViewShares(self.view_of)
        self._owns: Callable[[str], bool] = _everything
        self.epoch = 0  # the adapter's batch number this state corresponds to

    def view_of(self, spec: SubscriptionSpec) -> View:
        return View.of(spec.condition, self.optional)

    @property
    def owns(self) -> Callable[[str], bool]:
        return self._owns

    @owns.setter
    def owns(self, owns: Callable[[str], bool]) -> None:
        self._owns = owns
        for evaluator in (self.base, *self.views.values()):
            evaluator.owns = owns

    @property
    def evaluated_at(self) -> int | None:
        return self.base.evaluated_at

    def _in_base(self, view: View) -> bool:
        return view.whole and not self.cells

    def _warmed(self, view: View) -> ShardEvaluator:
        """A new evaluator of ``view`` holding what the base holds of it, at the base's clock (no subscription)."""
        evaluator = ShardEvaluator(self.config)
        evaluator.owns = self._owns
        evaluator.ingest(rows_in(self.base.held_rows(view.admits), view), dict(self.base.progress))
        evaluator.advance(Catalog.empty())
        return evaluator

    def step(self, rows: PaneRows, progress: dict[int, int], catalog: Catalog,
             stats: BatchStats | None = None) -> tuple[list[Transition], SubstreamDelta]:
        """One micro-batch: views new in ``catalog`` are warmed up, then the base and every view take the batch."""
        stats = stats or BatchStats()
        shares = self._shares.split(catalog)
        created = [v for v in sorted(shares, key=_order) if shares[v].subscriptions and not self._in_base(v)
                   and v not in self.views]
        for view in created:
            self.views[view] = self._warmed(view)
        self.views = dict(sorted(self.views.items(), key=lambda item: item[0].order))
        nothing = Catalog(catalog.version)
        transitions, base = self.base.step(rows, progress,
                                           Catalog.empty() if self.cells else shares.get(View(), nothing), stats)
        delta = SubstreamDelta(base, created=created, cells=self.cells)
        cells = Cells.of(rows) if self.views and len(rows) else None  # the batch's cells, found once for every view
        for view, evaluator in self.views.items():
            more, delta.views[view] = evaluator.step(rows_in(rows, view, cells), progress, shares.get(view, nothing),
                                                     stats)
            transitions += more
        delta.dropped = [v for v, e in self.views.items() if not shares.get(v, nothing).subscriptions and not e.firing]
        for view in delta.dropped:
            del self.views[view]
        return transitions, delta

    def waiting(self) -> frozenset[int]:
        """The subscriptions this shard has not admitted yet (``evaluator.admission``), over every view."""
        return frozenset(sid for evaluator in (self.base, *self.views.values())
                         for sid in evaluator.admission.waiting if sid > 0)

    def take_ranked(self) -> list[RankEntry]:
        """The batch's rank entries (evaluator/rank.py), base first, then view by view."""
        return [entry for evaluator in (self.base, *self.views.values()) for entry in evaluator.take_ranked()]

    def replay(self, delta: SubstreamDelta) -> None:
        """Apply a batch another copy processed, in the order it did (views are warmed from the same base)."""
        if delta.legacy and self.cells:  # written before views: the whole stream's evaluator was the only one
            whole = self.views.setdefault(View(), ShardEvaluator(self.config))
            whole.owns = self._owns
            whole.replay(delta.base)
            self.base.replay(dataclasses.replace(delta.base, changes=[], dropped_subscriptions=[], lifecycle=None))
            return
        for view in delta.created:
            self.views[view] = self._warmed(view)
        self.views = dict(sorted(self.views.items(), key=lambda item: item[0].order))
        self.base.replay(delta.base)
        for view, view_delta in delta.views.items():
            self.views[view].replay(view_delta)
        for view in delta.dropped:
            self.views.pop(view, None)

    def preview(self, condition: Condition,
                keys: frozenset[str] | None = None) -> tuple[int | None, dict[str, float], int]:
        """``ShardEvaluator.preview`` on the condition's view (warmed up for the preview when none is in use)."""
        view = View.of(condition, self.optional)
        if self._in_base(view):
            return self.base.preview(condition, keys)
        evaluator = self.views.get(view) or self._warmed(view)
        return evaluator.preview(condition, keys)

    def current_values(self, condition: Condition, keys: frozenset[str] | None = None) -> tuple[int | None, dict[str, float]]:
        """``ShardEvaluator.current_values`` on the condition's view (warmed up for the call when none is in use)."""
        view = View.of(condition, self.optional)
        if self._in_base(view):
            return self.base.current_values(condition, keys)
        evaluator = self.views.get(view) or self._warmed(view)
        return evaluator.current_values(condition, keys)

    def snapshot(self) -> bytes:
        if not self.cells and not self.views:
            return self.base.snapshot()
        meta = {"cells": self.cells, "views": [v.to_json() for v in self.views]}
        return MAGIC + join_parts([json.dumps(meta).encode(), self.base.snapshot(),
                                   *(e.snapshot() for e in self.views.values())])

    @classmethod
    def from_snapshot(cls, config: ShardConfig, blob: bytes, optional: frozenset[str] = frozenset(),
                      cells: bool = False) -> SubstreamShard:
        """Restored, widened to the config's attributes."""
        width = len(config.attributes)
        shard = cls(config, optional, cells)

        def restored(part: bytes) -> ShardEvaluator:
            return ShardEvaluator.from_snapshot(config, widened_snapshot(part, width))

        if not blob.startswith(MAGIC):
            legacy = restored(blob)
            if cells:  # written before views: the whole stream's evaluator was the only one
                shard.views[View()] = legacy
                shard.base.progress = dict(legacy.progress)
            else:
                shard.base = legacy
            return shard
        meta, base, *views = split_parts(blob[len(MAGIC):])
        data = json.loads(meta)
        shard.base = restored(base)
        shard.views = {View.from_json(v): restored(p) for v, p in zip(data["views"], views, strict=True)}
        return shard
