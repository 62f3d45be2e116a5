"""The demo streams' publishers on real Tansu: host metrics (``hosts``) beside the market (``trades``), judged by
the stream's schema as the HTTP path judges them, rejects dead-lettered with reasons."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from core.settings import Settings
from core.streams import RecordLimits, StreamValidator, topic_name, trades_schema
from ingest.__main__ import run_feed, run_hosts, run_replay
from ingest.hosts import HOSTS, HostMetrics, hosts_schema, iso_ms
from ingest.kafka import ensure_topics
from ingest.streams import StreamPublisher
from tests.ingest.test_publisher import read_topic


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """Stream topics of this test's own; the feeds quick and without a metrics port."""
    isolated = settings.model_copy(update={"stream_topic_prefix": f"{settings.events_topic}.stream.",
                                           "hosts_feed_interval_ms": 50, "hosts_feed_hosts": 5,
                                           "metrics_port_hosts_feed": 0, "feed_rate": 500, "feed_symbols": 20})
    hosts = topic_name(HOSTS, isolated)
    ensure_topics(isolated, {isolated.events_topic: isolated.event_partitions, hosts: isolated.event_partitions,
                             isolated.dead_letter_topic: 1})
    return isolated


def test_the_host_fleet_reports_valid_records_with_bursts_and_in_its_own_schema(settings: Settings) -> None:
    fleet = HostMetrics(hosts=8, seed=3, start_ms=1_767_346_200_000, interval_ms=1_000, burst_probability=0.2)
    validator = StreamValidator(hosts_schema(settings), RecordLimits.of(settings))
    reports = [fleet.advance() for _ in range(50)]
    batch = validator.validate([r for report in reports for r in report])
    assert batch.rejected == [] and batch.accepted == 400
    first = [json.loads(r) for r in reports[0]]
    assert [r["host"] for r in first] == fleet.names and len(set(fleet.names)) == 8
    assert {r["time"] for r in first} == {"2026-01-02T09:30:01.000Z"}
    assert {r["region"] for r in first} == {"eu-west", "us-east", "ap-south"}
    wire = [json.loads(w) for w in batch.records]
    assert wire[0]["ts"] == 1_767_346_201_000 and "time" not in wire[0]  # the wire form: key and ts
    assert max(w["cpu"] for w in wire) >= 85  # bursts, for a demo alert to catch
    assert HostMetrics(hosts=8, seed=3).advance() == HostMetrics(hosts=8, seed=3).advance()  # deterministic
    trades = StreamValidator(trades_schema(settings), RecordLimits.of(settings)).validate(reports[0])
    assert trades.accepted == 0 and "host: Extra inputs are not permitted" in trades.rejected[0].reason
    assert iso_ms(0) == "1970-01-01T00:00:00.000Z"


def test_a_stream_publisher_writes_wire_records_and_dead_letters_what_the_schema_refuses(settings: Settings) -> None:
    host = {"host": "web-01", "time": "2026-01-02T09:30:00Z", "cpu": 42.5, "mem": 61, "disk": 70, "region": "eu-west"}
    trade = {"key": "AAPL", "ts": 1_700_000_000_000, "price": 190.5, "volume": 100}
    with StreamPublisher(settings, hosts_schema(settings)) as publisher:
        batch = publisher.publish_records(
            [json.dumps(host), json.dumps({**host, "cpu": 140}), json.dumps(trade), "{not json",
             json.dumps({**host, "host": "db-01", "time": 1_767_346_200_000})],
            ["collector 0", "collector 1", "collector 2", "collector 3", "collector 4"])
        assert batch.accepted == 1 and publisher.published == 1 and publisher.dead_lettered == 4
        publisher.heartbeat(1_767_346_200_000)
    values = [json.loads(v) for v in read_topic(settings, topic_name(HOSTS, settings))]
    events = [v for v in values if v.get("kind") != "heartbeat"]
    assert events == [{"key": "web-01", "ts": 1_767_346_200_000, "cpu": 42.5, "mem": 61, "disk": 70,
                       "region": "eu-west"}]
    assert {v["partition"] for v in values if v.get("kind") == "heartbeat"} == set(range(settings.event_partitions))
    dead = {d["source"]: d for d in (json.loads(v) for v in read_topic(settings, settings.dead_letter_topic))}
    assert dead["stream hosts: collector 1"]["reason"] == "cpu: Input should be less than or equal to 100"
    assert "host: Field required" in dead["stream hosts: collector 2"]["reason"]  # valid for trades, not hosts
    assert json.loads(dead["stream hosts: collector 2"]["raw"]) == trade  # the record as sent, nothing lost
    assert dead["stream hosts: collector 3"]["reason"].startswith("not JSON")
    assert dead["stream hosts: collector 4"]["reason"].startswith("time: ")  # epoch ms where ISO is declared
    assert read_topic(settings, settings.events_topic) == []  # nothing on the other stream


def test_the_host_metrics_feed_and_a_replay_into_hosts(settings: Settings, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("ingest.__main__.get_settings", lambda: settings)
    run_hosts(duration_s=0.5)
    published = [json.loads(v) for v in read_topic(settings, topic_name(HOSTS, settings))]
    reports = [v for v in published if v.get("kind") != "heartbeat"]
    assert len(reports) >= settings.hosts_feed_hosts and len(reports) % settings.hosts_feed_hosts == 0
    assert {r["key"] for r in reports} == {"web-01", "db-01", "cache-01", "batch-01", "web-02"}
    assert all(0 <= r[name] <= 100 for r in reports for name in ("cpu", "mem", "disk"))
    assert any(v.get("kind") == "heartbeat" for v in published)
    assert read_topic(settings, settings.dead_letter_topic) == []

    rows = tmp_path / "hosts.csv"
    rows.write_text("host,time,cpu,mem,disk,region\n"
                    "web-09,2026-01-02T09:30:00+01:00,12,30,40,eu-west\n"
                    "web-09,2026-01-02T09:30:01+01:00,12,30,140,eu-west\n")
    run_replay(rows, HOSTS)
    replayed = [json.loads(v) for v in read_topic(settings, topic_name(HOSTS, settings))]
    assert {"key": "web-09", "ts": int(datetime.fromisoformat("2026-01-02T08:30:00+00:00").timestamp() * 1000),
            "cpu": 12, "mem": 30, "disk": 40, "region": "eu-west"} in replayed
    dead = [json.loads(v) for v in read_topic(settings, settings.dead_letter_topic)]
    assert [(d["source"], d["reason"]) for d in dead] == [
        ("stream hosts: hosts.csv:3", "disk: Input should be less than or equal to 100")]


def test_the_market_feed_publishes_through_the_trades_schema(settings: Settings, monkeypatch) -> None:
    monkeypatch.setattr("ingest.__main__.get_settings", lambda: settings)
    run_feed(duration_s=0.6)
    values = [json.loads(v) for v in read_topic(settings, settings.events_topic)]
    events = [v for v in values if v.get("kind") != "heartbeat"]
    assert events and all(set(e) == {"key", "ts", "price", "volume"} for e in events)
    validator = StreamValidator(trades_schema(settings).wire(), RecordLimits.of(settings))
    assert validator.validate([json.dumps(e) for e in events]).rejected == []
    assert read_topic(settings, settings.dead_letter_topic) == []
