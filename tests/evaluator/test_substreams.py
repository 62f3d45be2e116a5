"""Views (dimension filters, key prefixes, optional attributes) against an oracle: per view, a plain shard
evaluator fed only that view's events from the start. Subscriptions come and go while events flow, so views are
created (warmed up from the base's cells), used and dropped; a copy following the deltas and snapshots of the
first takes over and must go on exactly as it does."""

from __future__ import annotations

import zlib
from collections import defaultdict

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evaluator.catalog import Catalog, CatalogChange
from evaluator.panerows import PaneRows
from evaluator.shard import ShardConfig, ShardEvaluator
from evaluator.spec import Aggregate, Condition, SubscriptionSpec
from evaluator.substreams import SubstreamDelta, SubstreamShard
from evaluator.transition import Transition
from evaluator.views import View, cell_suffix, rows_in, split_cell
from tests.examples import examples

ATTRS = ("v", "w")  # w is optional
OPTIONAL = frozenset({"w"})
PANE, HORIZON, PARTITIONS = 1_000, 8_000, 2
CONFIG = ShardConfig(ATTRS, PANE, HORIZON, 0, PARTITIONS, value_retention_ms=4_000)
KEYS = ("a1", "a2", "b1")

Event = tuple[str, int, str | None, float, float | None]  # key, ts, dimension d, v, w (None: missing)


def partition_of(key: str) -> int:
    return zlib.crc32(key.encode()) % PARTITIONS


def cell_rows(events: list[Event]) -> PaneRows:
    """What the stream parser emits: one row per (cell, pane); a missing w is 0 in every column."""
    if not events:
        return PaneRows.empty(len(ATTRS))
    panes: dict[tuple[str, int], list[tuple[int, float, float]]] = defaultdict(list)
    for key, ts, d, v, w in events:
        cell = key + cell_suffix({"d": d} if d is not None else {}, ["w"] if w is not None else [])
        panes[(cell, ts // PANE * PANE)].append((ts, v, 0.0 if w is None else w))
    values = [np.array(p, dtype=np.float64).T[1:] for p in panes.values()]
    keys, starts = zip(*panes, strict=True)
    return PaneRows(
        np.array(keys, dtype=object), np.array(starts, dtype=np.int64),
        np.array([x.shape[1] for x in values], dtype=np.int64),
        np.array([x.sum(axis=1) for x in values]).T, np.array([x.min(axis=1) for x in values]).T,
        np.array([x.max(axis=1) for x in values]).T,
        np.cumsum([0] + [x.shape[1] for x in values]).astype(np.int64),
        np.array([e[0] for p in panes.values() for e in p], dtype=np.int64), np.concatenate(values, axis=1))


def progress_of(events: list[Event], before: dict[int, int]) -> dict[int, int]:
    progress = dict(before)
    for key, ts, *_ in events:
        p = partition_of(key)
        progress[p] = max(progress.get(p, ts), ts)
    return progress


AGGREGATES = [("SUM", "v"), ("SUM", "w"), ("COUNT", None), ("AVG", "w"), ("MIN", "w"), ("MAX", "v"), ("LAST", "w"),
              ("AVG", "v")]
conditions = st.builds(
    lambda aggregate, panes, threshold, above, where, prefix: Condition(
        Aggregate(aggregate[0]), aggregate[1], panes * PANE, low=threshold if above else None,
        high=None if above else threshold, where=where, key_prefix=prefix),
    st.sampled_from(AGGREGATES), st.sampled_from([2, 4]), st.integers(0, 12), st.booleans(),
    st.sampled_from([(), (("d", ("x",)),), (("d", ("x", "y")),), (("d", ("y",)),)]),
    st.sampled_from([None, "a", "a2"]))
events = st.lists(st.tuples(st.sampled_from(KEYS), st.integers(0, 16_000), st.sampled_from([None, "x", "y"]),
                            st.integers(0, 6).map(float), st.one_of(st.none(), st.integers(0, 6).map(float))),
                  min_size=10, max_size=120)
# Each subscription: its condition, keys (None: every key), the batch it is added at and the batch it goes at.
subscriptions = st.lists(st.tuples(conditions, st.sampled_from([None, frozenset({"a1", "b1"})]),
                                   st.integers(0, 3), st.integers(1, 8)), min_size=1, max_size=6)


def catalogs(subs: list, batches: int) -> list[Catalog]:
    """The catalog each batch sees: subscription i is present in batches [added, added + lasts)."""
    out, catalog = [], Catalog.empty()
    for b in range(batches):
        upserts = tuple(SubscriptionSpec(i + 1, c, keys) for i, (c, keys, added, _) in enumerate(subs) if added == b)
        removals = tuple(i + 1 for i, (_, _, added, lasts) in enumerate(subs) if added + lasts == b)
        if upserts or removals:
            catalog = catalog.applied(CatalogChange(catalog.version + 1, upserts, removals))
        out.append(catalog)
    return out


def in_view(view: View, event: Event) -> bool:
    key, _, d, _, w = event
    return ((view.key_prefix is None or key.startswith(view.key_prefix))
            and all(d in values for dim, values in view.where if dim == "d")
            and (w is not None or "w" not in view.present))


def oracle(batches: list[list[Event]], catalogs_: list[Catalog], views: list[View]) -> list[list[Transition]]:
    """Per view, a plain evaluator fed that view's events from the start, with the view's subscriptions."""
    evaluators = {v: ShardEvaluator(CONFIG) for v in views}
    out: list[list[Transition]] = []
    progress: dict[int, int] = {}
    for batch, catalog in zip(batches, catalogs_, strict=True):
        progress = progress_of(batch, progress)
        found: list[Transition] = []
        for view, evaluator in evaluators.items():
            share = Catalog(catalog.version, [s for s in catalog.subscriptions
                                              if View.of(s.condition, OPTIONAL) == view])
            rows = rows_in(cell_rows([e for e in batch if in_view(view, e)]), View())
            found += evaluator.step(rows, progress, share)[0]
        out.append(found)
    return out


def _key(t: Transition) -> tuple:
    return t.subscription_id, t.key, t.state, t.evaluated_at, t.value, t.alert_id


def split(stream: list[Event], size: int = 6) -> list[list[Event]]:
    ordered = sorted(stream, key=lambda e: e[1] + (e[0] == "b1") * 1_500)  # some disorder: b1 arrives late
    return [ordered[i : i + size] for i in range(0, len(ordered), size)] + [[("a1", 40_000, None, 0.0, None)]]


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=events, subs=subscriptions)
def test_every_view_alerts_as_an_evaluator_fed_only_its_events(stream: list[Event], subs: list) -> None:
    batches = split(stream)
    catalogs_ = catalogs(subs, len(batches))
    views = sorted({View.of(c, OPTIONAL) for c, *_ in subs}, key=lambda v: v.order)
    expected = oracle(batches, catalogs_, views)
    shard = SubstreamShard(CONFIG, OPTIONAL, cells=True)
    progress: dict[int, int] = {}
    for batch, catalog, want in zip(batches, catalogs_, expected, strict=True):
        progress = progress_of(batch, progress)
        got, _ = shard.step(cell_rows(batch), progress, catalog)
        assert sorted(map(_key, got)) == sorted(map(_key, want))
    assert set(shard.views) <= {View.of(s.condition, OPTIONAL) for s in catalogs_[-1].subscriptions}


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=events, subs=subscriptions, cells=st.booleans(), snapshot_every=st.integers(1, 4))
def test_a_copy_following_deltas_and_snapshots_goes_on_as_the_first(stream: list[Event], subs: list, cells: bool,
                                                                    snapshot_every: int) -> None:
    if not cells:  # trades: plain keys, no dimension nor optional attribute; views are key prefixes
        stream = [(k, ts, None, v, None) for k, ts, _, v, _ in stream]
        subs = [(Condition(c.aggregate, c.attribute if c.attribute != "w" else "v", c.window_ms, c.low, c.high,
                           key_prefix=c.key_prefix), keys, added, lasts) for c, keys, added, lasts in subs]
    batches = split(stream)
    catalogs_ = catalogs(subs, len(batches))
    optional = OPTIONAL if cells else frozenset()
    first, copy = SubstreamShard(CONFIG, optional, cells), SubstreamShard(CONFIG, optional, cells)
    progress: dict[int, int] = {}
    half = len(batches) // 2
    for i, (batch, catalog) in enumerate(zip(batches, catalogs_, strict=True)):
        progress = progress_of(batch, progress)
        got, delta = first.step(cell_rows(batch), progress, catalog)
        if i < half:  # the copy follows: the change log, and now and then a snapshot
            if i % snapshot_every == 0:
                copy = SubstreamShard.from_snapshot(CONFIG, first.snapshot(), optional, cells)
            else:
                copy.replay(SubstreamDelta.from_bytes(delta.to_bytes(), len(ATTRS)))
        else:  # then takes over
            taken, _ = copy.step(cell_rows(batch), progress, catalog)
            assert list(map(_key, taken)) == list(map(_key, got))
    if not cells and not first.views:  # base only: the bytes written before views
        assert first.snapshot() == first.base.snapshot()


def fired_on_a_new_view(early: list[Event], asked: Condition) -> list[tuple]:
    """``early`` stored (both partitions report: the panes before 2 s are in the store), then ``asked`` subscribed
    to (its view is new) and evaluated at the next batch: what fires, as (key, state, value)."""
    shard = SubstreamShard(CONFIG, OPTIONAL, cells=True)
    shard.step(cell_rows(early), progress_of(early, {}), Catalog.empty())
    assert shard.base.evaluated_at == 2_000
    catalog = Catalog.empty().applied(CatalogChange(1, (SubscriptionSpec(1, asked),)))
    tick = [("b1", 3_000, "y", 0.0, None), ("a1", 3_000, None, 0.0, None)]
    fired, _ = shard.step(cell_rows(tick), progress_of(tick, progress_of(early, {})), catalog)
    return [(t.key, t.state, t.value) for t in fired]


def test_a_view_new_to_the_shard_sees_the_events_it_filters_from_before_it_was_asked_for() -> None:
    """A subscription on a new view fires on its first evaluation from events that arrived before it existed."""
    early = [("a1", 1_000, "x", 5.0, 3.0), ("a1", 1_200, "y", 5.0, None), ("b1", 1_500, "x", 1.0, 4.0),
             ("b1", 2_500, "y", 0.0, None), ("a1", 2_500, "y", 0.0, None)]
    asked = Condition(Aggregate.SUM, "v", 4 * PANE, low=4.0, where=(("d", ("x",)),))
    assert fired_on_a_new_view(early, asked) == [("a1", "firing", 5.0)]  # the y event is not in its view


def test_a_new_view_has_the_retained_events_of_its_cells_for_last() -> None:
    """LAST needs the events themselves: a new view's warm-up brings its cells' retained events along."""
    early = [("a1", 1_000, "x", 1.0, 3.0), ("a1", 1_100, "y", 1.0, 9.0), ("a1", 1_200, "x", 1.0, None),
             ("b1", 2_500, "y", 1.0, None), ("a1", 2_500, "y", 1.0, None)]
    asked = Condition(Aggregate.LAST, "w", 4 * PANE, low=2.0, where=(("d", ("x",)),))
    assert fired_on_a_new_view(early, asked) == [("a1", "firing", 3.0)]  # x's newest event carrying w


def test_a_declared_streams_delta_without_views_replays_as_its_own_not_as_one_from_before_views() -> None:
    """Found by hypothesis: a declared stream's delta written while no view was in use had the bytes of a delta
    from before views, so a copy replaying it put the base's cell rows into a whole-stream view: once a
    subscription came, it fired per cell ('a1\\x1f[{"d":"x"},...]', with that cell's sum) instead of per key."""
    first = SubstreamShard(CONFIG, OPTIONAL, cells=True)
    batches = [[("a1", 0, "x", 1.0, 0.0), ("a1", 0, "y", 2.0, None)], [("b1", 0, "x", 3.0, 0.0), ("a1", 1_000, None, 0.0, None)],
               [("b1", 1_000, None, 0.0, None)]]
    asked = Catalog.empty().applied(CatalogChange(1, (SubscriptionSpec(1, Condition(Aggregate.SUM, "v", 2 * PANE,
                                                                                    low=0.0)),)))
    progress: dict[int, int] = {}
    copy = SubstreamShard(CONFIG, OPTIONAL, cells=True)
    for batch in batches[:2]:  # the copy follows the change log
        progress = progress_of(batch, progress)
        _, delta = first.step(cell_rows(batch), progress, Catalog.empty())
        copy.replay(SubstreamDelta.from_bytes(delta.to_bytes(), len(ATTRS)))
    progress = progress_of(batches[2], progress)
    got, _ = first.step(cell_rows(batches[2]), progress, asked)
    taken, _ = copy.step(cell_rows(batches[2]), progress, asked)
    assert [(t.key, t.value) for t in taken] == [(t.key, t.value) for t in got] == [("a1", 3.0), ("b1", 3.0)]


def test_a_preview_of_a_view_no_subscription_uses_answers_from_the_stored_cells() -> None:
    """Previews (the form's "Preview matches now") of a filter nobody subscribes to yet: answered over that
    view's events, and nothing is left behind (no view is kept)."""
    shard = SubstreamShard(CONFIG, OPTIONAL, cells=True)
    events = [("a1", 1_000, "x", 5.0, 3.0), ("a1", 1_200, "y", 9.0, None), ("b1", 1_500, "x", 1.0, 4.0),
              ("b1", 2_500, "y", 0.0, None), ("a1", 2_500, "y", 0.0, None)]
    shard.step(cell_rows(events), progress_of(events, {}), Catalog.empty())
    on_x = Condition(Aggregate.SUM, "v", 2 * PANE, low=0.5, where=(("d", ("x",)),))
    assert shard.preview(on_x) == (2_000, {"a1": 5.0, "b1": 1.0}, 2)
    assert shard.preview(Condition(Aggregate.MAX, "w", 2 * PANE, low=3.5)) == (2_000, {"b1": 4.0}, 2)
    assert shard.preview(Condition(Aggregate.SUM, "v", 2 * PANE, low=0.5, key_prefix="b")) == (2_000, {"b1": 1.0}, 1)
    assert shard.views == {}


def test_a_hostile_dimension_value_cannot_change_a_cells_key_or_view() -> None:
    """Dimension values are the publisher's text: a separator, quotes or JSON inside one stay inside its value."""
    for value in ("a\x1fb", 'x"],["w"]]', "\x1f", "é 🚨", ""):
        cell = "web-1" + cell_suffix({"d": value}, [])
        assert split_cell(cell) == ("web-1", {"d": value}, frozenset())
        assert View(where=(("d", (value,)),)).admits(cell)
        assert not View(where=(("d", ("x",)),)).admits(cell)
        assert not View(present=("w",)).admits(cell)  # it does not carry w, whatever its value says
