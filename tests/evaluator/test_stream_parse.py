"""A declared stream's parser (``evaluator.spark.stream_parse``) against a record-by-record brute-force oracle,
and its pane rows against sums, minima and maxima computed by hand (missing optional values left out)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from core.settings import Settings
from core.streams import Attribute, Dimension, RecordLimits, StreamSchema, StreamValidator
from evaluator.spark.parse import pane_rows, shard_of
from evaluator.spark.stream_parse import StreamPaneParser
from evaluator.views import cell_suffix, key_of
from ingest.model import Heartbeat
from tests.examples import examples

NOW = 1_700_000_000_000
SETTINGS = Settings(max_event_value=1e15, max_future_skew_ms=300_000, max_record_bytes=512)
HOSTS = StreamSchema(name="hosts", attributes=(Attribute(name="cpu", min=0, max=100), Attribute(name="mem", min=0),
                                               Attribute(name="disk", required=False)),
                     dimensions=(Dimension(name="region"),), retention_ms=60_000, partitions=2)
SHARDS = (0, 1, 2)


def raw_frame(values: list[bytes], partitions: list[int] | None = None) -> pd.DataFrame:
    n = len(values)
    return pd.DataFrame({"topic": "tocsin.stream.hosts", "partition": partitions or [i % 2 for i in range(n)],
                         "offset": list(range(n)), "value": pd.Series(values, dtype=object),
                         "value_bytes": pd.Series([len(v) for v in values], dtype=object),
                         "value_sha256": pd.Series([None] * n, dtype=object), "now": NOW})


def reference(values: list[bytes], partitions: list[int]) -> tuple[list, dict[int, int], list[tuple[int, str]]]:
    """Record by record: events (row, cell key (evaluator.views), ts, values or NaN), progress per partition, (row, reason) of rejects."""
    validator = StreamValidator(HOSTS.wire(), RecordLimits.of(SETTINGS))
    skew = SETTINGS.max_future_skew_ms
    events, progress, dead = [], {}, []
    for row, (value, partition) in enumerate(zip(values, partitions, strict=True)):
        try:
            beat = Heartbeat.model_validate_json(value)
        except ValueError:
            beat = None
        if beat is not None:
            if beat.ts - NOW > skew:
                dead.append((row, "ahead"))
            else:
                progress[partition] = max(progress.get(partition, beat.ts), beat.ts)
            continue
        verdict = validator.judge(value)
        if isinstance(verdict, str):
            dead.append((row, verdict))
            continue
        wire = json.loads(verdict[1])
        if wire["ts"] - NOW > skew:
            dead.append((row, "ahead"))
            continue
        progress[partition] = max(progress.get(partition, wire["ts"]), wire["ts"])
        cell = wire["key"] + cell_suffix({d: wire[d] for d in HOSTS.dimension_names if wire.get(d) is not None},
                                         [a.name for a in HOSTS.attributes
                                          if not a.required and wire.get(a.name) is not None])
        events.append((row, cell, wire["ts"],
                       *(math.nan if wire.get(a) is None else float(wire[a]) for a in HOSTS.attribute_names)))
    return events, progress, dead


number = st.one_of(st.integers(-5, 150), st.floats(-1, 200, allow_nan=False).map(lambda x: round(x, 2)))
record = st.one_of(
    st.fixed_dictionaries({"key": st.sampled_from(["a", "b", "c"]), "ts": st.integers(NOW - 5_000, NOW + 400_000),
                           "cpu": number, "mem": number},
                          optional={"disk": number, "region": st.sampled_from(["eu", "us", "kind"]),
                                    "price": number}).map(lambda d: json.dumps(d).encode()),
    st.builds(lambda p, ts: Heartbeat(partition=p, ts=ts).to_json(), st.integers(0, 1),
              st.integers(NOW - 5_000, NOW + 400_000)),
    st.sampled_from([b"not json", b"\xff\xfe", b'{"key": "a", "ts": 1, "cpu": 1}', b"[]", b'{"kind": "x"}']),
)


@given(st.lists(record, max_size=40))
@hypothesis_settings(max_examples=examples(150), deadline=None)
def test_stream_parse_equals_the_record_by_record_reference(values: list[bytes]) -> None:
    partitions = [i % 2 for i in range(len(values))]
    parsed = StreamPaneParser(SETTINGS, SHARDS, HOSTS).parse(raw_frame(values, partitions))
    events, progress, dead = reference(values, partitions)
    assert parsed.rows.tolist() == [e[0] for e in events]
    assert parsed.keys.tolist() == [e[1] for e in events]
    assert parsed.ts.tolist() == [e[2] for e in events]
    for i, a in enumerate(HOSTS.attribute_names):
        np.testing.assert_array_equal(parsed.values[a], np.array([e[3 + i] for e in events], dtype=np.float64))
    assert parsed.progress == progress
    frame = StreamPaneParser(SETTINGS, SHARDS, HOSTS)._frame(parsed.events(), {}).to_pandas()
    for cell, shard in zip(frame["key"], frame["shard"], strict=True):  # a key's cells go to the key's shard
        assert shard == shard_of(key_of(cell), SHARDS)
    assert len(parsed.dead) == len(dead)
    for letter, (row, reason) in zip(parsed.dead, dead, strict=True):
        assert letter.source == f"stream hosts: tocsin.stream.hosts[{partitions[row]}]@{row}"
        assert letter.reason == reason or (reason == "ahead" and "ahead of the processing clock" in letter.reason)


def test_a_trades_record_is_dead_lettered_on_hosts_with_the_reason() -> None:
    trades = b'{"key":"AAPL","ts":%d,"price":1.5,"volume":3}' % (NOW - 1_000)
    parsed = StreamPaneParser(SETTINGS, SHARDS, HOSTS).parse(raw_frame([trades]))
    assert not len(parsed.rows)
    (letter,) = parsed.dead
    assert "cpu" in letter.reason and "price" in letter.reason and letter.source.startswith("stream hosts: ")


@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 3_999), st.integers(0, 100),
                          st.one_of(st.none(), st.integers(0, 50))), min_size=1, max_size=40))
@hypothesis_settings(max_examples=examples(150), deadline=None)
def test_pane_rows_leave_missing_optional_values_out(events: list[tuple[str, int, int, int | None]]) -> None:
    """Per (key, pane): COUNT(*) counts every event; a missing ``disk`` adds nothing to its sum and is neither
    its min nor its max (0 when the pane has none); the pane's events hold 0 for it."""
    parser = StreamPaneParser(SETTINGS, SHARDS, HOSTS)
    frame = parser._frame(pd.DataFrame({
        "key": [e[0] for e in events], "ts": [NOW + e[1] for e in events], "cpu": [float(e[2]) for e in events],
        "mem": 1.0, "disk": [math.nan if e[3] is None else float(e[3]) for e in events]}), {}).to_pandas()
    rows = pane_rows(frame, HOSTS.attribute_names)
    disk = HOSTS.attribute_names.index("disk")
    assert sorted(zip(rows.keys.tolist(), rows.starts.tolist(), strict=True)) == sorted(
        {(k, (NOW + t) // 1000 * 1000) for k, t, *_ in events})
    for i, (key, start) in enumerate(zip(rows.keys, rows.starts, strict=True)):
        mine = [e for e in events if e[0] == key and (NOW + e[1]) // 1000 * 1000 == start]
        present = [e[3] for e in mine if e[3] is not None]
        assert rows.counts[i] == len(mine)
        assert rows.sums[disk, i] == sum(present)
        assert rows.mins[disk, i] == (min(present) if present else 0)
        assert rows.maxs[disk, i] == (max(present) if present else 0)
        assert rows.sums[0, i] == sum(e[2] for e in mine)
    assert np.isfinite(rows.event_values).all()
