"""The stream supervisor's decisions (real Redis registry; queries stood in for by recorders, Spark is not needed
to decide what to start, stop and restart): new streams start, changed ones restart, deleted ones stop, failed
ones restart with a doubling backoff while the others run."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import redis

from core.redis_schema import RedisKeys
from core.settings import Settings
from core.streams import Attribute, StreamSchema, trades_schema
from evaluator.spark.registry import RegistryReader, query_attributes
from evaluator.spark.supervisor import StreamSupervisor
from subscriptions.streams import publish_registry


@dataclass
class FakeQuery:
    schema: StreamSchema
    isActive: bool = True  # noqa: N815 - StreamingQuery's name
    error: str | None = None
    stopped: bool = False

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


def test_a_query_keeps_its_attribute_columns_and_only_appends(settings: Settings, tmp_path: Path) -> None:
    run = settings.model_copy(update={"checkpoint_dir": tmp_path / "checkpoint"})
    assert query_attributes(run, schema("s", Attribute(name="x"), Attribute(name="y"))) == ("x", "y")
    assert query_attributes(run, schema("s", Attribute(name="y"), Attribute(name="z", required=False))) == (
        "x", "y", "z")  # x removed: its column stays (always empty), so the state never shrinks
    assert query_attributes(run, schema("other")) == ("x",)
