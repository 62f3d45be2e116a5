"""Every declared aggregate and comparator, against the brute-force oracle, and the conditions' wire forms.

These tests iterate over evaluator/aggregates.py and evaluator/comparators.py, so a new
aggregate or comparator is tested here without editing a test (an aggregate also needs its
definition in tests/evaluator/oracle.py: the first test says so).
"""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from evaluator.aggregates import AGGREGATES, SPELLINGS
from evaluator.catalog import Catalog
from evaluator.comparators import COMPARATORS, Range, comparator_of
from evaluator.expr import OPERATORS, BinOp, Expr, Num, Term, expr_from_json, expr_terms
from evaluator.spec import Aggregate, Condition, SubscriptionSpec
from subscriptions.language import explain, format_condition, language_help, parse_condition
from tests.evaluator.oracle import DEFINITIONS
from tests.evaluator.test_shard import ATTRS, assert_equals_the_oracle, catalogs, streams
from tests.examples import examples


def test_the_oracle_defines_every_declared_aggregate() -> None:
    assert set(DEFINITIONS) == set(AGGREGATES), "declare each aggregate in evaluator/aggregates.py and define it, " \
                                                "by brute force, in tests/evaluator/oracle.py"
    assert {a.value for a in Aggregate} == {*AGGREGATES, "EXPR"}


terms = st.one_of(*(
    st.builds(Term, st.just(name), st.sampled_from(ATTRS) if a.takes_attribute else st.none(),
              st.sampled_from(a.param.examples) if a.param else st.none())
    for name, a in AGGREGATES.items()
))
numbers = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e300, max_value=1e300)
expressions: st.SearchStrategy[Expr] = st.recursive(
    st.one_of(terms, st.builds(Num, numbers)),
    lambda inner: st.builds(BinOp, st.sampled_from(OPERATORS), inner, inner),
    max_leaves=6,
)


@st.composite
def comparisons(draw: st.DrawFn, thresholds: st.SearchStrategy[float]) -> tuple[Range, ...]:
    """Any declared comparator, with ascending thresholds."""
    comparator = draw(st.sampled_from(COMPARATORS))
    return comparator.ranges(*sorted(draw(thresholds) for _ in range(comparator.arity)))


def _condition(term: Term, window: int, ranges: tuple[Range, ...]) -> Condition:
    return Condition(Aggregate(term.aggregate), term.attribute, window, q=term.param, ranges=ranges)


conditions = st.builds(_condition, terms, st.sampled_from([1_000, 2_000, 5_000]),
                       comparisons(st.integers(0, 40).map(float)))
subscriptions = catalogs(conditions)


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=streams(), specs=subscriptions, collective=st.booleans())
def test_every_aggregate_and_comparator_equals_the_oracle(stream: tuple[list, list], specs: list[SubscriptionSpec],
                                                          collective: bool) -> None:
    assert_equals_the_oracle(stream, specs, collective)


@given(expressions)
def test_expressions_round_trip_through_json(expression: Expr) -> None:
    assert expr_from_json(json.loads(json.dumps(expression.to_json()))) == expression


@given(expressions, comparisons(numbers), st.sampled_from([None, "price"]), st.integers(1, 10**9))
def test_conditions_round_trip_through_the_catalog_snapshot(expression: Expr, ranges: tuple[Range, ...],
                                                            percent_of: str | None, window: int) -> None:
    assume(expr_terms(expression))
    if isinstance(expression, Term) and percent_of is None:
        condition = _condition(expression, window, ranges)
    else:
        condition = Condition(Aggregate.EXPR, None, window, expression=expression, percent_of=percent_of,
                              ranges=ranges)
    catalog = Catalog(3, (SubscriptionSpec(1, condition, frozenset({"A"})),))
    assert Catalog.decode(catalog.encode()).subscriptions[0].condition == condition
    assert Condition.from_dict(json.loads(json.dumps(condition.to_dict()))) == condition


def test_stored_conditions_of_the_tuple_era_still_read() -> None:
    stored = {"aggregate": "EXPR", "attribute": None, "window_ms": 60_000, "low": 3, "low_inclusive": False,
              "expression": ["-", ["agg", "MAX", "price", None], ["agg", "QUANTILE", "price", 0.5]],
              "percent_of": "price"}
    condition = Condition.from_dict(stored)
    assert condition.expression == BinOp("-", Term("MAX", "price"), Term("QUANTILE", "price", 0.5))
    assert condition.to_dict()["expression"] == stored["expression"]
    assert "ranges" not in condition.to_dict()  # one range is written as bounds, as before


@given(terms, comparisons(numbers))
def test_every_aggregate_and_comparator_formats_parses_and_explains(term: Term, ranges: tuple[Range, ...]) -> None:
    condition = _condition(term, 60_000, ranges)
    assert parse_condition(format_condition(condition)) == condition
    comparator, _ = comparator_of(condition.accepted)
    assert comparator.words.split()[0] in explain(condition)


def test_aliases_parse_to_what_they_stand_for() -> None:
    for alias, (aggregate, param) in SPELLINGS.items():
        if alias != aggregate.name:
            [term] = parse_condition(f"{alias}(price) OVER 1m > 1").terms
            assert term == Term(aggregate.name, "price", param)


def test_the_reference_tables_name_every_aggregate_and_comparison() -> None:
    readme = (Path(__file__).parents[2] / "docs" / "conditions.md").read_text()
    help_ = language_help()
    for syntax, summary in help_.aggregates:
        assert f"| `{syntax}` | {summary} |" in readme, f"add {syntax}'s row to docs/conditions.md's aggregate table"
    for alias, meaning in help_.aliases:
        assert f"| `{alias}(attribute)` | is `{meaning}` |" in readme
    for comparison in help_.comparisons:
        assert f"`{comparison}`" in readme, f"add `{comparison}` to docs/conditions.md's comparison table"
