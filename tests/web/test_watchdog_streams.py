"""The dead man's switch's ``stream`` rule on real components: the web app's sampler (``web.ops.sample_once``)
reads the stream registry and every stream query's clocks from Redis and each stream topic's log ends from the
Tansu broker. A stream whose clock stalls while records keep arriving opens one incident naming it, and only it
(a healthy stream beside it and an idle one are not named); a stream query the evaluator's supervisor cannot
keep running does too. Each opening and closing is handed once to the operators' delivery task."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import redis

from core.redis_schema import RedisKeys, shard_clock_field, stream_stat
from core.settings import Settings
from core.streams import Attribute, StreamSchema, topic_name, trades_schema
from devstack.patience import patient
from ingest.kafka import ensure_topics
from ingest.streams import StreamPublisher
from notifier.app import DELIVER_TASK
from notifier.outbox import NOTED_HEADER
from subscriptions.streams import publish_registry
from web.ops import sample_once, wait_for_probe
from web.watchdog import open_incidents

CLOCK = 1_800_000_000_000


@dataclass
class Operators:
    """Stands in for Celery: the delivery tasks the watchdog enqueues for the operator endpoints."""

    sent: list[dict] = field(default_factory=list)
    conf = type("Conf", (), {"tocsin_lanes": {"alerts": "q", "tests": "q:tests"}})()

    def send_task(self, name: str, args: tuple, kwargs: dict | None = None, queue: str | None = None,
                  headers: dict | None = None) -> None:
        assert name == DELIVER_TASK and queue == "q"
        assert headers is not None and type(headers[NOTED_HEADER]) is int  # noted first: the outbox sends it again
        self.sent.append(args[0])

    def states(self) -> list[tuple[str, str]]:
        return [(n["watchdog"]["rule"], n["state"]) for n in self.sent]


def _schema(name: str) -> StreamSchema:
    return StreamSchema(name=name, attributes=(Attribute(name="x"),), retention_ms=3_600_000, partitions=2)


def _watched(settings: Settings) -> Settings:
    return settings.model_copy(update={
        "stream_topic_prefix": f"{settings.events_topic}.stream.", "dashboard_sample_s": 0.2, "watchdog_stall_s": 2.0,
        "evaluator_stale_s": 3600.0, "operator_endpoint_ids": [7]})


def _declare(settings: Settings, client: redis.Redis, *names: str) -> dict[str, StreamSchema]:
    schemas = {name: _schema(name) for name in names}
    ensure_topics(settings)
    ensure_topics(settings, {topic_name(name, settings): 2 for name in names})
    publish_registry(client, RedisKeys(settings), [trades_schema(settings), *schemas.values()])
    return schemas


def test_a_stream_whose_clock_stalls_while_records_arrive_opens_one_incident_naming_only_it(
        settings: Settings, redis_client: redis.Redis) -> None:
    run = _watched(settings)
    keys = RedisKeys(run)
    schemas = _declare(run, redis_client, "stuck", "healthy", "idle")
    operators = Operators()
    healthy_clock = [CLOCK]

    def evaluator_reports(stuck_at: int) -> None:
        """What the sinks of the three stream queries write: each shard's clock (healthy's moves), and a heartbeat."""
        healthy_clock[0] += 1_000
        clocks = {"stuck": stuck_at, "healthy": healthy_clock[0], "idle": CLOCK}
        redis_client.hset(keys.evaluator_stats, mapping={
            "driver_heartbeat_at": time.time(),
            **{stream_stat(name, shard_clock_field(shard)): at for name, at in clocks.items() for shard in (0, 1)}})

    def publish(publisher: StreamPublisher, n: int) -> None:
        publisher.publish_records([json.dumps({"key": f"K{i % 3}", "ts": CLOCK + i, "x": 1}) for i in range(n)],
                                  ["test"] * n)
        publisher.flush()

    def sample(stuck_at: int) -> dict:
        evaluator_reports(stuck_at)
        for publisher in publishers:
            publish(publisher, 5)
        taken = sample_once(run, redis_client, operators)  # type: ignore[arg-type]
        time.sleep(run.dashboard_sample_s)
        return taken or {}

    publishers = [StreamPublisher(run, schemas["stuck"]), StreamPublisher(run, schemas["healthy"])]
    try:
        first = sample(CLOCK)
        assert set(first["streams"]) == {"stuck", "healthy", "idle"}, "every declared stream but trades is sampled"
        assert first["streams"]["idle"] == {"clock": CLOCK, "log_end": 0}
        deadline = time.monotonic() + patient(30)
        while "stream" not in open_incidents(redis_client, run):
            assert time.monotonic() < deadline, "the stalled stream was not noticed"
            sample(CLOCK)
        incident = open_incidents(redis_client, run)["stream"]
        assert incident["detail"].startswith(f"stream stuck: shard clock stuck at {CLOCK} while ")
        assert "healthy" not in incident["detail"] and "idle" not in incident["detail"]
        assert set(open_incidents(redis_client, run)) == {"stream"}, "trades itself is fine"
        assert time.time() - incident["since"] >= run.watchdog_stall_s
        for _ in range(5):  # the incident goes on: nothing more is sent
            sample(CLOCK)
        assert operators.states() == [("stream", "firing")]
        assert operators.sent[0]["subscription_name"] == "Tocsin dead man's switch: stream"

        moved = CLOCK
        while "stream" in open_incidents(redis_client, run):  # its query evaluates again
            assert time.monotonic() < deadline + 30, "the incident did not close"
            moved += 1_000
            sample(moved)
    finally:
        for publisher in publishers:
            publisher.close()
        wait_for_probe()
    assert operators.states() == [("stream", "firing"), ("stream", "resolved")]
    assert operators.sent[1]["watchdog"]["since"] == operators.sent[0]["watchdog"]["since"]


def test_a_stream_query_the_supervisor_cannot_keep_running_opens_the_incident(
        settings: Settings, redis_client: redis.Redis) -> None:
    from evaluator.spark.registry import RegistryReader
    from evaluator.spark.supervisor import StreamSupervisor

    run = _watched(settings)
    keys = RedisKeys(run)
    _declare(run, redis_client, "broken", "fine")

    def start(spark: object, settings: Settings, schema: StreamSchema) -> object:
        if schema.name == "broken":
            raise RuntimeError("checkpoint unreadable")
        return type("Running", (), {"isActive": True})()

    clock = [0.0]
    supervisor = StreamSupervisor(None, run, RegistryReader(redis_client, keys, run), start,  # type: ignore[arg-type]
                                  clock=lambda: clock[0])
    operators = Operators()
    try:
        for now in (0.0, 1.0, 3.0):  # retried after 1 s and 2 s: three failures in a row
            clock[0] = now
            supervisor.poll()
            redis_client.hset(keys.evaluator_stats, "driver_heartbeat_at", time.time())
            sample_once(run, redis_client, operators)  # type: ignore[arg-type]
            time.sleep(run.dashboard_sample_s)
            assert ("stream" in open_incidents(redis_client, run)) == (now == 3.0)
    finally:
        wait_for_probe()
    detail = open_incidents(redis_client, run)["stream"]["detail"]
    assert detail == "stream broken: its query failed 3 times in a row (last: RuntimeError: checkpoint unreadable)"
    assert operators.states() == [("stream", "firing")]
