"""The Spark job's parser without Spark: a record that breaks it costs only itself; the clock it judges by is
the batch's."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import redis

from core.redis_schema import RedisKeys
from core.settings import Settings
from evaluator.spark import parse
from evaluator.spark.parse import NO_PARTITION, PaneParser
from ingest.kafka import ensure_topics
from ingest.model import Event, Heartbeat
from tests.ingest.test_publisher import read_topic

NOW = 1_700_000_000_000


def frame(values: list[bytes], now: int = NOW) -> pd.DataFrame:
    return pd.DataFrame({"topic": "t", "partition": 2, "offset": range(len(values)), "value": values,
                         "value_bytes": [len(v) for v in values], "value_sha256": [None] * len(values), "now": now})


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
    [out] = PaneParser(settings, (0,))(iter([frame(records)]))
    panes = out[out["partition"] == NO_PARTITION]
    assert sorted(zip(panes["key"], panes["sum_volume"], strict=True)) == [("A", 2.0), ("B", 3.0)]
    assert out.loc[out["partition"] == 2, "progress"].tolist() == [NOW + skew], "refused times are no progress"

    letters = {json.loads(v)["source"]: json.loads(v)["reason"] for v in read_topic(settings, settings.dead_letter_topic)}
    assert letters["t[2]@1"] == "internal: RuntimeError: boom"
    assert "event time" in letters["t[2]@2"] and "heartbeat time" in letters["t[2]@4"]
    stats = redis.Redis.from_url(settings.redis_url, decode_responses=True).hgetall(RedisKeys(settings).evaluator_stats)
    assert {k: int(stats[k]) for k in ("dead_lettered", "future_events_refused", "future_heartbeats_refused")} == {
        "dead_lettered": 3, "future_events_refused": 1, "future_heartbeats_refused": 1}
