"""A shard widened to a new attribute equals a shard that had the attribute from the start (every earlier event
lacking it), and both agree with the brute-force oracle: an attribute added to a running stream keeps its state."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evaluator.catalog import Catalog
from evaluator.evolution import snapshot_attributes, widened_delta, widened_rows, widened_snapshot
from evaluator.panerows import PaneRows
from evaluator.shard import ShardEvaluator
from evaluator.spec import SubscriptionSpec
from subscriptions.language import parse_condition
from tests.evaluator.test_shard import CONFIG, KEYS, progress_of
from tests.evaluator.test_shard import pane_rows as two_attribute_rows
from tests.examples import examples

WIDE = dataclasses.replace(CONFIG, attributes=(*CONFIG.attributes, "disk"))
SPECS = [SubscriptionSpec(1, parse_condition("SUM(volume) OVER 3s > 8")),
         SubscriptionSpec(2, parse_condition("AVG(price) OVER 2s >= 3")),
         SubscriptionSpec(3, parse_condition("COUNT(*) OVER 4s > 2")),
         SubscriptionSpec(4, parse_condition("MAX(price) OVER 3s < 2")),
         SubscriptionSpec(5, parse_condition("QUANTILE(volume, 0.5) OVER 2s > 4"))]
# On the new attribute: SUM is exact over events that may lack it (they count 0).
DISK = SubscriptionSpec(6, dataclasses.replace(parse_condition("SUM(volume) OVER 3s > 5"), attribute="disk"))

events = st.lists(st.tuples(st.sampled_from(KEYS), st.integers(0, 9_000), st.integers(0, 6).map(float),
                            st.integers(0, 9).map(float)), max_size=40)


def three(rows: PaneRows, disk: list[float] | None = None) -> PaneRows:
    """Two-attribute rows with a ``disk`` column: the given per-event values (one per pane row's events) or 0."""
    def zero_row(m: np.ndarray) -> np.ndarray:  # built here, not by the code under test
        return np.concatenate([m, np.zeros((1, m.shape[1]))])

    wide = dataclasses.replace(rows, sums=zero_row(rows.sums), mins=zero_row(rows.mins), maxs=zero_row(rows.maxs),
                               event_values=zero_row(rows.event_values))
    if disk is None:
        return wide
    values = wide.event_values.copy()
    values[2] = disk
    starts = wide.event_offsets[:-1]
    sums, mins, maxs = wide.sums.copy(), wide.mins.copy(), wide.maxs.copy()
    for i, (a, b) in enumerate(zip(starts, wide.event_offsets[1:], strict=True)):
        sums[2, i], mins[2, i], maxs[2, i] = values[2, a:b].sum(), values[2, a:b].min(), values[2, a:b].max()
    return dataclasses.replace(wide, sums=sums, mins=mins, maxs=maxs, event_values=values)


def batches(stream: list, size: int = 7) -> list[list]:
    ordered = sorted(stream, key=lambda e: e[1])
    return [ordered[i : i + size] for i in range(0, len(ordered), size)]


@settings(max_examples=examples(120), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events, events, st.booleans())
def test_a_widened_shard_equals_one_that_had_the_attribute_all_along(before: list, after: list,
                                                                     from_snapshot: bool) -> None:
    """Widened from its snapshot, or from the snapshot before its last batch plus that batch's change-log entry."""
    after = [(k, t + 9_000, p, v) for k, t, p, v in after]
    narrow, wide = ShardEvaluator(CONFIG), ShardEvaluator(WIDE)
    catalog = Catalog(1, SPECS)
    got: list = []
    want: list = []
    blob_before_last, last_delta = narrow.snapshot(), None
    for batch in batches(before):
        rows, progress = two_attribute_rows(batch), progress_of(batch)
        blob_before_last = narrow.snapshot()
        transitions, last_delta = narrow.step(rows, progress, catalog)
        got += transitions
        want += wide.step(three(rows), progress, catalog)[0]
    if from_snapshot or last_delta is None:
        blob = narrow.snapshot()
        assert snapshot_attributes(blob) == 2 and snapshot_attributes(widened_snapshot(blob, 3)) == 3
        restored = ShardEvaluator.from_snapshot(WIDE, widened_snapshot(blob, 3))
    else:
        restored = ShardEvaluator.from_snapshot(WIDE, widened_snapshot(blob_before_last, 3))
        restored.replay(widened_delta(last_delta, 3))
        replayed = ShardEvaluator.from_snapshot(CONFIG, blob_before_last)  # a replayed copy's key order differs:
        replayed.replay(last_delta)  # compared with the narrow copy replayed the same way
        assert restored.snapshot() == widened_snapshot(replayed.snapshot(), 3)
    catalog = Catalog(2, [*SPECS, DISK])
    for batch in batches(after):
        rows, progress = two_attribute_rows(batch), progress_of(batch)
        wide_rows = three(rows, _disk_in_row_order(rows))
        got += restored.step(wide_rows, progress, catalog)[0]
        want += wide.step(wide_rows, progress, catalog)[0]
    assert [t.to_dict() for t in got] == [t.to_dict() for t in want]
    if from_snapshot:
        assert restored.snapshot() == wide.snapshot()


def _disk_in_row_order(rows: PaneRows) -> list[float]:
    """A ``disk`` value per event of ``rows``: a function of its price (2 when price is even, else missing: 0)."""
    return [2.0 if int(p) % 2 == 0 else 0.0 for p in rows.event_values[0]]


def test_widening_a_snapshot_with_the_attributes_it_has_changes_nothing() -> None:
    shard = ShardEvaluator(CONFIG)
    shard.step(two_attribute_rows([("A", 10, 1.0, 2.0)]), {0: 5_000, 1: 5_000}, Catalog(1, SPECS))
    blob = shard.snapshot()
    assert widened_snapshot(blob, 2) == blob
    assert np.array_equal(widened_rows(two_attribute_rows([("A", 10, 1.0, 2.0)]), 3).sums[2], [0.0])
