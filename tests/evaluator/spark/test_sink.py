"""The sink alone, against a real Redis: what each transition leaves behind, and a replay leaves nothing.

No Spark: the sink is handed its micro-batch as the frame Spark's ``toPandas`` would return.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import replace

import pandas as pd
import pytest
import redis
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from core.redis_schema import RedisKeys, seen_bucket, shard_clocks
from core.settings import Settings
from evaluator.rank import Rank, RankEntry
from evaluator.spark.sink import (
    CLOCK_STATE,
    TRANSITION_COLUMNS,
    RedisAlertSink,
    clock_record,
    frame_records,
    record_of,
    shard_output,
)
from evaluator.transition import STATES, Transition, alert_id
from tests.examples import examples


class Batch:
    """What ``foreachBatch`` hands the sink, already computed."""

    def __init__(self, rows: list[dict]) -> None:
        self.rows = rows

    def toPandas(self) -> pd.DataFrame:
        return pd.DataFrame.from_records(self.rows, columns=list(clock_record(0, 0)))


def transition(sid: int, key: str, state: str, at: int, value: float | None = 1.5) -> dict:
    return Transition(alert_id(sid, key, state, at), sid, key, state, value if state == "firing" else None,  # type: ignore[arg-type]
                      at - 60_000, at, at).to_dict()


def stored(settings: Settings, sid: int) -> tuple[list[dict], list[dict], dict[str, str], dict[str, str]]:
    """The alert stream, the subscription's history, its firing hash (key -> alert id) and its counters."""
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    keys = RedisKeys(settings)
    alerts = [json.loads(f["alert"]) for _, f in client.xrange(keys.alerts_stream)]
    history = [json.loads(f["alert"]) for _, f in client.xrange(keys.history(sid))]
    firing = {k: json.loads(v)["alert_id"] for k, v in client.hgetall(keys.firing(sid)).items()}
    return alerts, history, firing, client.hgetall(keys.counters(sid))


@hypothesis_settings(max_examples=examples(60), deadline=None)
@given(st.lists(st.tuples(st.integers(1, 2**40), st.text(min_size=1, max_size=12),
                          st.sampled_from(["firing", "resolved", "crossing"]),
                          st.floats(allow_nan=False, allow_infinity=False), st.integers(0, 2**50)),
                min_size=1, max_size=20))
def test_payloads_built_by_column_are_what_transition_to_json_writes(rows) -> None:
    transitions = [Transition(alert_id(sid, key, state, at), sid, key, "resolved" if state == "resolved" else "firing",
                              value if state != "resolved" else None, at, at + 1, at + 2,
                              kind="crossing" if state == "crossing" else "state") for sid, key, state, value, at in rows]
    frame = shard_output(transitions, 3, 99)  # as the operator yields: the transitions, then the shard's clock
    clock = frame.iloc[-1].to_dict()
    assert pd.isna(clock.pop("value")) and clock == {k: v for k, v in clock_record(3, 99).items() if k != "value"}
    assert clock["state"] == CLOCK_STATE
    records = frame_records(frame.iloc[:-1])
    assert records == [record_of(t) for t in transitions]
    assert [r[5] for r in records] == [t.to_json() for t in transitions]
    assert [r[4] for r in records] == [state for _, _, state, _, _ in rows]  # what the script is told
    assert [r[1] for r in records] == [(at + 2) // 600_000 for _, _, _, _, at in rows]  # evaluated_at's ten minutes


@hypothesis_settings(max_examples=examples(40), deadline=None)
@given(st.lists(st.tuples(st.integers(1, 2**40), st.text(max_size=6), st.sampled_from(STATES),
                          st.none() | st.floats(allow_infinity=False), st.integers(0, 2**50)), max_size=12),
       st.lists(st.tuples(st.integers(1, 2**40), st.text(max_size=6), st.none() | st.floats(allow_infinity=False),
                          st.booleans(), st.booleans()), max_size=4))
def test_shard_output_is_the_frame_pandas_makes_of_its_rows(rows, ranks) -> None:
    """Built column by column with the schema's types, the operator's output is what pandas infers from the same
    rows: transitions (None values included), rank entries and the clock, types and order."""
    transitions = [Transition(alert_id(sid, key, state, at), sid, key, state, value, at, at + 1, at + 2)
                   for sid, key, state, value, at in rows]
    entries = [RankEntry(0, sid, 5_000, 4_000, key, value, listed, Rank(3, top), out)
               for sid, key, value, listed, top, out in ((*r, r[3]) for r in ranks)]
    frame = shard_output(transitions, 4, 5_000, entries)
    expected = pd.DataFrame.from_records(
        [*transitions, *(replace(e, shard=4).to_row() for e in entries),
         tuple(clock_record(4, 5_000).values())], columns=TRANSITION_COLUMNS)
    expected["value"] = expected["value"].astype(float)  # pandas keeps a column of None alone as objects
    pd.testing.assert_frame_equal(frame, expected)


def test_a_crossing_is_counted_and_never_kept_as_firing(settings: Settings) -> None:
    sink = RedisAlertSink(settings)
    cross = Transition(alert_id(7, "AAPL", "firing", 60_000), 7, "AAPL", "firing", 101.0, 0, 60_000, 60_000,
                       kind="crossing")
    edge = Transition(alert_id(7, "MSFT", "firing", 60_000), 7, "MSFT", "firing", 3.0, 0, 60_000, 60_000)
    rows = [t.to_dict() | {"kind": t.kind} for t in (cross, edge)] + [clock_record(0, 60_000)]
    sink(Batch(rows), 1)  # type: ignore[arg-type]
    alerts, history, firing, counters = stored(settings, 7)
    assert [a.get("kind") for a in alerts] == ["crossing", None] and len(history) == 2
    assert firing == {"MSFT": edge.alert_id}
    assert counters == {"crossing": "1", "firing": "1"}
    assert sink.write([cross.to_dict()]) == 0  # a replay of it writes nothing


def test_frame_records_refuse_an_unknown_state() -> None:
    frame = pd.DataFrame.from_records([{**transition(1, "K", "firing", 60_000), "state": "pending"}])
    with pytest.raises(ValueError, match="'pending' is none of firing, resolved"):
        frame_records(frame)


def test_a_key_that_fires_and_resolves_in_one_batch_is_not_left_firing(settings: Settings) -> None:
    """The firing hash takes each key's last state in the batch, across the script's chunks too."""
    sink = RedisAlertSink(settings)
    sink.CHUNK = 3  # the firing of B and its resolution land in different script calls
    batch = [transition(7, "A", "firing", 60_000), transition(7, "B", "firing", 60_000),
             transition(7, "C", "firing", 60_000), transition(7, "A", "resolved", 61_000),
             transition(7, "B", "resolved", 61_000), transition(7, "A", "firing", 62_000),
             transition(8, "A", "firing", 62_000), clock_record(0, 62_000), clock_record(1, 61_000)]
    sink(Batch(batch), 0)
    alerts, history, firing, counters = stored(settings, 7)
    assert [a["alert_id"] for a in alerts] == [t["alert_id"] for t in batch if t["state"] != "clock"]
    assert history == [t for t in batch if t["subscription_id"] == 7]  # in order, payloads as written
    assert firing == {"A": batch[5]["alert_id"], "C": batch[2]["alert_id"]}
    assert counters == {"firing": "4", "resolved": "2"}
    assert stored(settings, 8)[2] == {"A": batch[6]["alert_id"]}
    stats = redis.Redis.from_url(settings.redis_url, decode_responses=True).hgetall(RedisKeys(settings).evaluator_stats)
    assert sorted(shard_clocks(stats)) == [61_000, 62_000] and stats["transitions"] == "7"


def test_a_replayed_batch_writes_nothing_twice(settings: Settings) -> None:
    sink = RedisAlertSink(settings)
    first = [transition(3, "A", "firing", 60_000), transition(3, "B", "firing", 60_000), clock_record(0, 60_000)]
    sink(Batch(first), 0)
    # The batch again after a crash before Spark's commit, now with one transition more (the catalog moved on).
    replay = [*first[:2], transition(3, "A", "resolved", 61_000), clock_record(0, 61_000)]
    sink(Batch(replay), 0)
    sink(Batch(replay), 0)
    alerts, history, firing, counters = stored(settings, 3)
    assert [a["alert_id"] for a in alerts] == [t["alert_id"] for t in replay[:3]]
    assert history == replay[:3]
    assert firing == {"B": first[1]["alert_id"]}
    assert counters == {"firing": "2", "resolved": "1"}
    assert sink.write(replay[:3]) == 0


BUCKET = 600_000
POOL = [transition(sid, key, state, at) for sid in (1, 2) for key in ("A", "B") for state in ("firing", "resolved")
        for at in (BUCKET - 1_000, BUCKET, 2 * BUCKET + 5)]  # three seen buckets


@hypothesis_settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.lists(st.integers(0, len(POOL) - 1), max_size=12), min_size=1, max_size=5),
       marked=st.sets(st.integers(0, len(POOL) - 1), max_size=4), chunk=st.sampled_from([1, 3, 2_000]))
def test_each_alert_is_stored_once_whatever_the_repeats_replays_and_earlier_marks(
        settings: Settings, batches: list[list[int]], marked: set[int], chunk: int) -> None:
    """Against an oracle: every alert id is stored once, at its first occurrence, in order, across repeats within a
    call, replayed batches and buckets, except those the earlier layout's per-alert marks hold in the first batch."""
    settings = settings.model_copy(update={"redis_prefix": f"s{uuid.uuid4().hex}"})  # each example its own keys
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    keys = RedisKeys(settings)
    for i in marked:  # written by the sink before seen sets, not yet expired
        client.set(keys.alert_mark(POOL[i]["subscription_id"], POOL[i]["alert_id"]), "1", ex=3_600)
    sink = RedisAlertSink(settings)
    sink.CHUNK = chunk
    expected: list[dict] = []
    done = {POOL[i]["alert_id"] for i in marked}
    for batch_id, batch in enumerate(batches):
        rows = [POOL[i] for i in batch]
        sink(Batch([*rows, clock_record(0, BUCKET)]), batch_id)
        sink(Batch([*rows, clock_record(0, BUCKET)]), batch_id)  # replayed after a crash before Spark's commit
        for row in rows:
            if row["alert_id"] not in done:
                done.add(row["alert_id"])
                expected.append(row)
        if batch_id == 0:  # only the first batch a process runs can replay one stored with the earlier marks
            done -= {POOL[i]["alert_id"] for i in marked} - {row["alert_id"] for row in rows}
    assert [json.loads(f["alert"]) for _, f in client.xrange(keys.alerts_stream)] == expected
    for sid in (1, 2):
        assert [json.loads(f["alert"]) for _, f in client.xrange(keys.history(sid))] == \
            [t for t in expected if t["subscription_id"] == sid]
    for t in expected:
        bucket = keys.seen(t["subscription_id"], seen_bucket(t["evaluated_at"]))
        assert client.sismember(bucket, t["alert_id"])
        assert 0 < client.ttl(bucket) <= settings.sink_dedupe_ttl_s


def test_a_slice_that_fails_stops_the_later_ones_until_it_is_stored(settings: Settings, monkeypatch) -> None:
    """Slices go to Redis while the next is built; Redis lost during the second one must not let the third land
    before it: the retry sends them again from the first, in order."""
    sink = RedisAlertSink(settings)
    sink.SLICE, sink.CHUNK = 2, 1
    batch = [transition(3, "A", "firing", 60_000), transition(3, "B", "firing", 60_000),
             transition(3, "A", "resolved", 61_000), transition(3, "B", "resolved", 61_000),
             transition(3, "C", "firing", 61_000)]
    pipelines, real = [], sink.redis.pipeline

    def pipeline(**kwargs):
        pipe = real(**kwargs)
        pipelines.append(pipe)
        if len(pipelines) == 2:  # the second slice's: Redis goes away before it answers
            def lost() -> None:
                raise redis.ConnectionError("connection lost")
            pipe.execute = lost
        return pipe

    monkeypatch.setattr(sink.redis, "pipeline", pipeline)
    sink(Batch([*batch, clock_record(0, 61_000)]), 0)
    alerts, history, firing, counters = stored(settings, 3)
    assert alerts == history == batch
    assert firing == {"C": batch[4]["alert_id"]} and counters == {"firing": "3", "resolved": "2"}


def test_an_empty_batch_still_reports_the_clocks(settings: Settings) -> None:
    RedisAlertSink(settings)(Batch([clock_record(0, 5_000)]), 4)
    stats = redis.Redis.from_url(settings.redis_url, decode_responses=True).hgetall(RedisKeys(settings).evaluator_stats)
    assert shard_clocks(stats) == [5_000] and stats["last_batch_id"] == "4" and stats["transitions"] == "0"
