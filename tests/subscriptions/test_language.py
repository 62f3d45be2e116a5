from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evaluator.spec import Aggregate, Condition
from subscriptions.language import ConditionError, check_window, format_condition, parse_condition


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("SUM(volume) OVER 5m > 2e6", Condition(Aggregate.SUM, "volume", 300_000, low=2e6)),
        ("count(*) over 30s >= 100", Condition(Aggregate.COUNT, None, 30_000, low=100, low_inclusive=True)),
        ("AVG(price) OVER 1h BETWEEN 10 AND 20", Condition(Aggregate.AVG, "price", 3_600_000, 10, 20, True, True)),
        ("MIN(price) OVER 1500ms <= 1_000.5", Condition(Aggregate.MIN, "price", 1_500, high=1000.5, high_inclusive=True)),
        ("  max( PRICE )   OVER 2d < -1 ", Condition(Aggregate.MAX, "price", 172_800_000, high=-1)),
    ],
)
def test_parses(text: str, expected: Condition) -> None:
    assert parse_condition(text) == expected


@pytest.mark.parametrize(
    ("text", "message", "column"),
    [
        ("", "empty", None),
        ("SUMM(volume) OVER 5m > 1", "unknown aggregate 'SUMM'", 1),
        ("SUM(vol) OVER 5m > 1", "unknown attribute 'vol'", 5),
        ("SUM(volume) OVER 5 > 1", "expected a window", 18),
        ("SUM(volume) OVER 5m", "expected a comparison", 20),
        ("SUM(volume) OVER 5m > 1 extra", "unexpected 'extra'", 25),
        ("SUM(volume) OVER 5m ! 1", "unexpected character '!'", 21),
        ("AVG(price) OVER 1m BETWEEN 5 AND 1", "empty range", 20),
        ("SUM() OVER 1m > 1", "expected an attribute", 5),
        ("SUM(volume) OVER 0s > 1", "not a positive", 18),
    ],
)
def test_errors_say_what_and_where(text: str, message: str, column: int | None) -> None:
    with pytest.raises(ConditionError) as info:
        parse_condition(text)
    assert message in str(info.value)
    assert info.value.column == column


def test_window_must_fit_panes_and_history() -> None:
    check_window(parse_condition("SUM(volume) OVER 5m > 1"), 1_000, 3_600_000)
    with pytest.raises(ConditionError, match="multiple of 1s"):
        check_window(parse_condition("SUM(volume) OVER 1500ms > 1"), 1_000, 3_600_000)
    with pytest.raises(ConditionError, match="at most 1h"):
        check_window(parse_condition("SUM(volume) OVER 2h > 1"), 1_000, 3_600_000)


numbers = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e300, max_value=1e300)


@given(
    st.sampled_from(list(Aggregate)),
    st.sampled_from(["price", "volume"]),
    st.integers(1, 10**9),
    numbers,
    numbers,
    st.sampled_from([">", ">=", "<", "<=", "between"]),
)
def test_format_round_trips(aggregate, attribute, window, a, b, op) -> None:  # noqa: ANN001
    attr = None if aggregate is Aggregate.COUNT else attribute
    if op == "between":
        condition = Condition(aggregate, attr, window, min(a, b), max(a, b), True, True)
    elif op.startswith(">"):
        condition = Condition(aggregate, attr, window, low=a, low_inclusive=op == ">=")
    else:
        condition = Condition(aggregate, attr, window, high=a, high_inclusive=op == "<=")
    assert parse_condition(format_condition(condition)) == condition
