"""The stream supervisor's decisions (real Redis registry; queries stood in for by recorders, Spark is not needed
to decide what to start, stop and restart): new streams start, changed ones restart, deleted ones stop, failed
ones restart with a doubling backoff while the others run. What it does to checkpoints needs Spark's Hadoop:
tests/evaluator/spark/test_checkpoint.py."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import redis

from core.redis_schema import QUERY_FAILING, QUERY_STARTED_AT, RedisKeys, stream_stat
from core.settings import Settings
from core.streams import Attribute, StreamSchema, trades_schema
from evaluator.spark.job import query_name, stream_of_query
from evaluator.spark.registry import RegistryReader
from evaluator.spark.source import stop_file
from evaluator.spark.supervisor import MAX_BACKOFF_S, StreamSupervisor
from subscriptions.streams import publish_registry


@dataclass
class FakeQuery:
    schema: StreamSchema
    isActive: bool = True  # noqa: N815 - StreamingQuery's name
    error: str | None = None
    stopped: bool = False
    in_batch: bool = False  # a trigger is active: a batch runs

    @property
    def status(self) -> dict[str, object]:
        return {"isTriggerActive": self.in_batch and self.isActive}

    def exception(self) -> str | None:
        return self.error

    def stop(self) -> None:
        self.stopped, self.isActive = True, False


@dataclass
class Starter:
    started: list[FakeQuery] = field(default_factory=list)
    refuse: set[str] = field(default_factory=set)

    def __call__(self, spark: object, settings: Settings, schema: StreamSchema) -> FakeQuery:
        if schema.name in self.refuse:
            raise RuntimeError("topic not there yet")
        self.started.append(FakeQuery(schema))
        return self.started[-1]


def schema(name: str, *attributes: Attribute) -> StreamSchema:
    return StreamSchema(name=name, attributes=attributes or (Attribute(name="x"),), retention_ms=60_000, partitions=1)


def test_the_supervisor_follows_the_registry(settings: Settings) -> None:
    client, keys = redis.Redis.from_url(settings.redis_url), RedisKeys(settings)
    clock = [0.0]
    start = Starter(refuse={"late"})
    supervisor = StreamSupervisor(None, settings, RegistryReader(client, keys, settings), start,  # type: ignore[arg-type]
                                  clock=lambda: clock[0])
    supervisor.poll()
    assert start.started == []  # trades is the job's own query
    publish_registry(client, keys, [trades_schema(settings), schema("a"), schema("b"), schema("late")])
    supervisor.poll()
    a, b = start.started
    assert (a.schema.name, b.schema.name) == ("a", "b") and set(supervisor.queries()) == {"a", "b"}

    wider = schema("a", Attribute(name="x"), Attribute(name="y", required=False))
    publish_registry(client, keys, [trades_schema(settings), wider, schema("b"), schema("late")])
    supervisor.poll()
    assert a.stopped and start.started[-1].schema == wider and not b.stopped

    b.isActive, b.error = False, "boom"  # b fails: restarted after 1 s, then 2 s, while a runs on
    supervisor.poll()
    assert "b" not in supervisor.queries()
    clock[0] = 1.0
    supervisor.poll()
    b2 = supervisor.queries()["b"]
    b2.isActive = False
    supervisor.poll()
    clock[0] = 2.5
    supervisor.poll()
    assert "b" not in supervisor.queries()
    clock[0] = 3.0
    supervisor.poll()
    assert "b" in supervisor.queries() and supervisor.failures == 2

    start.refuse.clear()  # a stream that could not start is retried too
    clock[0] = 100.0
    supervisor.poll()
    assert "late" in supervisor.queries()

    publish_registry(client, keys, [trades_schema(settings), wider])
    supervisor.poll()
    assert set(supervisor.queries()) == {"a"} and supervisor.queries()["a"].isActive


def test_failures_in_a_row_reach_redis_until_the_query_runs_well_again(settings: Settings) -> None:
    """What the dead man's switch reads (``web.watchdog.stream``): each start, and the failures in a row with the
    first one's time and the last error; a job restart goes on counting them; a recovery or a deletion clears them."""
    client, keys = redis.Redis.from_url(settings.redis_url, decode_responses=True), RedisKeys(settings)
    clock = [0.0]
    start = Starter(refuse={"b"})

    def supervisor() -> StreamSupervisor:
        return StreamSupervisor(None, settings, RegistryReader(client, keys, settings), start,  # type: ignore[arg-type]
                                clock=lambda: clock[0])

    def field_of(stream: str, name: str) -> str | None:
        return client.hget(keys.evaluator_stats, stream_stat(stream, name))

    publish_registry(client, keys, [trades_schema(settings), schema("a"), schema("b")])
    job, before = supervisor(), time.time()
    job.poll()
    a = start.started[0]
    assert float(field_of("a", QUERY_STARTED_AT) or 0) >= before and field_of("a", QUERY_FAILING) is None
    for now in (0.0, 1.0, 3.0):  # b cannot start (1 s, 2 s backoff); a fails once, is restarted
        clock[0] = now
        job.poll()
        if now == 0.0:
            a.isActive, a.error = False, "boom"
    failing = json.loads(field_of("b", QUERY_FAILING) or "{}")
    assert failing["failures"] == 3 and before <= failing["since"] <= time.time()
    assert failing["error"] == "RuntimeError: topic not there yet"
    assert json.loads(field_of("a", QUERY_FAILING) or "{}")["failures"] == 1

    clock[0] = 3.0 + MAX_BACKOFF_S  # a ran well for a while since its restart (at 3 s): cleared
    job.poll()
    assert field_of("a", QUERY_FAILING) is None and json.loads(field_of("b", QUERY_FAILING) or "{}")["failures"] == 4

    restarted = supervisor()  # the job restarts: b's failures go on counting, from the same first one
    clock[0] = 200.0
    restarted.poll()
    again = json.loads(field_of("b", QUERY_FAILING) or "{}")
    assert again["failures"] == 5 and again["since"] == failing["since"]

    start.refuse.clear()
    clock[0] = 300.0
    restarted.poll()
    assert "b" in restarted.queries() and field_of("b", QUERY_FAILING) is not None, "not well for long yet"
    clock[0] = 300.0 + MAX_BACKOFF_S
    restarted.poll()
    assert field_of("b", QUERY_FAILING) is None

    start.refuse.add("a")
    restarted.queries()["a"].isActive = False
    restarted.poll()
    assert field_of("a", QUERY_FAILING) is not None
    publish_registry(client, keys, [trades_schema(settings), schema("b")])  # a deleted: its fields go
    restarted.poll()
    assert field_of("a", QUERY_FAILING) is None and field_of("a", QUERY_STARTED_AT) is None


def test_a_query_is_stopped_between_batches_and_its_stream_waits_for_that(settings: Settings) -> None:
    """Stopping a query inside a batch kills the tasks while the shard operator's worker writes its state store (a
    JVM crash in RocksDB was seen so): its source is held (the stream's stop file) and the query stopped once its
    batch has ended; a restart waits for that, and a batch outliving the stop timeout is interrupted."""
    client, keys = redis.Redis.from_url(settings.redis_url), RedisKeys(settings)
    clock = [0.0]
    start = Starter()
    supervisor = StreamSupervisor(None, settings, RegistryReader(client, keys, settings), start,  # type: ignore[arg-type]
                                  clock=lambda: clock[0])
    publish_registry(client, keys, [trades_schema(settings), schema("a"), schema("b")])
    supervisor.poll()
    a, b = start.started
    a.in_batch = b.in_batch = True

    wider = schema("a", Attribute(name="x"), Attribute(name="y", required=False))
    publish_registry(client, keys, [trades_schema(settings), wider])  # a changed, b deleted: both mid-batch
    supervisor.poll()
    assert not a.stopped and not b.stopped and len(start.started) == 2
    assert stop_file(settings, "a").exists() and stop_file(settings, "b").exists()  # their sources offer nothing new
    assert not stop_file(settings, "trades").exists()
    clock[0] = 5.0
    a.in_batch = False  # a's batch ended
    supervisor.poll()
    assert a.stopped and start.started[-1].schema == wider and not stop_file(settings, "a").exists()
    assert not b.stopped and "b" in supervisor.streams  # still in its batch: not forgotten yet
    clock[0] = settings.evaluator_stop_timeout_s + 1.0  # b's batch outlived the stop timeout: interrupted
    supervisor.poll()
    assert b.stopped and "b" not in supervisor.streams and not stop_file(settings, "b").exists()

    stop_file(settings, "c").touch()  # left by a killed job: the stream's start removes it, or it would never read
    publish_registry(client, keys, [trades_schema(settings), wider, schema("c")])
    supervisor.poll()
    assert "c" in supervisor.queries() and not stop_file(settings, "c").exists()
    supervisor.stop_all()
    assert all(query.stopped for query in start.started) and not supervisor.queries()


def test_a_query_s_name_tells_its_stream() -> None:
    """How a test or a benchmark finds the stop file of a query it holds (``tests/evaluator/spark/queries.py``)."""
    assert [stream_of_query(query_name(s)) for s in ("trades", "hosts", "tocsin")] == ["trades", "hosts", "tocsin"]
