"""The catalog brought forward by diffs equals the catalog rebuilt from scratch, and old catalogs stay as they were."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evaluator import catalog as catalog_module
from evaluator.catalog import Catalog, CatalogChange, rewritten_snapshot
from evaluator.spec import SubscriptionSpec
from subscriptions.language import parse_condition
from tests.examples import examples

CONDITIONS = [parse_condition(text) for text in
              ("COUNT(*) OVER 1m >= 2", "SUM(volume) OVER 5m > 2e6", "MAX(price) OVER 30s < 10", "AVG(price) OVER 1m > 3")]
KEYS = ("A", "B", "C", "D")


def spec(sid: int, condition: int, keys: frozenset[str] | None) -> SubscriptionSpec:
    return SubscriptionSpec(sid, CONDITIONS[condition], keys, f"s{sid}")


specs = st.builds(spec, st.integers(1, 40), st.integers(0, len(CONDITIONS) - 1),
                  st.none() | st.frozensets(st.sampled_from(KEYS), min_size=1))
edits = st.lists(st.tuples(st.lists(specs, max_size=3, unique_by=lambda s: s.id),
                           st.lists(st.integers(1, 40), max_size=3)), max_size=60)


def rebuilt(subscriptions: tuple[SubscriptionSpec, ...], change: CatalogChange) -> tuple[SubscriptionSpec, ...]:
    """The brute-force oracle: drop what the change removes or replaces, append its upserts."""
    gone = set(change.removals) | {s.id for s in change.upserts}
    return tuple(s for s in subscriptions if s.id not in gone) + change.upserts


@settings(max_examples=examples(150), deadline=None)
@given(start=st.lists(specs, max_size=30, unique_by=lambda s: s.id), edits=edits, keep=st.integers(0, 5),
       fold=st.sampled_from([0, 2, 64]))
def test_applied_changes_equal_the_catalog_rebuilt_from_scratch(start: list[SubscriptionSpec], edits: list,
                                                                 keep: int, fold: int) -> None:
    default = catalog_module._MIN_OVERLAY
    catalog_module._MIN_OVERLAY = fold  # small overlays: folded into new bases often, as large catalogs do
    try:
        check_applied(start, edits, keep)
    finally:
        catalog_module._MIN_OVERLAY = default


def check_applied(start: list[SubscriptionSpec], edits: list, keep: int) -> None:
    catalog = Catalog(0, tuple(start))
    history = [(catalog, catalog.subscriptions)]
    applied: list[CatalogChange] = []
    for version, (upserts, removals) in enumerate(edits, start=1):
        change = CatalogChange(version, tuple(upserts), tuple(removals))
        expected = rebuilt(history[-1][1], change)
        catalog = catalog.applied(change, keep)
        applied.append(change)
        history.append((catalog, expected))
        assert catalog.subscriptions == expected
        for key in KEYS:
            oracle = [s for s in expected if s.keys is None] + [s for s in expected if s.keys is not None and key in s.keys]
            assert list(catalog.for_key(key)) == oracle
        assert all(catalog.get(s.id) == s for s in expected)
        assert catalog.changes == (tuple(applied[-keep:]) if keep else ())
    for old, expected in history:  # persistent: deriving new catalogs changed none of the old ones
        assert old.subscriptions == expected
        assert Catalog(old.version, expected) == Catalog(old.version, old.subscriptions)


@settings(max_examples=examples(60), deadline=None)
@given(start=st.lists(specs, max_size=10, unique_by=lambda s: s.id), edits=edits,
       data=st.data())
def test_brought_forward_applies_the_contiguous_run_and_stops_at_a_gap(start: list, edits: list, data: st.DataObject) -> None:
    changes = [CatalogChange(v, tuple(u), tuple(r)) for v, (u, r) in enumerate(edits, start=1)]
    log = [(c.version, c.encode()) for c in changes]
    at = data.draw(st.integers(0, len(changes)))
    catalog = Catalog(0, tuple(start))
    for c in changes[:at]:
        catalog = catalog.applied(c)
    full = catalog.brought_forward(log)
    assert full.version == len(changes)
    expected = tuple(start)
    for c in changes:
        expected = rebuilt(expected, c)
    assert full.subscriptions == expected
    version, snapshot = rewritten_snapshot(catalog.encode() if at or start else None, log)  # the JSON-level rewrite
    assert version == full.version and Catalog.decode(snapshot).subscriptions == expected
    if len(changes) - at >= 2:  # lose one change after the reader's version: it stops before it
        lost = data.draw(st.integers(at + 1, len(changes)))
        partial = catalog.brought_forward([e for e in log if e[0] != lost])
        assert partial.version == lost - 1
        assert partial.changes_since(catalog.version) == tuple(changes[at:lost - 1])


def test_changes_since_tells_how_far_back_the_catalog_remembers() -> None:
    catalog = Catalog(5, (spec(1, 0, None),))
    for v in range(6, 10):
        catalog = catalog.applied(CatalogChange(v, (spec(v, 1, frozenset({"A"})),)), keep=3)
    assert [c.version for c in catalog.changes_since(6) or ()] == [7, 8, 9]
    assert catalog.changes_since(5) is None  # change 6 is forgotten
    assert catalog.changes_since(9) == ()
    assert catalog.changes_since(None) is None
    with pytest.raises(ValueError, match="does not follow"):
        catalog.applied(CatalogChange(11))


def test_a_change_round_trips_compactly() -> None:
    change = CatalogChange(7, (spec(1, 1, frozenset(KEYS)), spec(2, 3, None)), (3, 4))
    assert CatalogChange.decode(change.encode()) == change
    assert len(change.encode()) < len(str(change.to_dict()))


def test_a_large_catalog_applies_a_change_without_touching_every_subscription() -> None:
    """The overlay is folded into a new base only every ~sqrt(n) changes: most changes copy no base."""
    catalog = Catalog(0, tuple(spec(i, i % len(CONDITIONS), None) for i in range(1, 10_001)))
    folds = 0
    for v in range(1, 1_001):
        before = catalog._base
        catalog = catalog.applied(CatalogChange(v, (spec(20_000 + v, 0, frozenset({"A"})),), (v,)))
        folds += catalog._base is not before
    assert folds <= 1_000 * 2 // 100  # two ids per change, folded past sqrt(10,000) = 100
    assert len(catalog.subscriptions) == 10_000 and catalog.get(1) is None and catalog.get(21_000) is not None
