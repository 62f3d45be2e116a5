"""Streams from the admin CLI and the service: topics made on Tansu, clear errors, refusals naming subscriptions."""

from __future__ import annotations

import json
import time

import pytest
import redis

from core.redis_schema import RedisKeys
from core.series_limit import SeriesLimit
from core.settings import Settings
from core.streams import TRADES, Attribute, StreamSchema
from evaluator.spark.registry import decode_registry
from ingest.kafka import topic_end_offsets
from subscriptions import admin, streams
from subscriptions.db import session_factory
from subscriptions.streams import PUBLISHER_PREFIX, StreamService
from tests.users import api_client, new_user


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """Stream topics of this test's own (the broker is shared by the test session)."""
    return settings.model_copy(update={"stream_topic_prefix": f"{settings.events_topic}.stream."})


@pytest.fixture
def cli(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setattr(admin, "get_settings", lambda: settings)
    return settings


def _run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = admin.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_create_list_show_evolve_and_delete_streams(cli: Settings, capsys: pytest.CaptureFixture) -> None:
    code, out, err = _run(capsys, "create-stream", "sensors", "--key", "sensor", "--time", "at", "--time-format",
                          "iso8601", "--attribute", "temperature:C:-40:85", "--attribute", "humidity:%:0:100",
                          "--optional-attribute", "battery:V", "--dimension", "site", "--partitions", "3",
                          "--retention-ms", "3600000")
    assert code == 0, err
    assert f"on topic {cli.stream_topic_prefix}sensors" in out
    assert sorted(topic_end_offsets(cli, f"{cli.stream_topic_prefix}sensors")) == [0, 1, 2]

    code, out, _ = _run(capsys, "list-streams")
    lines = out.splitlines()
    assert [line.split("\t")[0] for line in lines] == ["sensors", TRADES]
    assert "temperature [C], humidity [%], battery [V]?" in lines[0] and "dimensions: site" in lines[0]
    shown = json.loads(_run(capsys, "show-stream", "sensors")[1])
    assert shown["time_format"] == "iso8601" and shown["retention_ms"] == 3_600_000 and shown["version"] == 1
    assert shown["attributes"][0] == {"name": "temperature", "unit": "C", "min": -40.0, "max": 85.0,
                                      "required": True}

    assert _run(capsys, "add-attribute", "sensors", "pressure:hPa")[0] == 0
    assert _run(capsys, "remove-attribute", "sensors", "battery")[0] == 0
    shown = json.loads(_run(capsys, "show-stream", "sensors")[1])
    assert [a["name"] for a in shown["attributes"]] == ["temperature", "humidity", "pressure"]
    assert shown["attributes"][2]["required"] is False and shown["version"] == 3

    code, out, _ = _run(capsys, "create-publisher-token", "probe", "--stream", "sensors")
    assert code == 0 and out.strip().rsplit(": ", 1)[1].startswith(PUBLISHER_PREFIX)

    series = SeriesLimit(redis.Redis.from_url(cli.redis_url), cli)
    series.refused("sensors", ["probe-1"], [1_700_000_000_000])
    assert _run(capsys, "delete-stream", "sensors")[0] == 0
    assert _run(capsys, "list-streams")[1].split("\t")[0] == TRADES
    assert series.active("sensors") == 0, "a stream declared again under the name starts with no series"


def test_clear_errors(cli: Settings, capsys: pytest.CaptureFixture) -> None:
    code, _, err = _run(capsys, "create-stream", "Bad", "--attribute", "x")
    assert code == 2 and "error: name: String should match pattern" in err
    code, _, err = _run(capsys, "create-stream", "s", "--attribute", "x::5:1")
    assert code == 2 and "min 5 is above max 1" in err
    code, _, err = _run(capsys, "create-stream", "s", "--attribute", "x::low")
    assert code == 2 and "could not convert string to float" in err
    code, _, err = _run(capsys, "create-stream", "s")
    assert code == 2 and "attributes: Tuple should have at least 1 item" in err
    assert _run(capsys, "create-stream", "s", "--attribute", "x")[0] == 0
    code, _, err = _run(capsys, "create-stream", "s", "--attribute", "x")
    assert code == 2 and "a stream named 's' exists already" in err
    code, _, err = _run(capsys, "show-stream", "nope")
    assert code == 2 and "no stream named 'nope'" in err
    code, _, err = _run(capsys, "remove-attribute", "s", "y")
    assert code == 2 and "has no attribute 'y'" in err
    code, _, err = _run(capsys, "create-publisher-token", "p", "--stream", "nope")
    assert code == 2 and "no stream named 'nope'" in err
    code, _, err = _run(capsys, "delete-stream", TRADES)
    assert code == 3 and "cannot be deleted" in err


def test_removing_a_used_attribute_is_refused_with_the_subscriptions(cli: Settings,
                                                                     capsys: pytest.CaptureFixture) -> None:
    assert _run(capsys, "create-stream", "m", "--attribute", "x", "--attribute", "y")[0] == 0
    _, token = new_user(cli)
    with api_client(cli, token) as client:
        ids = [client.post("/api/subscriptions", json={"name": name, "stream": "m", "condition": condition}
                           ).json()["id"]
               for name, condition in (("swing", "MAX(x) - MIN(x) OVER 30m > 3%"),
                                       ("flow", "SUM(y) OVER 5m > 2e6"), ("busy", "COUNT(*) OVER 1m > 10"))]
    code, _, err = _run(capsys, "remove-attribute", "m", "x")
    assert code == 3 and f"used by subscriptions: #{ids[0]} swing" in err and "flow" not in err
    code, _, err = _run(capsys, "remove-attribute", TRADES, "price")  # trades' schema is the evaluator's own
    assert code == 3 and "schema is fixed" in err
    with session_factory(cli.database_url)() as session:
        service = StreamService(session, cli)
        assert service.used_by("m") == {f"#{ids[0]} swing": {"x"}, f"#{ids[1]} flow": {"y"},
                                        f"#{ids[2]} busy": set()}
        assert service.used_by("other") == {}
        assert service.get(TRADES).topic == cli.events_topic


def _registry(settings: Settings) -> tuple[dict[str, dict], int]:
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    keys = RedisKeys(settings)
    raw = client.hgetall(keys.stream_schemas)
    return {name: json.loads(payload) for name, payload in raw.items()}, int(client.get(keys.streams_version) or 0)


def test_every_stream_change_rewrites_the_registry_the_evaluator_reads(settings: Settings) -> None:
    with session_factory(settings.database_url)() as session:
        service = StreamService(session, settings)
        service.ensure_builtin()
        schemas, first = _registry(settings)
        assert set(schemas) == {TRADES} and first >= 1
        hosts = StreamSchema(name="hosts", attributes=(Attribute(name="cpu"),), retention_ms=60_000, partitions=1)
        service.create(hosts)
        schemas, second = _registry(settings)
        assert decode_registry({k: json.dumps(v) for k, v in schemas.items()})[0]["hosts"] == hosts
        assert second > first
        service.add_attribute("hosts", Attribute(name="mem", required=False))
        schemas, third = _registry(settings)
        assert [a["name"] for a in schemas["hosts"]["attributes"]] == ["cpu", "mem"] and third > second
        service.delete("hosts")
        schemas, fourth = _registry(settings)
        assert set(schemas) == {TRADES} and fourth > third


def test_streams_work_while_redis_is_down_and_the_registry_follows_once_it_answers(settings: Settings) -> None:
    down = settings.model_copy(update={"redis_url": "redis://127.0.0.1:1/0"})  # nothing listens on port 1
    hosts = StreamSchema(name="hosts", attributes=(Attribute(name="cpu"),), retention_ms=60_000, partitions=1)
    with session_factory(settings.database_url)() as session:
        started = time.monotonic()
        StreamService(session, down).create(hosts)  # the database is the truth: no error
        assert time.monotonic() - started < 5
        assert _registry(settings) == ({}, 0)
        streams._REGISTRY.clear()  # a new process (or REGISTRY_CHECK_S later): the first use publishes
        StreamService(session, settings).get("hosts")
    assert set(_registry(settings)[0]) == {TRADES, "hosts"}
    redis.Redis.from_url(settings.redis_url).delete(RedisKeys(settings).streams_version,
                                                    RedisKeys(settings).stream_schemas)  # Redis lost its data
    with session_factory(settings.database_url)() as session:
        streams._REGISTRY[(settings.redis_url, settings.redis_key())] = (True, time.monotonic() - 60)
        StreamService(session, settings).streams()
    assert set(_registry(settings)[0]) == {TRADES, "hosts"}
