"""A preview is the subscription's own answer, over values of any sign, and never changes evaluation (issue 30).

A declared stream's attribute with no ``min`` takes negative values. Previews used to build every collective index,
whose CI-SUM refused them (``ValueError: CI-SUM needs finite non-negative values``, for COUNT/MIN/MAX previews too),
and later previews answered from the half-built indexes; the ``index`` and ``naive`` plans failed the same way
inside the batch.
"""

from __future__ import annotations

import math
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evaluator.catalog import Catalog
from evaluator.shard import ShardEvaluator
from evaluator.spec import Aggregate, Condition, SubscriptionSpec
from tests.evaluator.oracle import value_of
from tests.evaluator.test_shard import CONFIG, DELAY, HORIZON, KEYS, PANE, pane_rows, progress_of
from tests.examples import examples

PLANS = {"incremental": replace(CONFIG), "index": replace(CONFIG, plan="index"),
         "naive": replace(CONFIG, collective=False)}
AGGREGATES = [Aggregate.COUNT, Aggregate.SUM, Aggregate.MIN, Aggregate.MAX, Aggregate.AVG]


def _condition(aggregate: Aggregate, attribute: str, window: int, a: float, b: float, shape: str,
               inclusive: bool) -> Condition:
    low, high = min(a, b), max(a, b)
    return Condition(aggregate, None if aggregate is Aggregate.COUNT else attribute, window,
                     None if shape == "below" else low, None if shape == "above" else high, inclusive, not inclusive)


#: Thresholds of either sign, around what windows of the values below sum to.
conditions = st.builds(_condition, st.sampled_from(AGGREGATES), st.sampled_from(["price", "volume"]),
                       st.sampled_from([1_000, 2_000, 5_000, HORIZON]), st.integers(-40, 40).map(float),
                       st.integers(-40, 40).map(float), st.sampled_from(["above", "below", "between"]), st.booleans())


@st.composite
def signed_streams(draw):
    """Events of either sign (zeros and halves included), in per-partition order up to the allowed delay."""
    n = draw(st.integers(1, 50))
    value = st.one_of(st.integers(-20, 20).map(float), st.integers(-40, 40).map(lambda v: v / 2))
    events, clock = [], 10_000
    for _ in range(n):
        clock += draw(st.integers(0, 700))
        events.append((draw(st.sampled_from(KEYS)), clock - draw(st.integers(0, DELAY - PANE)), draw(value),
                       draw(value)))
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=5)))
    return events, [events[a:b] for a, b in zip([0, *cuts], [*cuts, n], strict=True) if b > a]


def watched_at(events: list, keys: frozenset[str] | None, at: int) -> set[str]:
    """The keys watched at boundary ``at``: those listed, else those with data in the horizon."""
    return set(keys) if keys is not None else {k for k, ts, *_ in events if at - HORIZON <= ts // PANE * PANE < at}


def expected(events: list, condition: Condition, keys: frozenset[str] | None, at: int) -> dict[str, float]:
    """The brute-force answer at boundary ``at``: the watched keys that satisfy ``condition``, with their values."""
    answer = {}
    for key in watched_at(events, keys, at):
        window = [e for e in events if e[0] == key and at - condition.window_ms <= e[1] // PANE * PANE < at]
        value = value_of(condition, window)
        if condition.holds(value):
            answer[key] = value
    return answer


@settings(max_examples=examples(120), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=signed_streams(), subscribed=conditions, other=conditions,
       keys=st.one_of(st.none(), st.frozensets(st.sampled_from(KEYS), min_size=1)), plan=st.sampled_from(list(PLANS)))
def test_previews_equal_the_subscriptions_evaluation_and_the_oracle_over_negative_values(
        stream, subscribed: Condition, other: Condition, keys: frozenset[str] | None, plan: str) -> None:
    _, batches = stream
    catalog = Catalog(1, (SubscriptionSpec(1, subscribed, keys),))
    previewed, alone = ShardEvaluator(PLANS[plan]), ShardEvaluator(PLANS[plan])
    seen: list = []
    for batch in batches:
        seen += batch
        transitions, _ = previewed.step(pane_rows(batch), progress_of(batch), catalog)
        alone_transitions, _ = alone.step(pane_rows(batch), progress_of(batch), catalog)
        assert transitions == alone_transitions, "a preview changed what the shard evaluates"
        at, matched, watched = previewed.preview(subscribed, keys)
        assert at == previewed.evaluated_at
        if at is None:
            assert matched == {} and watched == 0
            continue
        # The subscription's own evaluation at the same boundary: its firing set, and the values it reports. Unless
        # a late pane arrived since (``stale``): the preview sees it at once, the subscription at its next boundary.
        if not previewed.stale:
            assert matched.keys() == previewed.firing.get(1, set())
            for t in transitions:
                if t.state == "firing" and t.evaluated_at == at:
                    assert matched[t.key] == t.value
        for condition in (subscribed, other):  # the other's window may be one no subscription keeps running
            _, matched, watched = previewed.preview(condition, keys)
            want = expected(seen, condition, keys, at)
            assert matched.keys() == want.keys()
            assert all(math.isclose(matched[k], v, rel_tol=1e-12, abs_tol=1e-12) for k, v in want.items())
            assert watched == len(watched_at(seen, keys, at))
    if plan == "incremental":
        assert previewed._indexes is None, "a preview built the collective indexes"
