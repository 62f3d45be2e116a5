"""The Spark job's parser without Spark: a record that breaks it costs only itself; the clock it judges by is
the batch's."""

from __future__ import annotations

import json

import pandas as pd
import pyarrow as pa
import pytest
import redis

from core.redis_schema import RedisKeys
from core.settings import Settings
from core.streams import Attribute, Dimension, StreamSchema
from evaluator import records as parse  # the judge the Spark parser runs (evaluator.spark.parse)
from evaluator.spark.parse import NO_PARTITION, PaneParser
from evaluator.spark.stream_parse import StreamPaneParser
from ingest.kafka import ensure_topics
from ingest.model import Event, Heartbeat
from tests.ingest.test_publisher import read_topic

NOW = 1_700_000_000_000


def frame(values: list[bytes], now: int = NOW) -> pd.DataFrame:
    return pd.DataFrame({"topic": "t", "partition": 2, "offset": range(len(values)), "value": values,
                         "value_bytes": [len(v) for v in values], "value_sha256": [None] * len(values), "now": now})


def run(parser: PaneParser, raw: pd.DataFrame) -> pd.DataFrame:
    """``parser`` on one batch of ``raw`` as Spark runs it (mapInArrow); its pane rows as the operator reads them."""
    [out] = parser(iter([pa.RecordBatch.from_pandas(raw, preserve_index=False)]))
    return out.to_pandas()


def test_a_record_that_breaks_the_parser_costs_only_itself(settings: Settings,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    ensure_topics(settings)
    real = parse.parse_record

    def fragile(value, source, limits):  # a parser bug that one record triggers
        if b"boom" in value:
            raise RuntimeError("boom")
        return real(value, source, limits)

    monkeypatch.setattr(parse, "parse_record", fragile)
    skew = settings.max_future_skew_ms
    records = [
        Event(key="A", ts=NOW - 5_000, price=1, volume=2).to_json(),
        b'{"key": "boom"}',
        Event(key="A", ts=NOW + skew + 1, price=1, volume=2).to_json(),  # just beyond the skew
        Event(key="B", ts=NOW + skew, price=1, volume=3).to_json(),  # just within it
        Heartbeat(partition=2, ts=NOW + skew + 1).to_json(),
    ]
    out = run(PaneParser(settings, (0,)), frame(records))
    panes = out[out["partition"] == NO_PARTITION]
    assert sorted(zip(panes["key"], panes["sum_volume"], strict=True)) == [("A", 2.0), ("B", 3.0)]
    # refused times are no progress, and accepted ones ahead of the clock count up to it only (docs/clock.md)
    assert out.loc[out["partition"] == 2, "progress"].tolist() == [NOW + settings.clock_tolerance_ms]

    letters = {json.loads(v)["source"]: json.loads(v)["reason"] for v in read_topic(settings, settings.dead_letter_topic)}
    assert letters["t[2]@1"] == "internal: RuntimeError: boom"
    assert "event time" in letters["t[2]@2"] and "heartbeat time" in letters["t[2]@4"]
    stats = redis.Redis.from_url(settings.redis_url, decode_responses=True).hgetall(RedisKeys(settings).evaluator_stats)
    assert {k: int(stats[k]) for k in ("dead_lettered", "future_events_refused", "future_heartbeats_refused")} == {
        "dead_lettered": 3, "future_events_refused": 1, "future_heartbeats_refused": 1}


def test_events_of_new_series_beyond_the_stream_limit_are_dead_lettered_and_the_rest_go_on(
        settings: Settings) -> None:
    """A publisher sending a new key with every event (core.series_limit): the series already admitted keep their
    events; the new ones beyond the limit are dead letters naming the limit, counted as series_refused."""
    ensure_topics(settings)
    settings = settings.model_copy(update={"stream_max_series": 2})
    first = [Event(key=k, ts=NOW - 1_000, price=1, volume=1).to_json() for k in ("A", "B")]
    run(PaneParser(settings, (0,)), frame(first))
    hostile = [Event(key=f"X{i}", ts=NOW, price=1, volume=1).to_json() for i in range(20)]
    legit = [Event(key=k, ts=NOW, price=1, volume=5).to_json() for k in ("A", "B")]
    out = run(PaneParser(settings, (0,)), frame(hostile[:10] + legit + hostile[10:]))
    panes = out[out["partition"] == NO_PARTITION]
    assert sorted(zip(panes["key"], panes["sum_volume"], strict=True)) == [("A", 5.0), ("B", 5.0)]
    assert out.loc[out["partition"] == 2, "progress"].tolist() == [NOW], "refused events still show the clock moved"

    letters = [json.loads(v) for v in read_topic(settings, settings.dead_letter_topic)]
    assert sorted(letter["source"] for letter in letters) == sorted(f"t[2]@{o}" for o in (*range(10), *range(12, 22)))
    assert all(letter["reason"].startswith("series: a new series (key 'X") and "TOCSIN_STREAM_MAX_SERIES"
               in letter["reason"] for letter in letters)
    stats = redis.Redis.from_url(settings.redis_url, decode_responses=True).hgetall(RedisKeys(settings).evaluator_stats)
    assert (int(stats["series_refused"]), int(stats["dead_lettered"])) == (20, 20)


def test_a_new_dimension_value_with_every_event_cannot_grow_a_declared_stream_without_bound(
        settings: Settings) -> None:
    """The cell-cardinality attack on a declared stream: each event names a new region, so each is its own cell
    (evaluator.views). Beyond the limit its events are refused; the host's regular cell goes on."""
    ensure_topics(settings)
    settings = settings.model_copy(update={"stream_max_series": 3})
    schema = StreamSchema(name="hosts", attributes=(Attribute(name="cpu"),), dimensions=(Dimension(name="region"),),
                          retention_ms=60_000, partitions=1)
    parser = StreamPaneParser(settings, (0,), schema)
    regular = json.dumps({"key": "web-1", "ts": NOW - 1, "cpu": 50, "region": "eu"}).encode()
    run(parser, frame([regular]))
    hostile = [json.dumps({"key": "web-1", "ts": NOW, "cpu": 99, "region": f"r{i}"}).encode() for i in range(50)]
    out = run(parser, frame([*hostile, regular]))
    panes = out[out["partition"] == NO_PARTITION]
    assert len(panes) == 3, "the regular cell and the two new ones the limit had room for"
    assert 50.0 in panes["max_cpu"].tolist()
    letters = [json.loads(v) for v in read_topic(settings, settings.dead_letter_topic)]
    assert len(letters) == 48
    assert all(letter["source"].startswith("stream hosts: ") and "dimensions {'region': 'r" in letter["reason"]
               for letter in letters)


def test_a_worker_hashes_each_key_to_its_shard_once_across_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spark unpickles the parser afresh for every task: what a worker learnt of its keys' shards must outlive it."""
    calls: list[str] = []
    real = parse.shard_of

    def counted(key: str, shard_ids: tuple[int, ...]) -> int:
        calls.append(key)
        return real(key, shard_ids)

    monkeypatch.setattr(parse, "shard_of", counted)
    monkeypatch.setattr(parse, "_SHARD_OF", {})
    events = pd.DataFrame({"key": ["A", "B", "A"], "ts": [NOW, NOW, NOW + 1], "price": 1.0, "volume": 1.0})
    for _ in range(3):  # three tasks, three unpickled parsers
        rows = PaneParser(Settings(), (0, 1, 2))._frame(events, {}).to_pandas()
        assert rows["shard"].tolist() == [real("A", (0, 1, 2)), real("B", (0, 1, 2))]
    assert sorted(calls) == ["A", "B"]


def test_what_a_worker_remembers_of_its_keys_shards_is_bounded_by_the_active_series(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream whose keys turn over must not grow a worker's memory: beyond the series limit it starts again."""
    monkeypatch.setattr(parse, "_SHARD_OF", {})
    parser = PaneParser(Settings(stream_max_series=2), (0, 1))
    for keys in (["A", "B", "C"], ["D"]):
        parser._frame(pd.DataFrame({"key": keys, "ts": NOW, "price": 1.0, "volume": 1.0}), {})
    assert set(parse._SHARD_OF[(0, 1)]) == {"D"}
