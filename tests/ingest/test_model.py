from __future__ import annotations

import hashlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest import model
from ingest.model import MAX_REASON_CHARS, DeadLetter, Event, Heartbeat, RecordLimits, parse_event, parse_record
from tests.examples import examples


def test_valid_event_round_trips() -> None:
    event = parse_event(b'{"key": "AAPL", "ts": 1700000000000, "price": 190.5, "volume": 300}')
    assert event == Event(key="AAPL", ts=1_700_000_000_000, price=190.5, volume=300)
    assert parse_event(event.to_json()) == event


def test_iso_time_with_zone_is_accepted_and_naive_time_rejected() -> None:
    event = parse_event({"key": "A", "ts": "2026-01-02T09:30:00Z", "price": 1, "volume": 1})
    assert isinstance(event, Event) and event.ts == 1_767_346_200_000
    letter = parse_event({"key": "A", "ts": "2026-01-02T09:30:00", "price": 1, "volume": 1})
    assert isinstance(letter, DeadLetter) and "zone" in letter.reason


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"not json", "not JSON"),
        (b"[1, 2]", "expected a JSON object"),
        (b'{"key": "A", "ts": 1, "price": 1}', "volume: Field required"),
        (b'{"key": "A", "ts": 1, "price": -1, "volume": 1}', "price: Input should be greater than or equal to 0"),
        (b'{"key": "", "ts": 1, "price": 1, "volume": 1}', "key:"),
        (b'{"key": "A B", "ts": 1, "price": 1, "volume": 1}', "key: String should match pattern"),
        (b'{"key": "A", "ts": 1, "price": 1, "volume": 1, "extra": 2}', "extra: Extra inputs are not permitted"),
        (b'{"key": "A", "ts": 1, "price": NaN, "volume": 1}', "price: Input should be a finite number"),
    ],
)
def test_invalid_records_become_dead_letters_with_field_reasons(raw: bytes, reason: str) -> None:
    letter = parse_event(raw, source="file.jsonl:3")
    assert isinstance(letter, DeadLetter)
    assert reason in letter.reason
    assert letter.raw == raw.decode() and letter.source == "file.jsonl:3"
    assert json.loads(letter.to_json())["reason"] == letter.reason


def test_heartbeat_is_not_an_event() -> None:
    beat = Heartbeat(partition=2, ts=5)
    assert isinstance(parse_event(beat.to_json()), DeadLetter)
    assert Heartbeat.model_validate_json(beat.to_json()) == beat


LIMITS = RecordLimits(max_record_bytes=65_536, max_json_depth=32, max_value=1e15, dead_letter_raw_bytes=4_096)
VALID = b'{"key": "A", "ts": 1700000000000, "price": 1, "volume": 1}'


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"[" * 30_000 + b"]" * 30_000, "nested 30000 deep, more than the 32 allowed"),
        (b'{"a":' * 40 + b"1" + b"}" * 40, "nested 40 deep"),
        (b'{"key": "A", "ts": 99999999999999999999999, "price": 1, "volume": 1}', "ts: Input should be less than"),
        (b'{"key": "A", "ts": -1, "price": 1, "volume": 1}', "ts: Input should be greater than or equal to 0"),
        (b'{"key": "A", "ts": 1, "price": 1, "volume": 1.7e308}', "volume: Input should be less than or equal to 1e+15"),
        (b'{"key": "A", "ts": 1, "price": 1e16, "volume": 1}', "price: Input should be less than or equal to 1e+15"),
        (b"x" * 200_000, "record: 200000 bytes, more than the 65536 allowed"),
        (b'{"key": "A\xff", "ts": 1, "price": 1, "volume": 1}', "not UTF-8: byte 0xff at position 10"),
        (b'{"key": 5, "ts": 1, "price": 1, "volume": 1}', "key: Input should be a valid string"),
        (b'{"key": "A", "ts": true, "price": 1, "volume": 1}', "ts: Value error, expected epoch milliseconds"),
        (b'{"key": "A", "ts": 1, "price": true, "volume": 1}', "price: Input should be a valid number"),
        (b'{"key": "A", "ts": 1, "price": "1", "volume": 1}', "price: Input should be a valid number"),
        (b'{"key": "A", "ts": 1, "price": 1, "volume": {"a": 1}}', "volume: Input should be a valid number"),
        (b'{"key": "A", "ts": 1, "price": [' + b"0," * 20_000 + b'0], "volume": 1}', "price: Input should be a valid"),
        (b'{"key": "A", "ts": 1, "price": Infinity, "volume": 1e999}', "volume: Input should be a finite number"),
        (b'{"key": "A", "ts": 1, "price": 1, "volume": 1, "volume": 1e6}', "volume: field given more than once"),
        (b'{"key": "A", "key": "B", "ts": 1, "price": 1, "volume": 1}', "key: field given more than once"),
        (b'{"kind": "heartbeat", "partition": 0, "ts": 1e300}', "heartbeat: ts: Input should be a valid integer"),
        (b'{"kind": "heartbeat", "partition": 0, "ts": 1, "ts": 2}', "ts: field given more than once"),
        (b'"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["', "expected a JSON object"),
        (None, "record: empty value"),
    ],
)
def test_poison_records_become_dead_letters_that_fit(raw: bytes | None, reason: str) -> None:
    letter = parse_record(raw, source="t[0]@1", limits=LIMITS)
    assert isinstance(letter, DeadLetter)
    assert reason in letter.reason
    payload = raw or b""
    assert letter.raw_bytes == len(payload) and letter.raw_sha256 == hashlib.sha256(payload).hexdigest()
    assert len(letter.raw.encode()) <= 4 * LIMITS.dead_letter_raw_bytes  # \xNN escapes at worst
    assert len(letter.to_json()) < 6 * LIMITS.dead_letter_raw_bytes + 2 * MAX_REASON_CHARS + 500


def test_depth_is_checked_outside_strings_only() -> None:
    record = {"key": "A", "ts": 1, "price": 1, "volume": 1}
    assert isinstance(parse_record(json.dumps(record).encode(), limits=LIMITS), Event)
    nested_in_string = b'{"key": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[", "ts": 1, "price": 1, "volume": 1}'
    letter = parse_record(nested_in_string, limits=LIMITS)
    assert isinstance(letter, DeadLetter) and "key: String should match pattern" in letter.reason


def test_dead_letter_of_a_huge_record_keeps_its_start_length_and_digest() -> None:
    raw = bytes(range(256)) * 1_000  # control characters and invalid UTF-8: the worst case for JSON escaping
    letter = parse_record(raw, limits=LIMITS)
    assert isinstance(letter, DeadLetter)
    assert letter.raw_bytes == len(raw) and letter.raw_sha256 == hashlib.sha256(raw).hexdigest()
    assert letter.raw.startswith("\x00\x01") and len(letter.to_json()) < 1_000_000 // 20


@settings(max_examples=examples(300), deadline=None)
@given(st.one_of(st.binary(max_size=300), st.text(max_size=300).map(str.encode),
                 st.recursive(st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=5),
                              lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                          max_size=3),
                              max_leaves=20).map(lambda v: json.dumps(v).encode())))
def test_any_input_is_an_event_a_heartbeat_or_a_dead_letter(raw: bytes) -> None:
    parsed = parse_record(raw, limits=LIMITS)
    assert isinstance(parsed, Event | Heartbeat | DeadLetter)
    if isinstance(parsed, DeadLetter):
        assert parsed.raw_bytes == len(raw)


@settings(max_examples=examples(300), deadline=None)
@given(key=st.sampled_from(["A", "", "B.C", 7, None]),
       ts=st.one_of(st.integers(-5, 2**70), st.sampled_from(["2026-01-02T09:30:00Z", True, 1.5, "12"])),
       price=st.one_of(st.floats(allow_nan=True), st.integers(-5, 2**60), st.sampled_from(["1", True, None])),
       volume=st.one_of(st.floats(min_value=0, max_value=2e15), st.integers(0, 2**55)),
       extra=st.sampled_from([b"", b', "volume": 1', b', "x": 1']))
def test_fast_and_careful_paths_agree(key, ts, price, volume, extra: bytes) -> None:
    """Records as producers write them take pydantic's JSON parser; any other way gives the same answer."""
    try:
        body = json.dumps({"key": key, "ts": ts, "price": price, "volume": volume}).encode()
    except ValueError:
        return
    raw = body[:-1] + extra + b"}"
    fast = parse_record(raw, limits=LIMITS)
    careful = model._parse_carefully(raw, "unknown", LIMITS)
    assert type(fast) is type(careful)
    if isinstance(fast, DeadLetter):
        assert fast.reason.split(":")[0] == careful.reason.split(":")[0]
    else:
        assert fast == careful
