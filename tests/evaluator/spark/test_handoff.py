"""The sink's handoff against a real Redis: a burst stored after its batch lands as its batch would have stored it.

No Spark: the sink is handed its micro-batches as frames (tests/evaluator/spark/test_sink.py's ``Batch``). The
oracle is a sink with no handoff (``TOCSIN_SINK_BATCH_TRANSITIONS`` unset) fed the same batches.
"""

from __future__ import annotations

import json
import threading
import time
import uuid

import pandas as pd
import pytest
import redis
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from core.redis_schema import HANDOFF_STORED, HANDOFF_WAITING, RedisKeys, handoff_counts, shard_clocks
from core.settings import Settings
from devstack.patience import deadline
from evaluator.spark.sink import RedisAlertSink, clock_record
from evaluator.transition import Transition, alert_id
from tests.evaluator.spark.test_sink import Batch
from tests.examples import examples

#: A batch: (subscription, key, fires) per transition, evaluated at the batch's own time.
Rows = list[tuple[int, str, bool]]


def batch_rows(rows: Rows, n: int) -> list[dict]:
    at = (n + 1) * 60_000
    out = []
    for i, (sid, key, fires) in enumerate(rows):
        state = "firing" if fires else "resolved"
        out.append(Transition(alert_id(sid, key, state, at + i), sid, key, state, 1.0 if fires else None,  # type: ignore[arg-type]
                              at - 60_000, at + i, at + i).to_dict() | {"kind": "state"})
    return [*out, clock_record(0, at), clock_record(1, at - 1)]


def own(settings: Settings, **changes: object) -> Settings:
    """``settings`` with a fresh key prefix (each example its own keys) and ``changes``."""
    return settings.model_copy(update={"redis_prefix": f"t{uuid.uuid4().hex[:10]}", **changes})


def state_of(settings: Settings, sids: set[int]) -> dict:
    """What the alerts left in Redis: per subscription its alert-stream entries in order, history, firing hash and
    counters, and the shards' clocks."""
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    keys = RedisKeys(settings)
    alerts = [json.loads(f["alert"]) for stream in keys.alerts_streams for _, f in client.xrange(stream)]
    return {"clocks": sorted(shard_clocks(client.hgetall(keys.evaluator_stats))),
            **{sid: ([a["alert_id"] for a in alerts if a["subscription_id"] == sid],
                     [json.loads(f["alert"])["alert_id"] for _, f in client.xrange(keys.history(sid))],
                     client.hgetall(keys.firing(sid)), client.hgetall(keys.counters(sid))) for sid in sids}}


def handoff_in_stats(settings: Settings, kind: str = HANDOFF_WAITING) -> dict[str, int]:
    return handoff_counts(redis.Redis.from_url(settings.redis_url).hgetall(RedisKeys(settings).evaluator_stats), kind)


def run(settings: Settings, batches: list[Rows]) -> dict:
    """The oracle: every batch stored by itself."""
    sink = RedisAlertSink(settings.model_copy(update={"sink_batch_transitions": None}))
    for n, rows in enumerate(batches):
        sink(Batch(batch_rows(rows, n)), n)  # type: ignore[arg-type]
    sink.handoff.stop()
    return state_of(settings, {sid for rows in batches for sid, _, _ in rows})


def gated(sink: RedisAlertSink) -> tuple[threading.Event, list[int]]:
    """Hold the handoff's thread at its next piece until the returned gate opens; the sizes of what it stored."""
    gate, sizes = threading.Event(), []
    store = sink.handoff.store

    def held(frame: pd.DataFrame) -> int:
        gate.wait()
        sizes.append(len(frame))
        return store(frame)
    sink.handoff.store = held
    return gate, sizes


rows_strategy = st.lists(st.tuples(st.integers(1, 6), st.sampled_from("ABC"), st.booleans()), max_size=12)


@hypothesis_settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(rows_strategy, min_size=1, max_size=5), st.integers(1, 6), st.integers(1, 20), st.integers(1, 4))
def test_a_burst_handed_over_lands_as_its_batches_would_have_stored_it(settings: Settings, batches: list[Rows],
                                                                       cap: int, most: int, piece: int) -> None:
    """Whatever the cap, the bound and the piece size: each subscription's alerts, history, firing keys, counters
    and the shards' clocks end as a sink with no handoff leaves them."""
    expected = run(own(settings), batches)
    mine = own(settings, sink_batch_transitions=cap, sink_handoff_max_transitions=most)
    sink = RedisAlertSink(mine)
    sink.handoff.PIECE = piece
    for n, rows in enumerate(batches):
        sink(Batch(batch_rows(rows, n)), n)  # type: ignore[arg-type]
    assert sink.handoff.drained(60)
    assert state_of(mine, {sid for rows in batches for sid, _, _ in rows}) == expected
    sink.handoff.stop()


def test_a_batch_ends_before_its_burst_is_stored_and_clocks_wait_for_it(settings: Settings) -> None:
    """Two of five stored by the batch, three handed over: the batch returns while they wait, the shards' clocks
    stay where they were, and a later batch's transition of a subscription waiting goes behind its earlier ones
    while one of a subscription with nothing waiting is stored at once."""
    settings = own(settings, sink_batch_transitions=2)
    first: Rows = [(1, "A", True), (2, "A", True), (1, "B", True), (3, "A", True), (1, "C", True)]
    second: Rows = [(1, "A", False), (4, "A", True)]
    sink = RedisAlertSink(settings)
    gate, sizes = gated(sink)
    sink(Batch(batch_rows(first, 0)), 0)  # type: ignore[arg-type]
    now = state_of(settings, {1, 2, 3, 4})
    assert now["clocks"] == [] and now[1][1] == [batch_rows(first, 0)[0]["alert_id"]] and now[2][1] != []
    assert now[3][1] == [] and sink.handoff.rows == 3
    sink(Batch(batch_rows(second, 1)), 1)  # type: ignore[arg-type]
    now = state_of(settings, {1, 4})
    assert now["clocks"] == [] and len(now[1][1]) == 1 and len(now[4][1]) == 1  # 4: nothing of it waits
    assert handoff_in_stats(settings) == {"trades": 4}  # what the operators' dashboard reads
    assert handoff_in_stats(settings, HANDOFF_STORED) == {}
    gate.set()
    assert sink.handoff.drained(60)
    assert handoff_in_stats(settings) == {"trades": 0}
    assert handoff_in_stats(settings, HANDOFF_STORED) == {"trades": 4}  # the dead man's switch's progress signal
    assert state_of(settings, {1, 2, 3, 4}) == run(own(settings), [first, second])
    assert sizes == [3, 1]  # the burst, then the later transition of subscription 1
    sink.handoff.stop()


def test_a_handoff_left_by_a_stopped_process_is_stored_by_the_next(settings: Settings) -> None:
    settings = own(settings, sink_batch_transitions=1)
    batches: list[Rows] = [[(1, "A", True), (2, "A", True), (1, "B", True)], [(1, "A", False), (3, "A", True)]]
    sink = RedisAlertSink(settings)
    sink.handoff.stop()  # the process ends: nothing of the handoff is stored
    for n, rows in enumerate(batches):
        sink(Batch(batch_rows(rows, n)), n)  # type: ignore[arg-type]
    assert state_of(settings, {1, 2, 3})["clocks"] == []
    restarted = RedisAlertSink(settings)
    assert restarted.handoff.rows == 3 and set(restarted.handoff.waiting().tolist()) == {1, 2}  # 3 was stored
    assert restarted.handoff.drained(60)
    assert state_of(settings, {1, 2, 3}) == run(own(settings), batches)
    restarted.handoff.stop()


def test_a_batch_waits_while_the_handoff_is_at_its_bound(settings: Settings) -> None:
    settings = own(settings, sink_batch_transitions=1, sink_handoff_max_transitions=3)
    batches: list[Rows] = [[(1, "A", True), (2, "A", True), (3, "A", True), (4, "A", True)], [(2, "A", False)]]
    sink = RedisAlertSink(settings)
    gate, _ = gated(sink)
    sink(Batch(batch_rows(batches[0], 0)), 0)  # type: ignore[arg-type]  # an empty handoff takes a burst whole
    second = threading.Thread(target=sink, args=(Batch(batch_rows(batches[1], 1)), 1))
    second.start()
    second.join(0.5)
    assert second.is_alive() and sink.handoff.rows == 3  # 3 + 1 > 3: it waits for the first to be stored
    gate.set()
    second.join(60)
    assert not second.is_alive() and sink.handoff.drained(60)
    assert state_of(settings, {1, 2, 3, 4}) == run(own(settings), batches)
    sink.handoff.stop()


def test_a_failed_handoff_tries_again_by_itself_when_no_batch_comes(settings: Settings) -> None:
    """A quiet stream has no next batch to fail: the thread stores the burst once the cause is gone, and the
    failure it kept meanwhile (for a next batch to raise) is cleared."""
    settings = own(settings, sink_batch_transitions=1)
    batches: list[Rows] = [[(1, "A", True), (1, "B", True), (2, "C", False)]]
    sink = RedisAlertSink(settings)
    sink.handoff.RETRY_FIRST_S = 0.05
    store, failures = sink.handoff.store, []

    def flaky(frame: pd.DataFrame) -> int:
        if len(failures) < 3:
            failures.append(frame)
            raise RuntimeError("Redis refused the script (OOM)")
        return store(frame)
    sink.handoff.store = flaky
    sink(Batch(batch_rows(batches[0], 0)), 0)  # type: ignore[arg-type]
    end = deadline(60)
    while sink.handoff.pieces and time.monotonic() < end:
        time.sleep(0.05)
    assert not sink.handoff.pieces, "stored without another batch"
    assert len(failures) == 3
    sink.handoff.check()  # nothing to raise any more
    assert state_of(settings, {1, 2}) == run(own(settings), batches)
    sink.handoff.stop()


def test_a_failed_handoff_fails_the_next_batch_and_a_restart_stores_it(settings: Settings) -> None:
    settings = own(settings, sink_batch_transitions=1)
    batches: list[Rows] = [[(1, "A", True), (1, "B", True)], [(2, "A", True)]]
    sink = RedisAlertSink(settings)

    def broken(frame: pd.DataFrame) -> int:
        raise RuntimeError("a piece that cannot be stored")
    sink.handoff.store = broken
    sink(Batch(batch_rows(batches[0], 0)), 0)  # type: ignore[arg-type]
    assert not sink.handoff.drained(60)  # it failed, with the piece still waiting
    with pytest.raises(RuntimeError, match="handoff of 'trades' failed"):
        sink(Batch(batch_rows(batches[1], 1)), 1)  # type: ignore[arg-type]
    restarted = RedisAlertSink(settings)  # the query's restart
    restarted(Batch(batch_rows(batches[1], 1)), 1)  # type: ignore[arg-type]  # Spark runs the failed batch again
    assert restarted.handoff.drained(60)
    assert state_of(settings, {1, 2}) == run(own(settings), batches)
    restarted.handoff.stop()
