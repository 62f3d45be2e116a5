"""Conditions on a stream: attributes and dimensions of its schema, and the WHERE clause (issue 15)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.streams import StreamSchema
from evaluator.spec import Aggregate, Condition
from subscriptions.language import (
    ConditionError,
    combine_keys,
    explain,
    format_condition,
    parse_condition,
    parse_filtered,
)

HOSTS = StreamSchema(name="hosts", key_field="host", attributes=[{"name": "cpu"}, {"name": "memMB", "required": False}],
                     dimensions=[{"name": "region"}, {"name": "dc", "max_length": 4}, {"name": "KEY"}],
                     retention_ms=60_000, partitions=1)


def test_a_condition_names_its_stream_and_the_stream_s_attributes() -> None:
    assert parse_condition("SUM(cpu) OVER 1m > 90", HOSTS) == Condition(Aggregate.SUM, "cpu", 60_000, low=90,
                                                                       stream="hosts")
    assert parse_condition("avg(MEMMB) over 1m > 1", HOSTS).attribute == "memMB"  # the schema's spelling
    assert parse_condition("SUM(volume) OVER 1m > 1").stream == "trades"  # the default, as before
    assert parse_condition("SUM(volume) OVER 1m > 1").to_dict() == Condition(Aggregate.SUM, "volume", 60_000,
                                                                             low=1).to_dict()


@pytest.mark.parametrize(
    ("text", "where", "prefix", "keys"),
    [
        ("SUM(cpu) OVER 1m > 9 WHERE region = 'eu'", (("region", ("eu",)),), None, None),
        ("SUM(cpu) OVER 1m > 9 where region in ('us', 'eu', 'us')", (("region", ("eu", "us")),), None, None),
        ("SUM(cpu) OVER 1m > 9 WHERE dc = 'O''H' AND region IN ('eu')", (("dc", ("O'H",)), ("region", ("eu",))),
         None, None),
        ("SUM(cpu) OVER 1m > 9 WHERE key STARTS WITH 'web-'", (), "web-", None),
        ("SUM(cpu) OVER 1m > 9 WHERE key IN ('web-1', 'db-1')", (), None, {"web-1", "db-1"}),
        ("SUM(cpu) OVER 1m > 9 WHERE host = 'web-1' AND host starts with 'web'", (), "web", {"web-1"}),
        ("SUM(cpu) OVER 1m > 9 WHERE KEY = 'x'", (("KEY", ("x",)),), None, None),  # a dimension spelt so
        ("NO DATA FOR 5m WHERE region = ''", (("region", ("",)),), None, None),
        ("LAST(cpu) OVER 1m CROSSES ABOVE 9 DAMPEN 5m WHERE region = 'eu'", (("region", ("eu",)),), None, None),
    ],
)
def test_where_filters_dimensions_and_keys(text: str, where: tuple, prefix: str | None, keys: set | None) -> None:
    filtered = parse_filtered(text, HOSTS)
    assert filtered.condition.where == where
    assert filtered.condition.key_prefix == prefix
    assert filtered.keys == (frozenset(keys) if keys is not None else None)
    assert filtered.condition.stream == "hosts"
    again = parse_filtered(format_condition(filtered.condition), HOSTS)
    assert again.condition == filtered.condition and again.keys is None  # key IN is the keys field's, not the text's


@pytest.mark.parametrize(
    ("text", "message", "column"),
    [
        ("SUM(price) OVER 1m > 1", "unknown attribute 'price'; stream hosts has cpu, memMB", 5),
        ("SUM(cpu) OVER 1m > 1 WHERE zone = 'a'", "unknown dimension 'zone'; stream hosts has dimensions: region, "
                                                  "dc, KEY", 28),
        ("SUM(cpu) OVER 1m > 1 WHERE region = 'a' AND Region = 'b'", "dimension region is filtered twice", 45),
        ("SUM(cpu) OVER 1m > 1 WHERE region IN ()", "IN needs at least one value", 39),
        ("SUM(cpu) OVER 1m > 1 WHERE region IN ('a',)", "a string in single quotes", 43),
        ("SUM(cpu) OVER 1m > 1 WHERE region IN ('a' 'b')", "expected ) or ','", 43),
        ("SUM(cpu) OVER 1m > 1 WHERE region = 'eu", "unterminated string", 37),
        ('SUM(cpu) OVER 1m > 1 WHERE region = "eu"', "strings are in single quotes", 37),
        ("SUM(cpu) OVER 1m > 1 WHERE region = eu", "a string in single quotes, as in 'XNAS', found 'eu'", 37),
        ("SUM(cpu) OVER 1m > 1 WHERE region = 'a\tb'", "control characters", 37),
        ("SUM(cpu) OVER 1m > 1 WHERE region > 'a'", "expected = or IN after region, found '>'", 35),
        ("SUM(cpu) OVER 1m > 1 WHERE dc = 'abcde'", "longer than the dimension's 4 characters", 33),
        ("SUM(cpu) OVER 1m > 1 WHERE", "expected a dimension (region, dc, KEY) or key", 27),
        ("SUM(cpu) OVER 1m > 1 WHERE region = 'a' AND", "expected a dimension", 44),
        ("SUM(cpu) OVER 1m > 1 WHERE key IN ('a') AND key = 'a'", "key is filtered twice", 45),
        ("SUM(cpu) OVER 1m > 1 WHERE key STARTS WITH 'a' AND key STARTS WITH 'b'", "STARTS WITH is given twice",
         52),
        ("SUM(cpu) OVER 1m > 1 WHERE key STARTS 'a'", "expected WITH", 39),
        ("SUM(cpu) OVER 1m > 1 WHERE key STARTS WITH ''", "a key prefix is not empty", 44),
        ("SUM(cpu) OVER 1m > 1 WHERE key IN ('ok', 'not ok')", "'not ok' is no key", 42),
        ("SUM(cpu) OVER 1m > 1 WHERE key STARTS WITH 'w' AND key IN ('web', 'db')", "'db' does not start with 'w'",
         67),
        ("SUM(cpu) OVER 1m > 1 WHERE region = 'a' FOR 1m", "WHERE comes last: write FOR before it", 41),
        ("SUM(cpu) OVER 1m > 1 WHERE region = 'a' extra", "unexpected 'extra' after the condition", 41),
    ],
)
def test_filter_errors_say_what_and_where(text: str, message: str, column: int) -> None:
    with pytest.raises(ConditionError) as info:
        parse_filtered(text, HOSTS)
    assert message in str(info.value)
    assert info.value.column == column


def test_trades_has_no_dimensions_and_a_key_list_is_never_dropped_unseen() -> None:
    with pytest.raises(ConditionError, match="stream trades has dimensions: none") as info:
        parse_condition("SUM(volume) OVER 1m > 1 WHERE exchange = 'XNAS'")
    assert info.value.column == 31
    with pytest.raises(ConditionError, match="give them as its keys"):
        parse_condition("SUM(volume) OVER 1m > 1 WHERE key IN ('AAPL')")  # only parse_filtered returns them
    assert parse_condition("SUM(volume) OVER 1m > 1 WHERE key STARTS WITH 'AA'").key_prefix == "AA"


def test_key_in_and_the_keys_field_intersect() -> None:
    assert combine_keys(None, None) is None
    assert combine_keys(["B", "A"], None) == ["A", "B"]
    assert combine_keys(None, frozenset({"B", "A"})) == ["A", "B"]
    assert combine_keys(["A", "B", "C"], frozenset({"B", "C", "D"})) == ["B", "C"]
    with pytest.raises(ConditionError, match="no key in common"):
        combine_keys(["A"], frozenset({"B"}))
    assert combine_keys(["AA1", "AA2"], frozenset({"AA1"}), "AA") == ["AA1"]
    with pytest.raises(ConditionError, match="the keys B do not start with 'A'"):
        combine_keys(["AA1", "AB", "B"], None, "A")


def test_explain_names_the_substream() -> None:
    text = explain(parse_condition("SUM(cpu) OVER 1m > 9 WHERE region IN ('eu', 'us') AND key STARTS WITH 'w'",
                                   HOSTS))
    assert text.endswith("— counting only the events of stream hosts whose region is one of 'eu', 'us'; only keys "
                         "starting with 'w'")
    assert "stream" not in explain(parse_condition("SUM(volume) OVER 1m > 9"))


BASES = ["SUM(cpu) OVER 1m > 9", "AVG(memMB) OVER 30s BETWEEN 1 AND 2", "MAX(cpu) - MIN(cpu) OVER 5m > 3%",
         "NO DATA FOR 5m", "COUNT(*) OVER LAST 10 EVENTS >= 3 FOR 1m", "LAST(cpu) OVER 1m CROSSES 50 DAMPEN 1m"]
values = st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=8)
dimension_filters = st.dictionaries(st.sampled_from(["region", "KEY"]), st.lists(values, min_size=1, max_size=3),
                                    max_size=2) | st.builds(lambda v: {"dc": v}, st.lists(values.map(lambda t: t[:4]),
                                                                                          min_size=1, max_size=2))
prefixes = st.none() | st.text("abcXYZ019._:-/", min_size=1, max_size=64)


@given(st.sampled_from(BASES), dimension_filters, prefixes)
def test_conditions_with_filters_round_trip(base: str, where: dict, prefix: str | None) -> None:
    condition = replace(parse_condition(base, HOSTS), where=tuple(where.items()), key_prefix=prefix)
    text = format_condition(condition)
    assert parse_condition(text, HOSTS) == condition
    assert format_condition(parse_condition(text, HOSTS)) == text
