"""A key against its own baseline: conditions whose terms are over windows of their own, against the brute-force
oracle, through snapshots, and in the language."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.settings import Settings
from evaluator.catalog import Catalog
from evaluator.expr import BinOp, Expr, Num, Term, expr_from_json, expr_terms
from evaluator.shard import ShardEvaluator
from evaluator.spec import Aggregate, Condition, SubscriptionSpec
from subscriptions.language import ConditionError, check_window, explain, format_condition, parse_condition
from tests.evaluator.test_shard import (
    CONFIG,
    HORIZON,
    assert_a_restored_copy_continues,
    assert_equals_the_oracle,
    catalogs,
    run,
    streams,
)
from tests.examples import examples

WINDOWS = [1_000, 2_000, 5_000]
#: Terms of every kind of answer: pane summaries with an index (SUM, COUNT, MAX), without (AVG), retained events.
TERMS = [("SUM", "volume"), ("COUNT", None), ("AVG", "price"), ("MAX", "price"), ("STDDEV", "price"),
         ("LAST", "price")]


@st.composite
def baselines(draw: st.DrawFn) -> Expr:
    """Two or three terms over their own windows, two lengths at least: a short window against a long one."""
    windows = draw(st.lists(st.sampled_from(WINDOWS), min_size=2, max_size=3).filter(lambda w: len(set(w)) > 1))
    terms = [Term(*draw(st.sampled_from(TERMS)), window_ms=w) for w in windows]
    node: Expr = terms[0]
    for term in terms[1:]:
        node = BinOp(draw(st.sampled_from(["+", "-", "*", "/"])), node, term)
    return BinOp("*", Num(draw(st.sampled_from([1.0, 2.0, 0.5]))), node) if draw(st.booleans()) else node


def _condition(expression: Expr, low: float, high: float | None, percent: bool) -> Condition:
    window = max(t.window_ms or 0 for t in expr_terms(expression))  # each has one
    return Condition(Aggregate.EXPR, None, window, expression=expression, low=low, high=high,
                     percent_of="price" if percent else None)


conditions = st.builds(_condition, baselines(), st.integers(-20, 40).map(float),
                       st.one_of(st.none(), st.just(60.0)), st.booleans())
subscriptions = catalogs(conditions, max_size=6)


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=streams(), specs=subscriptions, collective=st.booleans())
def test_baselines_equal_the_brute_force_oracle(stream, specs: list[SubscriptionSpec], collective: bool) -> None:
    """Each term over its own window, a key flipping when any of them changes: the transitions, and their values,
    are those of the definition, in the incremental plan and the naive one."""
    assert_equals_the_oracle(stream, specs, collective)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=streams(), specs=subscriptions, split=st.integers(0, 6))
def test_a_restored_shard_continues_exactly(stream, specs: list[SubscriptionSpec], split: int) -> None:
    """A copy rebuilt from a snapshot and brought up to date by deltas keeps running every window its groups read,
    not only their longest."""
    assert_a_restored_copy_continues(stream, specs, split)


def test_the_long_window_is_kept_once_for_every_subscription_that_reads_it() -> None:
    """Shared evaluation: a window length is one running aggregate per key, whichever groups read it."""
    shard = ShardEvaluator(CONFIG)
    texts = ["(SUM(volume) OVER 1s) / (SUM(volume) OVER 5s) > 0.5", "(AVG(price) OVER 2s) - (AVG(price) OVER 5s) > 1",
             "SUM(volume) OVER 5s > 10"]
    catalog = Catalog(1, tuple(SubscriptionSpec(i + 1, parse_condition(t)) for i, t in enumerate(texts)))
    run(shard, [[("A", 10_100, 1.0, 2.0), ("B", 10_200, 3.0, 4.0)], [("A", 12_500, 2.0, 1.0)]], catalog)
    assert set(shard.running.windows) == {1_000, 2_000, 5_000, HORIZON}


def test_the_wire_form_carries_a_terms_window_and_old_forms_still_read() -> None:
    term = Term("SUM", "volume", None, 3_600_000)
    assert term.to_json() == ["agg", "SUM", "volume", None, 3_600_000]
    assert expr_from_json(json.loads(json.dumps(term.to_json()))) == term
    assert expr_from_json(["agg", "SUM", "volume", None]) == Term("SUM", "volume")
    assert Term("SUM", "volume").to_json() == ["agg", "SUM", "volume", None]  # a plain term writes what it did
    condition = parse_condition("(SUM(volume) OVER 5m) / (SUM(volume) OVER 1h) * 12 > 3")
    assert Condition.from_dict(json.loads(json.dumps(condition.to_dict()))) == condition
    assert Catalog.decode(Catalog(2, (SubscriptionSpec(1, condition),)).encode()).subscriptions[0].condition == \
        condition


@pytest.mark.parametrize(("text", "canonical"), [
    ("(SUM(volume) OVER 5m) / (SUM(volume) OVER 1h) * 12 > 3", "(SUM(volume) OVER 5m) / (SUM(volume) OVER 1h) * 12 > 3"),
    ("SUM(volume) / (SUM(volume) OVER 1h) OVER 5m > 3", "(SUM(volume) OVER 5m) / (SUM(volume) OVER 1h) > 3"),
    ("(AVG(price) OVER 1m) - (AVG(price) OVER 30m) > 2%", "(AVG(price) OVER 1m) - (AVG(price) OVER 30m) > 2%"),
    ("(SUM(volume) OVER 5m) > 3", "SUM(volume) OVER 5m > 3"),  # one window: the condition written plainly
    ("(SUM(volume) OVER 5m) - (AVG(volume) OVER 5m) > 3", "SUM(volume) - AVG(volume) OVER 5m > 3"),
    ("(CHANGE(price) OVER 5m) > 3%", "CHANGE(price) OVER 5m > 3%"),  # relative to its first price, as ever
    ("(LAST(price) - AVG(price) OVER 1m) > 0", "LAST(price) - AVG(price) OVER 1m > 0"),
    ("((LAST(price) OVER 1m) - AVG(price)) OVER 1h > 0", "(LAST(price) OVER 1m) - (AVG(price) OVER 1h) > 0"),
])
def test_baselines_parse_to_one_canonical_form(text: str, canonical: str) -> None:
    condition = parse_condition(text)
    assert format_condition(condition) == canonical
    assert parse_condition(canonical) == condition


def test_a_condition_names_at_most_four_windows() -> None:
    """Each window length is a running aggregate per key that every pane entering the shard updates: one
    subscription may not add a dozen of them."""
    four = " + ".join(f"(SUM(volume) OVER {m}m)" for m in (1, 2, 3, 4))
    assert len(parse_condition(f"{four} > 1").windows) == 4
    with pytest.raises(ConditionError, match="at most 4 different windows"):
        parse_condition(f"{four} + (SUM(volume) OVER 5m) > 1")
    assert len(parse_condition(f"{four} + (COUNT(*) OVER 4m) > 1").windows) == 4  # parts may share a window


def test_one_window_is_the_plain_condition_and_shares_its_group() -> None:
    assert parse_condition("(SUM(volume) OVER 5m) > 3") == parse_condition("SUM(volume) OVER 5m > 3")


def test_explain_reads_each_window_from_the_expression() -> None:
    text = explain(parse_condition("(SUM(volume) OVER 5m) / (SUM(volume) OVER 1h) * 12 > 3"))
    assert text == "fires for each key whose (SUM(volume) OVER 5m) / (SUM(volume) OVER 1h) * 12 is above 3"


def test_every_window_fits_panes_history_and_retained_events() -> None:
    hour = 3_600_000
    check_window(parse_condition("(SUM(volume) OVER 5m) / (SUM(volume) OVER 3h) > 3"), 1_000, 3 * hour, hour)
    with pytest.raises(ConditionError, match="multiple of 1s"):
        check_window(parse_condition("(SUM(volume) OVER 1500ms) / (SUM(volume) OVER 1h) > 3"), 1_000, 3 * hour, hour)
    with pytest.raises(ConditionError, match="at most 3h"):
        check_window(parse_condition("(SUM(volume) OVER 5m) / (SUM(volume) OVER 4h) > 3"), 1_000, 3 * hour, hour)
    with pytest.raises(ConditionError, match="stddev's window may be at most 1h"):
        check_window(parse_condition("(STDDEV(price) OVER 2h) - (AVG(price) OVER 1m) > 1"), 1_000, 3 * hour, hour)
    # an event aggregate over a short window beside a long pane aggregate is fine
    check_window(parse_condition("(STDDEV(price) OVER 5m) / (AVG(price) OVER 3h) > 0.01"), 1_000, 3 * hour, hour)


@pytest.mark.parametrize("kwargs", [
    {"expression": BinOp("-", Term("SUM", "volume", None, 5_000), Term("SUM", "volume")), "window_ms": 5_000},
    {"expression": BinOp("-", Term("SUM", "volume", None, 5_000), Term("AVG", "volume", None, 5_000)),
     "window_ms": 5_000},
    {"expression": BinOp("-", Term("SUM", "volume", None, 1_000), Term("SUM", "volume", None, 5_000)),
     "window_ms": 1_000},
])
def test_conditions_outside_the_one_form_are_refused(kwargs: dict) -> None:
    """Every term with its own window over two lengths or more, the condition's the longest: or equal conditions
    would differ, and share no group."""
    with pytest.raises(ValueError, match="window"):
        Condition(Aggregate.EXPR, None, low=1.0, **kwargs)


def examples_under(heading: str) -> list[str]:
    """The conditions of the code block under a heading of docs/conditions.md (each line's text before a gap of two
    spaces or more, which starts its comment)."""
    doc = (Path(__file__).parents[2] / "docs" / "conditions.md").read_text()
    section = doc.split(f"### {heading}\n", 1)[1].split("\n### ", 1)[0]
    block = section.split("```\n", 2)[1]
    return [re.split(r"\s{2,}", line.strip())[0] for line in block.splitlines() if line.strip()]


@pytest.mark.parametrize("heading", ["A key against its own baseline: a window per part",
                                     "Spread and standard score: a key against its own window"])
def test_the_docs_examples_parse_and_fit_the_default_limits(heading: str) -> None:
    settings_ = Settings()
    found = examples_under(heading)
    assert len(found) >= 4
    for text in found:
        condition = parse_condition(text)
        check_window(condition, settings_.pane_ms, settings_.max_window_ms, settings_.quantile_max_window_ms,
                     settings_.tuple_max_events)
