"""Stream schemas, their evolution rules, batch splitting, and the vectorised validator against the reference."""

from __future__ import annotations

import json
from datetime import datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from core.settings import Settings
from core.streams import (
    MAX_TS,
    Attribute,
    BatchError,
    Dimension,
    IncompatibleChange,
    RecordLimits,
    StreamSchema,
    StreamValidator,
    check_compatible,
    split_json_array,
    split_ndjson,
    topic_name,
    trades_schema,
)
from ingest.model import Event
from tests.examples import examples

LIMITS = RecordLimits(max_record_bytes=512, max_json_depth=8, max_value=1e15)
TRADES = trades_schema(Settings())
HOSTS = StreamSchema(
    name="hosts", key_field="host", time_field="time", time_format="iso8601",
    attributes=(Attribute(name="cpu", unit="%", min=0, max=100), Attribute(name="temp", min=-40, max=85),
                Attribute(name="mem", required=False)),
    dimensions=(Dimension(name="region", max_length=4), Dimension(name="rack", required=True)),
    retention_ms=3_600_000, partitions=2)


def test_trades_is_the_event_record_on_the_events_topic() -> None:
    settings = Settings(events_topic="ev", stream_topic_prefix="s.")
    assert topic_name("trades", settings) == "ev" and topic_name("hosts", settings) == "s.hosts"
    validator = StreamValidator(TRADES, LIMITS)
    record = '{"key":"AAPL","ts":1700000000000,"price":190.5,"volume":100}'
    batch = validator.validate([record, " " + record])
    assert batch.accepted == 2 and batch.keys == ["AAPL", "AAPL"]
    for wire in batch.records:  # the evaluator reads it as it reads an Event today
        assert Event.model_validate_json(wire) == Event.model_validate_json(record)
    assert validator.judge(record) == ("AAPL", Event.model_validate_json(record).model_dump_json())


def test_schema_declarations_are_checked() -> None:
    base = HOSTS.model_dump()
    for change, message in (
        ({"name": "Hosts"}, "should match pattern"),
        ({"dimensions": [{"name": "cpu"}]}, "cpu given more than once"),
        ({"time_field": "host"}, "host given more than once"),
        ({"attributes": [{"name": "ts"}]}, "may not use them"),
        ({"key_field": "ts"}, "may not use them"),
        ({"attributes": [{"name": "kind"}]}, "reserved"),
        ({"attributes": [{"name": "x", "min": 2, "max": 1}]}, "min 2 is above max 1"),
        ({"attributes": [{"name": "x", "max": float("inf")}]}, "finite number"),
        ({"attributes": []}, "at least 1 item"),
    ):
        with pytest.raises(ValidationError, match=message):
            StreamSchema.model_validate({**base, **change})
    wire = HOSTS.wire()
    assert (wire.key_field, wire.time_field, wire.time_format) == ("key", "ts", "epoch_ms")


def test_compatible_changes_and_refusals_naming_the_subscriptions() -> None:
    users = {"#1 hot": {"cpu"}, "#2 cold": {"temp"}, "#3 both": {"cpu", "temp"}}
    attributes = (*HOSTS.attributes, Attribute(name="disk", required=False))
    check_compatible(HOSTS, HOSTS.model_copy(update={"attributes": attributes}), users)  # adding: fine
    dimensions = (*HOSTS.dimensions, Dimension(name="zone"))
    check_compatible(HOSTS, HOSTS.model_copy(update={"dimensions": dimensions}), users)
    check_compatible(HOSTS, HOSTS.model_copy(update={"attributes": HOSTS.attributes[:2]}), users)  # mem: unused
    with pytest.raises(IncompatibleChange) as refused:
        check_compatible(HOSTS, HOSTS.model_copy(update={"attributes": HOSTS.attributes[1:]}), users)
    assert refused.value.subscriptions == ["#1 hot", "#3 both"] and "cpu" in str(refused.value)
    narrower = (HOSTS.attributes[0], Attribute(name="temp", min=0, max=85), HOSTS.attributes[2])
    with pytest.raises(IncompatibleChange) as refused:
        check_compatible(HOSTS, HOSTS.model_copy(update={"attributes": narrower}), users)
    assert refused.value.subscriptions == ["#2 cold", "#3 both"]
    with pytest.raises(IncompatibleChange, match="must be optional"):
        check_compatible(HOSTS, HOSTS.model_copy(update={"attributes": (*HOSTS.attributes, Attribute(name="d"))}),
                         {})
    for field, value in (("time_format", "epoch_ms"), ("partitions", 3), ("key_field", "node"),
                         ("retention_ms", 60_000)):
        with pytest.raises(IncompatibleChange, match=f"{field} cannot change"):
            check_compatible(HOSTS, HOSTS.model_copy(update={field: value}), {})


def test_splitting_batches() -> None:
    assert split_ndjson(b'{"a":1}\r\n\n  \n{"b":2}') == ['{"a":1}', '{"b":2}']
    assert split_ndjson(b'{"a":1}\n\xff\n') == ['{"a":1}', b"\xff"]
    assert split_json_array(b' [ {"a": [1, 2]} , "x",3 ] ') == ['{"a": [1, 2]}', '"x"', "3"]
    assert split_json_array(b"[]") == []
    for body, message in ((b'{"a":1}', "expected a JSON array"), (b"[1,", "record 1: not JSON"),
                          (b"[1 2]", "expected ',' or ']'"), (b"[1] x", "after the array"),
                          (b"[\xff]", "not UTF-8"), (b"", "expected a JSON array")):
        with pytest.raises(BatchError, match=message):
            split_json_array(body)


def test_reasons_are_field_level() -> None:
    validator = StreamValidator(HOSTS, LIMITS)
    good = {"host": "h1", "time": "2026-01-02T09:30:00Z", "cpu": 5, "temp": 20, "rack": "r1"}
    cases = [
        ({**good, "cpu": 101}, "cpu: Input should be less than or equal to 100"),
        ({**good, "cpu": True}, "cpu: Input should be a valid number"),
        ({**good, "time": 1_700_000_000_000}, "time: Value error, expected an ISO-8601 timestamp"),
        ({**good, "time": "2026-01-02T09:30:00"}, "need a zone offset"),
        ({**good, "time": "1969-12-31T23:59:59Z"}, "from 1970-01-01"),
        ({**good, "region": "toolong"}, "region: String should have at most 4 characters"),
        ({k: v for k, v in good.items() if k != "rack"}, "rack: Field required"),
        ({**good, "extra": 1}, "extra: Extra inputs are not permitted"),
        ({**good, "host": "bad key"}, "host: String should match pattern"),
        ({**good, "mem": 1e16}, "mem: Value error, Input should be between -1e+15 and 1e+15"),
    ]
    batch = validator.validate([json.dumps(r) for r, _ in cases] + ['{"host":"a","host":"b"}', "[1]", "{" * 20,
                                                                     "x" * 600])
    reasons = [r.reason for r in batch.rejected]
    assert batch.accepted == 0 and [r.index for r in batch.rejected] == list(range(len(cases) + 4))
    for (_, expected), reason in zip(cases, reasons, strict=False):
        assert expected in reason, (expected, reason)
    assert reasons[-4:] == ["host: field given more than once", "record: expected a JSON object",
                            "record: JSON nested 20 deep, more than the 8 allowed",
                            "record: 600 bytes, more than the 512 allowed"]


# -- the vectorised validator answers exactly as the per-record model ----------------------------------------------

_keys = st.one_of(st.sampled_from(["AAPL", "k.1", "a/b:c-d_e", "x" * 64, "x" * 65, "", "bad key", "é"]),
                  st.text(alphabet="AZaz09._:-/ \"\\", min_size=0, max_size=6))
_numbers = st.one_of(
    st.integers(-10**17, 10**17), st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -0.0, 1e15, 1e15 + 1, -1e15, 100, 100.0000001, 85, 85.5, -40, -40.1, 1e99, 1e-7]),
    st.sampled_from([True, None, "12", [], {}]))
_iso = st.one_of(
    st.sampled_from(["2026-01-02T09:30:00Z", "2026-01-02T09:30:00.5+01:00", "2026-02-29T00:00:00Z",
                     "2024-02-29T23:59:59.999-23:59", "9999-12-31T23:59:59.999Z", "9999-12-31T23:59:59.999-01:00",
                     "0000-01-01T00:00:00Z", "1970-01-01T00:00:00Z", "1969-12-31T23:59:59.999Z",
                     "2026-01-02T24:00:00Z", "2026-01-02 09:30:00Z", "2026-01-02T09:30:00", "2026-01-02T09:30Z",
                     "2026-01-02T09:30:00.1234Z", "2026-13-01T00:00:00Z", "20260102T093000Z"]),
    st.datetimes().map(lambda d: d.isoformat() + "Z"), st.integers(0, MAX_TS + 1))
_epoch = st.one_of(st.integers(-2, MAX_TS + 2), st.sampled_from([MAX_TS, 0, 1.0, True, "1", "2026-01-02T09:30:00Z"]))
_texts = st.one_of(st.sampled_from(["eu", "us-east", "", 'a"b', "a\\b", "ünï", "\u0001"]), st.text(max_size=6))


_good_keys = st.text(alphabet="ABCxyz019._:-/", min_size=1, max_size=64)
_good_iso = st.builds(
    lambda d, digits, zone: d.isoformat(timespec="milliseconds")[: 20 + digits].rstrip(".") + zone,
    st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(9998, 12, 31)), st.integers(0, 3),
    st.sampled_from(["Z", "+00:00", "+05:30", "-23:59", "+14:00"]))
_good_texts = st.text(alphabet="abcü-_ .", max_size=4)


def _number(attribute: Attribute) -> st.SearchStrategy[float]:
    low = attribute.min if attribute.min is not None else -1e15
    high = attribute.max if attribute.max is not None else 1e15
    return st.one_of(st.floats(low, high), st.integers(int(low), int(high)), st.sampled_from([low, high]))


def _record(schema: StreamSchema, draw: st.DrawFn) -> str:
    """A record of ``schema``, each field valid three times in four, hostile otherwise."""

    def pick(good: st.SearchStrategy, hostile: st.SearchStrategy) -> object:
        return draw(good if draw(st.integers(0, 3)) else hostile)

    time = (pick(_good_iso, _iso) if schema.time_format == "iso8601"
            else pick(st.integers(0, MAX_TS), _epoch))
    fields: dict[str, object] = {schema.key_field: pick(_good_keys, _keys), schema.time_field: time}
    for attribute in schema.attributes:
        fields[attribute.name] = pick(_number(attribute), _numbers)
    for dimension in schema.dimensions:
        fields[dimension.name] = pick(_good_texts, _texts)
    names = list(fields)
    for name in names:  # leave some out
        if draw(st.integers(0, 15)) == 0:
            del fields[name]
    if draw(st.integers(0, 15)) == 0:
        fields[draw(st.sampled_from(["extra", "kind", "key", "ts"]))] = 1
    items = list(fields.items())
    if draw(st.integers(0, 7)) == 0:
        items = draw(st.permutations(items))
    space = draw(st.sampled_from(["", " ", "\t", "\n "]))
    text = "{" + f",{space}".join(f'{space}{json.dumps(k)}{space}:{space}{json.dumps(v)}' for k, v in items) + "}"
    if draw(st.integers(0, 20)) == 0:
        text = text.replace(",", ",,", 1)
    return text


@st.composite
def _batches(draw: st.DrawFn, schema: StreamSchema) -> list[str | bytes]:
    records: list[str | bytes] = []
    for _ in range(draw(st.integers(0, 12))):
        kind = draw(st.integers(0, 20))
        if kind == 0:
            records.append(draw(st.binary(max_size=12)))
        elif kind == 1:
            records.append(draw(st.text(max_size=20)))
        else:
            records.append(_record(schema, draw))
    return records


def _agrees(validator: StreamValidator, records: list[str | bytes]) -> None:
    batch = validator.validate(records)
    values = [r.encode("utf-8", "surrogatepass") if isinstance(r, str) else r for r in records]
    from_kafka = validator.validate_values(values)  # what a topic reader has: the same answers
    assert from_kafka.indices.tolist() == batch.indices.tolist() and from_kafka.records == batch.records
    assert [(r.index, r.reason) for r in from_kafka.rejected] == [(r.index, r.reason) for r in batch.rejected]
    verdicts = [validator.judge(r) for r in records]
    accepted = [i for i, v in enumerate(verdicts) if not isinstance(v, str)]
    assert batch.indices.tolist() == accepted
    assert batch.keys == [verdicts[i][0] for i in accepted]
    for wire, i in zip(batch.records, accepted, strict=True):
        assert json.loads(wire) == json.loads(verdicts[i][1]), (records[i], wire, verdicts[i][1])
    assert [(r.index, r.reason, r.raw) for r in batch.rejected] == [
        (i, v, records[i]) for i, v in enumerate(verdicts) if isinstance(v, str)]


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_batches(TRADES))
def test_vectorised_trades_validation_is_the_reference(records: list[str | bytes]) -> None:
    _agrees(StreamValidator(TRADES, LIMITS), records)


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_batches(HOSTS))
def test_vectorised_hosts_validation_is_the_reference(records: list[str | bytes]) -> None:
    _agrees(StreamValidator(HOSTS, LIMITS), records)


def test_the_fast_path_takes_plain_records() -> None:
    """Plain records are proven on columns (not judged one by one), so the property tests cover that path."""
    validator = StreamValidator(HOSTS, LIMITS)
    plain = '{"host":"h","time":"2026-01-02T09:30:00.5+01:00","cpu":1e1,"temp":-4,"mem":-0.5,"region":"eu","rack":"ü"}'
    proven, keys, wires = validator._prove(__import__("pyarrow").array([plain, plain.replace("1e1", "1e3")]))
    assert proven.tolist() == [True, False] and keys == ["h"]
    assert json.loads(wires[0]) == {"key": "h", "ts": 1_767_342_600_500, "cpu": 10.0, "temp": -4, "mem": -0.5,
                                    "region": "eu", "rack": "ü"}
