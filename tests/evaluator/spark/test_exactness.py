"""The streaming job end to end: alerts equal the brute-force oracle's and a backtest's of the same topic, and survive
a SIGKILL exactly."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from core.redis_schema import RedisKeys
from core.settings import Settings
from core.streams import trades_schema
from evaluator.backtest import Backtest
from evaluator.catalog import Catalog
from evaluator.spark.checkpoint_fs import CheckpointFiles
from evaluator.spark.job import build_query
from ingest.history import history_span, read_history
from ingest.kafka import ensure_topics
from tests.evaluator.spark.queries import stop_query
from tests.evaluator.spark.test_job import publish_catalog
from tests.evaluator.streams import (
    SPECS,
    assert_matches_oracle,
    assert_recovered,
    batch_id,
    evaluated_everything,
    evaluator_process,
    for_run,
    generated_stream,
    publish,
    transitions,
    wait_until,
)

pytestmark = pytest.mark.spark


def test_alerts_equal_the_brute_force_oracle(spark, settings: Settings, tmp_path: Path) -> None:
    ensure_topics(settings)
    events = generated_stream()
    last = publish(settings, events)
    # batches store two transitions themselves and hand the rest over (evaluator.spark.handoff): exact all the same
    run = for_run(settings, "exact", tmp_path).model_copy(update={"sink_batch_transitions": 2})
    publish_catalog(run, *SPECS)
    query = build_query(spark, run)
    try:
        wait_until(lambda: evaluated_everything(run, last, run.spark_shuffle_partitions), query=query)
    finally:
        stop_query(query, run)
    assert_matches_oracle(run, events, last)
    stats = redis.Redis.from_url(run.redis_url, decode_responses=True).hgetall(RedisKeys(run).evaluator_stats)
    assert int(stats["handed_over"]) > 0  # the handoff took part
    # A backtest of each subscription over the same topic yields the live run's transitions: ids, values and all
    live = {(t["alert_id"], t["subscription_id"], t["key"], t["state"], t["evaluated_at"], t["value"])
            for t in transitions(run)}
    span = history_span(run, run.events_topic, 0, int(time.time() * 1000) + 1)
    backtested = set()
    for spec in SPECS:
        backtest = Backtest.of(spec, run, trades_schema(run), len(span.offsets), 0)
        backtest.run(read_history(run, span, chunk_ms=500))  # half a second of record time per chunk
        assert backtest.tally.records == span.records and backtest.evaluated_at == last
        backtested |= {(t.alert_id, t.subscription_id, t.key, t.state, t.evaluated_at, t.value)
                       for t in backtest.transitions}
    assert backtested == live



@pytest.mark.slow  # fault injection: run in CI
def test_sigkill_mid_stream_then_restart_gives_the_uninterrupted_alerts(spark, settings: Settings,
                                                                        tmp_path: Path) -> None:
    ensure_topics(settings)
    events = generated_stream(seed=11)
    last = publish(settings, events)
    shards = settings.spark_shuffle_partitions

    reference = for_run(settings, "reference", tmp_path)
    publish_catalog(reference, *SPECS)
    query = build_query(spark, reference)
    try:
        wait_until(lambda: evaluated_everything(reference, last, shards), query=query)
    finally:
        stop_query(query, reference)

    crashing = for_run(settings, "crashing", tmp_path)
    publish_catalog(crashing, *SPECS)
    logs = tmp_path / "logs"
    logs.mkdir()
    job = evaluator_process(crashing, logs / "evaluator-1.log")
    try:
        wait_until(lambda: batch_id(crashing) >= 3, job=job)
        job.kill()  # SIGKILL: no chance to commit, flush or clean up
        assert not evaluated_everything(crashing, last, shards), "killed too late to test anything"
        killed_at = batch_id(crashing)
        job = evaluator_process(crashing, logs / "evaluator-2.log")
        wait_until(lambda: evaluated_everything(crashing, last, shards), job=job)
    finally:
        job.stop()
    assert batch_id(crashing) > killed_at
    assert_recovered(crashing, reference, events, last)
    raw = redis.Redis.from_url(settings.redis_url)  # the snapshot is compressed bytes
    assert Catalog.decode(raw.get(RedisKeys(crashing).catalog_snapshot)).version == 1


@pytest.mark.slow  # a restart with another setting (~35 s each): run in CI
@pytest.mark.parametrize("location", [
    "path",
    "file-uri",  # the checkpoint's offset and commit logs, its state: all at a file:// URI Spark and we resolve alike
])
def test_a_changed_shard_setting_keeps_the_checkpoints_shards_and_the_alerts_exact(spark, settings: Settings,
                                                                                 tmp_path: Path, location: str) -> None:
    """Spark runs a checkpoint's stateful stage with the shuffle partitions it was started with, whatever the
    session says. The parser routed keys by the session's count instead, so a changed
    TOCSIN_SPARK_SHUFFLE_PARTITIONS sent keys to shards without their windows (and left shards without progress,
    so their clocks stopped): the query keeps the checkpoint's shards. The restarted query resumes after the last
    batch committed and alerts nothing twice, at a plain path and at a file:// URI (whose offset log was read as a
    local path, so not found, before it went through Hadoop's FileSystem)."""
    ensure_topics(settings)
    events = generated_stream(seed=5)
    last = publish(settings, events)
    run = for_run(settings, "reshard", tmp_path)
    local = Path(run.checkpoint_location)
    if location == "file-uri":
        run = run.model_copy(update={"checkpoint_dir": f"file://{local}"})
    shards = settings.spark_shuffle_partitions
    assert shards == 2
    publish_catalog(run, *SPECS)
    query = build_query(spark, run)
    try:
        wait_until(lambda: batch_id(run) >= 2, query=query)
    finally:
        stop_query(query, run)
    assert not evaluated_everything(run, last, shards), "stopped too late to test anything"
    committed = max(int(n) for n in CheckpointFiles(spark, run.checkpoint_location).names("commits") if n.isdigit())
    assert (local / "commits" / str(committed)).exists(), "the checkpoint is where the location names"
    spark.conf.set("spark.sql.shuffle.partitions", "1")
    try:
        query = build_query(spark, run.model_copy(update={"spark_shuffle_partitions": 1}))
        try:
            wait_until(lambda: evaluated_everything(run, last, shards), query=query)
            resumed = min(progress["batchId"] for progress in query.recentProgress)
        finally:
            stop_query(query, run)
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", str(shards))
    assert resumed == committed + 1, "the restarted query resumes after the last batch committed"
    assert_matches_oracle(run, events, last)
