"""STDDEV and ZSCORE: exact to the last digits where the textbook formula cancels, and what their conditions say.

Their alerts are checked against the brute-force oracle with every other aggregate
(tests/evaluator/test_registry.py iterates over the registry); here, their values against exact
rational arithmetic, and the language around them.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from evaluator.aggregates import AGGREGATES
from evaluator.expr import Term
from evaluator.spec import Aggregate
from subscriptions.language import ConditionError, check_window, explain, format_condition, parse_condition

STDDEV, ZSCORE = AGGREGATES["STDDEV"], AGGREGATES["ZSCORE"]


def exact_deviation(values: list[float]) -> float:
    """The population standard deviation of the floats as given, in exact rationals, rounded once at the root."""
    exact = [Fraction(v) for v in values]
    mean = sum(exact, Fraction(0)) / len(exact)
    variance = sum(((x - mean) ** 2 for x in exact), Fraction(0)) / len(exact)
    return math.sqrt(variance)  # the one rounding: of the variance to a float, then the root (< 1 ulp each)


def textbook_deviation(values: list[float]) -> float:
    """sqrt(mean of squares - square of mean): what a pane's sum and sum of squares would give."""
    n = len(values)
    return math.sqrt(max(math.fsum(v * v for v in values) / n - (math.fsum(values) / n) ** 2, 0.0))


#: Prices near a level moving by cents: the case where a sum of squares less a squared sum loses the digits.
prices = st.tuples(st.sampled_from([1.0, 100.0, 25_000.0, 1e7]),
                   st.lists(st.integers(-500, 500), min_size=2, max_size=60)).map(
    lambda level_cents: [level_cents[0] + c / 100 for c in level_cents[1]])
anything = st.lists(st.floats(min_value=-1e12, max_value=1e12, allow_nan=False), min_size=1, max_size=60)


@given(st.one_of(prices, anything))
def test_stddev_is_the_exact_deviation_within_rounding(values: list[float]) -> None:
    got = STDDEV.of_events(np.array(values), None)
    assert math.isclose(got, exact_deviation(values), rel_tol=1e-12, abs_tol=1e-300)


def test_the_textbook_formula_would_not_be_exact_here() -> None:
    """The cents case above is hard: one sum of squares less a squared sum is off by orders of magnitude."""
    values = [1e7 + c / 100 for c in (1, 2, 3, 5, 8)]  # a price of 10,000,000 moving by cents
    exact = exact_deviation(values)
    assert not math.isclose(textbook_deviation(values), exact, rel_tol=1e-3)
    assert math.isclose(STDDEV.of_events(np.array(values), None), exact, rel_tol=1e-12)


@given(st.one_of(prices, anything))
def test_zscore_is_the_newest_value_in_deviations_from_the_mean(values: list[float]) -> None:
    got = ZSCORE.of_events(np.array(values), None)
    exact = [Fraction(v) for v in values]
    mean = sum(exact, Fraction(0)) / len(exact)
    deviation = exact_deviation(values)
    if deviation == 0:
        assert math.isnan(got)  # every value the same: no score, no condition holds
        return
    expected = float(exact[-1] - mean) / deviation
    assert math.isclose(got, expected, rel_tol=1e-12, abs_tol=1e-12)


def test_zscore_keeps_a_cent_on_a_large_price() -> None:
    """newest - (rounded mean) carried the mean's rounding (2e-9 at 10,000,000) into a cent: 1.0000002, not 1."""
    assert math.isclose(ZSCORE.of_events(np.array([1e7, 1e7 + 0.01]), None), 1.0, rel_tol=1e-12)


def test_the_mean_s_rounding_does_not_widen_the_spread() -> None:
    """Found by the property above: the rounded mean of two values near 1e12 is off by ~6e-5, which the sum of squared
    deviations took in squared (1.3e-12 of the spread): a z-score of 0.99999999999871 for two values, which is 1."""
    values = [-999999996206.0, -999999996129.9999]
    assert math.isclose(STDDEV.of_events(np.array(values), None), exact_deviation(values), rel_tol=1e-15)
    assert ZSCORE.of_events(np.array(values), None) == 1.0


def test_equal_values_have_no_spread_and_no_score() -> None:
    """Their rounded mean (a sum rounded, then divided) was an ulp off the value: a spread, and a score of ±1."""
    values = np.array([366503875925.4525] * 3)
    assert STDDEV.of_events(values, None) == 0.0
    assert math.isnan(ZSCORE.of_events(values, None))


def test_one_event_has_no_spread_and_no_score() -> None:
    assert STDDEV.of_events(np.array([101.25]), None) == 0.0
    assert math.isnan(ZSCORE.of_events(np.array([101.25]), None))
    assert ZSCORE.of_events(np.array([1.0, 3.0]), None) == 1.0  # mean 2, deviation 1, newest 3
    assert ZSCORE.of_events(np.array([3.0, 1.0]), None) == -1.0  # the newest below the mean: negative


@pytest.mark.parametrize(("text", "aggregate", "attribute"), [
    ("STDDEV(price) OVER 15m > 0.5", Aggregate.STDDEV, "price"),
    ("ZSCORE(price) OVER 1h > 2", Aggregate.ZSCORE, "price"),
    ("ZSCORE(volume) OVER LAST 50 EVENTS < -3", Aggregate.ZSCORE, "volume"),
    ("stddev(price) over 15m > 0.5", Aggregate.STDDEV, "price"),
])
def test_conditions_parse_format_and_explain(text: str, aggregate: Aggregate, attribute: str) -> None:
    condition = parse_condition(text)
    assert (condition.aggregate, condition.attribute) == (aggregate, attribute)
    assert parse_condition(format_condition(condition)) == condition
    assert "standard" in explain(condition)


def test_a_percentage_compares_the_deviation_with_a_share_of_the_last_price() -> None:
    condition = parse_condition("STDDEV(price) OVER 15m > 1%")
    assert condition.aggregate is Aggregate.EXPR and condition.expression == Term("STDDEV", "price")
    assert condition.percent_of == "price" and condition.low == 1


def test_windows_beyond_the_retained_events_are_refused_with_the_limit() -> None:
    condition = parse_condition("ZSCORE(price) OVER 2h > 2")
    with pytest.raises(ConditionError, match="at most 1h"):
        check_window(condition, 1_000, 3 * 3_600_000, 3_600_000)
    check_window(parse_condition("ZSCORE(price) OVER 1h > 2"), 1_000, 3 * 3_600_000, 3_600_000)  # at the limit


def test_an_aggregate_without_an_attribute_is_refused_with_its_column() -> None:
    with pytest.raises(ConditionError, match="column"):
        parse_condition("STDDEV(*) OVER 1m > 1")
