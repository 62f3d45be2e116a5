"""Replaying a file publishes the good rows and dead-letters the bad ones with reasons, losing none."""

from __future__ import annotations

import json
from pathlib import Path

from kafka import TopicPartition

from core.settings import Settings
from ingest.__main__ import run_replay
from ingest.kafka import ensure_topics, new_consumer, topic_end_offsets


def read_topic(settings: Settings, topic: str) -> list[bytes]:
    ends = topic_end_offsets(settings, topic)
    consumer = new_consumer(settings)
    tps = [TopicPartition(topic, p) for p in ends]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    values: list[bytes] = []
    while sum(consumer.position(tp) for tp in tps) < sum(ends.values()):
        for records in consumer.poll(timeout_ms=500).values():
            values += [r.value for r in records]
    consumer.close()
    return values


def events_on(settings: Settings, topic: str) -> list[dict]:
    """The records on ``topic`` without the heartbeats (publishers send them to every partition)."""
    return [record for record in map(json.loads, read_topic(settings, topic)) if "kind" not in record]


def test_replay_routes_bad_rows_to_dead_letter(settings: Settings, tmp_path: Path, monkeypatch) -> None:
    ensure_topics(settings)
    csv = tmp_path / "trades.csv"
    csv.write_text(
        "key,ts,price,volume\n"
        "AAPL,1700000000000,190.1,100\n"
        "MSFT,2026-01-02T09:30:00Z,410,5\n"
        "AAPL,1700000001000,-3,100\n"
        "BAD KEY,1700000002000,1,1\n"
        "NVDA,1700000003000,120,7\n"
    )
    monkeypatch.setattr("ingest.__main__.get_settings", lambda: settings)
    monkeypatch.setattr("ingest.__main__.REPLAY_BATCH", 2)  # rows judged in several batches, indices per batch
    run_replay(csv)
    events = [json.loads(v) for v in read_topic(settings, settings.events_topic)]
    dead = [json.loads(v) for v in read_topic(settings, settings.dead_letter_topic)]
    assert sorted(e["key"] for e in events) == ["AAPL", "NVDA"]
    assert {"key": "NVDA", "ts": 1700000003000, "price": 120, "volume": 7} in events  # the wire form
    # The trades stream's time is epoch ms: an ISO time is refused as the HTTP path refuses it.
    reasons = {d["source"]: d["reason"] for d in dead}
    assert sorted(reasons) == ["stream trades: trades.csv:3", "stream trades: trades.csv:4",
                               "stream trades: trades.csv:5"]
    assert reasons["stream trades: trades.csv:3"].startswith("ts: ")
    assert reasons["stream trades: trades.csv:4"] == "price: Input should be greater than or equal to 0"
    assert reasons["stream trades: trades.csv:5"].startswith("key: String should match pattern")


def test_jsonl_replay_and_heartbeats(settings: Settings, tmp_path: Path, monkeypatch) -> None:
    ensure_topics(settings)
    jsonl = tmp_path / "events.jsonl"
    jsonl.write_text('{"key":"A","ts":1,"price":1,"volume":1}\n\nnot json\n')
    monkeypatch.setattr("ingest.__main__.get_settings", lambda: settings)
    run_replay(jsonl)
    from ingest.publisher import EventPublisher

    with EventPublisher(settings) as publisher:
        publisher.heartbeat(123)
    values = [json.loads(v) for v in read_topic(settings, settings.events_topic)]
    assert sum(1 for v in values if v.get("kind") == "heartbeat") == settings.event_partitions
    assert {v["partition"] for v in values if v.get("kind") == "heartbeat"} == set(range(settings.event_partitions))
    dead = [json.loads(v) for v in read_topic(settings, settings.dead_letter_topic)]
    assert [d["source"] for d in dead] == ["stream trades: events.jsonl:3"] and dead[0]["reason"].startswith("not JSON")
