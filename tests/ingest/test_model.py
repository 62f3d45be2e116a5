from __future__ import annotations

import json

import pytest

from ingest.model import DeadLetter, Event, Heartbeat, parse_event


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
