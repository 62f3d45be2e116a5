"""What the driver reads and writes in a checkpoint, through the session's Hadoop FileSystem, at a plain path and
at a ``file://`` URI: the files land where Spark's own do (the local directory the location names), never in a
directory named after the URI. The restart of a real query from a ``file://`` checkpoint:
tests/evaluator/spark/test_exactness.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from core.redis_schema import (
    HANDOFF_STORED,
    HANDOFF_WAITING,
    QUERY_STARTED_AT,
    RedisKeys,
    admission_waiting_by_shard,
    admission_waiting_field,
    catalog_read_field,
    handoff_counts,
    handoff_field,
    stream_stat,
)
from core.settings import Settings
from core.streams import Attribute, topic_name, trades_schema
from evaluator.spark.checkpoint_fs import CheckpointFiles
from evaluator.spark.registry import (
    RegistryReader,
    checkpoint_identity,
    checkpoint_partitions,
    claim_checkpoint,
    query_attributes,
    stream_checkpoint,
)
from evaluator.spark.supervisor import MAX_BACKOFF_S, DeletedCheckpoints, StreamSupervisor
from ingest.kafka import ensure_topics
from subscriptions.streams import delete_topic, publish_registry
from tests.evaluator.spark.test_streams import topics
from tests.evaluator.streams import wait_until
from tests.evaluator.test_stream_supervisor import Starter, schema

pytestmark = pytest.mark.spark


@pytest.fixture(params=["path", "file-uri"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A checkpoint location naming ``tmp_path/checkpoint``, as a plain path or a ``file://`` URI."""
    path = str(tmp_path / "checkpoint")
    return path if request.param == "path" else f"file://{path}"


@pytest.fixture
def run(settings: Settings, location: str) -> Settings:
    return settings.model_copy(update={"checkpoint_dir": location})


@pytest.fixture(autouse=True)
def _nothing_named_after_a_uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # a URI taken for a relative path would make a directory "file:" here
    yield
    assert not (tmp_path / "file:").exists()


def test_files_are_read_and_written_where_the_location_names(spark, location: str, tmp_path: Path) -> None:
    local = tmp_path / "checkpoint"
    files = CheckpointFiles(spark, location)
    assert not files.exists() and files.names() == [] and files.read_text("a/b.json") is None
    files.write_text("a/b.json", "naïve")
    assert (local / "a" / "b.json").read_text() == "naïve" and files.read_text("a/b.json") == "naïve"
    (local / "a" / "c").write_text("by another process")
    assert sorted(files.names("a")) == ["b.json", "c"] and files.exists("a/c")
    files.write_text("a/b.json", "replaced")
    assert files.read_text("a/b.json") == "replaced"
    assert files.delete() is True and not local.exists() and files.delete() is False


def test_checkpoint_partitions_reads_the_newest_offset_entry_and_none_for_a_new_checkpoint(
        spark, location: str, tmp_path: Path) -> None:
    """The offset log's format as Spark 4 writes it (a version line, the metadata with the session's conf, the
    sources' offsets); test_exactness's changed shard setting reads a real one."""
    assert checkpoint_partitions(CheckpointFiles(spark, location)) is None
    offsets = tmp_path / "checkpoint" / "offsets"
    offsets.mkdir(parents=True)
    for batch, partitions in ((0, 4), (1, 2), (10, 3)):
        metadata = {"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {"spark.sql.shuffle.partitions": str(partitions)}}
        (offsets / str(batch)).write_text(f'v1\n{json.dumps(metadata)}\n{{"0":12}}')
    (offsets / ".10.crc").write_text("x")
    assert checkpoint_partitions(CheckpointFiles(spark, location)) == 3  # 10 is newer than 1, not older


def test_a_query_keeps_its_attribute_columns_and_only_appends(spark, run: Settings, tmp_path: Path) -> None:
    files = stream_checkpoint(spark, run, "s")
    assert query_attributes(files, schema("s", Attribute(name="x"), Attribute(name="y"))) == ("x", "y")
    assert query_attributes(files, schema("s", Attribute(name="y"), Attribute(name="z", required=False))) == (
        "x", "y", "z")  # x removed: its column stays (always empty), so the state never shrinks
    assert query_attributes(files, schema("s", Attribute(name="w"))) == ("x", "y", "z", "w")
    assert json.loads((tmp_path / "checkpoint" / "streams" / "s" / "attributes.json").read_text()) == [
        "x", "y", "z", "w"]
    assert query_attributes(stream_checkpoint(spark, run, "t"), schema("t")) == ("x",)  # another stream's own


def test_a_stream_declared_again_restarts_on_an_empty_checkpoint_its_old_clocks_forgotten(
        spark, run: Settings, tmp_path: Path) -> None:
    """Another row id under the same name is a stream deleted and declared again: its query restarts, its old
    checkpoint, shard clocks, handoff and admission sets are gone. The same id (a registry republished after Redis lost it) keeps them, and
    a checkpoint from before ids were published is claimed, not removed."""
    client, keys = redis.Redis.from_url(run.redis_url), RedisKeys(run)
    start = Starter()
    supervisor = StreamSupervisor(spark, run, RegistryReader(client, keys, run), start)  # type: ignore[arg-type]
    checkpoint = tmp_path / "checkpoint" / "streams" / "s"
    (checkpoint / "offsets").mkdir(parents=True)  # a checkpoint written before ids were published
    (checkpoint / "offsets" / "0").write_text("old")
    publish_registry(client, keys, [trades_schema(run), schema("s")], {"s": 7})
    supervisor.poll()
    first = supervisor.queries()["s"]
    assert (checkpoint / "offsets" / "0").exists() and (checkpoint / "incarnation").read_text() == "7"
    client.hset(keys.evaluator_stats, mapping={stream_stat("s", "shard_3_evaluated_at"): 5,
                                               stream_stat("s", "last_batch_id"): 9, "shard_0_evaluated_at": 1,
                                               admission_waiting_field("s", 3): 1, handoff_field(HANDOFF_WAITING, "s"): 2,
                                               catalog_read_field("s", 3): 4})
    client.sadd(keys.admission_waiting("s", 3), 4)  # and what its burst left: alerts of subscriptions deleted with it
    client.rpush(keys.handoff("s"), "p1")
    client.set(keys.handoff_piece("s", "p1"), b"piece")

    publish_registry(client, keys, [trades_schema(run), schema("s")], {"s": 7})  # republished: nothing changes
    supervisor.poll()
    assert supervisor.queries()["s"] is first and not first.stopped

    publish_registry(client, keys, [trades_schema(run), schema("s")], {"s": 8})  # deleted and declared again
    supervisor.poll()
    assert first.stopped and supervisor.queries()["s"] is not first
    assert not (checkpoint / "offsets").exists() and (checkpoint / "incarnation").read_text() == "8"
    assert {k.decode() for k in client.hkeys(keys.evaluator_stats)} == {  # trades' clock kept
        "shard_0_evaluated_at", stream_stat("s", QUERY_STARTED_AT)}
    assert not client.exists(keys.admission_waiting("s", 3), keys.handoff("s"), keys.handoff_piece("s", "p1"))
    identity = checkpoint_identity(stream_checkpoint(spark, run, "s"))
    assert identity == f"{run.checkpoint_location}/streams/s#8"  # executors' shard copies of #7 are not reused


def test_a_job_that_missed_the_deletion_still_starts_the_stream_clean(spark, run: Settings, tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoint" / "streams" / "s"
    assert claim_checkpoint(spark, run, "s", 1) is False and (checkpoint / "incarnation").read_text() == "1"
    (checkpoint / "commits").mkdir()
    assert claim_checkpoint(spark, run, "s", 1) is False and (checkpoint / "commits").exists()
    assert claim_checkpoint(spark, run, "s", None) is False and (checkpoint / "commits").exists()  # an old registry
    assert claim_checkpoint(spark, run, "s", 2) is True and not (checkpoint / "commits").exists()


def test_a_deleted_streams_checkpoint_is_removed_one_missing_from_the_registry_keeps_its(
        spark, run: Settings, tmp_path: Path) -> None:
    """A stream deleted (its topic first, then its row) loses its checkpoint, whether the job saw it go or was down
    meanwhile; a stream whose topic is still there (Redis lost the registry) keeps its checkpoint until its topic
    is gone too. What its query left in Redis goes with its checkpoint: its handoff, its shards' admission sets and
    their counts (the dashboard and the 'storage' rule would count them forever)."""
    run = run.model_copy(update={"stream_topic_prefix": f"{run.events_topic}.stream."})
    client, keys = redis.Redis.from_url(run.redis_url), RedisKeys(run)
    streams = tmp_path / "checkpoint" / "streams"
    for name in ("gone", "kept"):  # left by an earlier run of the job
        (streams / name / "offsets").mkdir(parents=True)
    ensure_topics(run, {topic_name("kept", run): 1, topic_name("live", run): 1})
    for name in ("live", "kept"):  # a burst's handoff and admissions under way when the stream is deleted
        client.rpush(keys.handoff(name), "p1")
        client.set(keys.handoff_piece(name, "p1"), b"piece")
        client.sadd(keys.admission_waiting(name, 1), 5)
        client.hset(keys.evaluator_stats, mapping={admission_waiting_field(name, 1): 1, admission_waiting_field(name, 0): 0,
                                                   handoff_field(HANDOFF_WAITING, name): 9,
                                                   handoff_field(HANDOFF_STORED, name): 3})

    def left_in_redis(name: str) -> dict:
        stats = client.hgetall(keys.evaluator_stats)
        return {"handoff": client.exists(keys.handoff(name), keys.handoff_piece(name, "p1")),
                "admission": client.exists(keys.admission_waiting(name, 1)),
                "admission counts": admission_waiting_by_shard(stats).get(name, {}),
                "handoff counts": [handoff_counts(stats, kind).get(name) for kind in (HANDOFF_WAITING, HANDOFF_STORED)]}
    nothing = {"handoff": 0, "admission": 0, "admission counts": {}, "handoff counts": [None, None]}
    clock = [0.0]
    supervisor = StreamSupervisor(spark, run, RegistryReader(client, keys, run), Starter(),  # type: ignore[arg-type]
                                  clock=lambda: clock[0], deleted=DeletedCheckpoints(spark, run))
    publish_registry(client, keys, [trades_schema(run), schema("live")], {"live": 1})
    supervisor.poll()
    assert not (streams / "gone").exists(), "deleted while the job was down"
    assert (streams / "kept" / "offsets").exists() and (streams / "live" / "incarnation").read_text() == "1"

    delete_topic(run, "live")  # as StreamService.delete does, before it republishes the registry
    wait_until(lambda: topic_name("live", run) not in topics(run), timeout_s=60)
    publish_registry(client, keys, [trades_schema(run)])
    clock[0] = 1.0
    supervisor.poll()
    assert not (streams / "live").exists() and "live" not in supervisor.queries()
    assert (streams / "kept" / "offsets").exists()
    assert left_in_redis("live") == nothing
    assert left_in_redis("kept") == {"handoff": 2, "admission": 1, "admission counts": {0: 0, 1: 1},
                                     "handoff counts": [9, 3]}

    delete_topic(run, "kept")
    wait_until(lambda: topic_name("kept", run) not in topics(run), timeout_s=60)
    clock[0] = 1.0 + MAX_BACKOFF_S / 2
    supervisor.poll()
    assert (streams / "kept").exists(), "checked again a while later, not at every poll"
    clock[0] = 1.0 + MAX_BACKOFF_S
    supervisor.poll()
    assert not (streams / "kept").exists()
    assert left_in_redis("kept") == nothing
