"""Previews in the running job on a declared stream with negative values (issue 30): every answer right, a failing
preview failing only its request, and the stream's batches never failed by a preview.

Before: a preview built every collective index, whose CI-SUM refused negative values; the ``ValueError`` was raised
in the shard's task after its copy was cached, and failed the stream's micro-batch (so the query)."""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path

import pytest
import redis

from core.redis_schema import RedisKeys
from core.settings import Settings
from core.streams import Attribute, StreamSchema, topic_name
from devstack.patience import patient
from evaluator.preview import PreviewAnswer, PreviewRequest
from evaluator.spark.job import build_query
from evaluator.spec import Aggregate, Condition, SubscriptionSpec
from ingest.kafka import ensure_topics
from ingest.streams import StreamPublisher
from tests.evaluator.spark.queries import stop_query
from tests.evaluator.spark.test_job import publish_catalog, recent_base, transitions
from tests.evaluator.spark.test_streams import done, healthy, stream_settings
from tests.evaluator.streams import wait_until

pytestmark = pytest.mark.spark

#: ``temp`` has no ``min``: negative values are valid.
TEMPS = StreamSchema(name="temps", attributes=(Attribute(name="temp", unit="°C"),), retention_ms=3_600_000, partitions=2)
# (key, ms after the base, temp): in the base's pane, so every 5 s window at base + 2 s holds all of them
RECORDS = [("k1", 0, -5.5), ("k1", 100, 2.0), ("k2", 200, 4.0), ("k3", 300, -1.0), ("k3", 400, -2.0)]


def on_temps(aggregate: Aggregate, low: float | None = None, high: float | None = None,
             inclusive: bool = False) -> Condition:
    return Condition(aggregate, None if aggregate is Aggregate.COUNT else "temp", 5_000, low, high, inclusive,
                     inclusive, stream="temps")


def ask(settings: Settings, client: redis.Redis, condition: Condition, shards: int) -> dict[int, PreviewAnswer]:
    """What the web app does (``web.conditions``): write the request, gather one answer per shard."""
    keys, request_id = RedisKeys(settings), uuid.uuid4().hex
    client.hset(keys.previews, request_id, PreviewRequest(condition, None, time.time()).to_json())
    answers: dict[int, PreviewAnswer] = {}
    deadline = time.monotonic() + patient(90)
    try:
        while len(answers) < shards and time.monotonic() < deadline:
            got = client.blpop([keys.preview_answers(request_id)], timeout=1)
            if got:
                answer = PreviewAnswer.from_json(got[1])
                answers[answer.shard] = answer
    finally:
        client.hdel(keys.previews, request_id)
    assert len(answers) == shards, f"{len(answers)} of {shards} shards answered"
    return answers


def matches(answers: dict[int, PreviewAnswer]) -> dict[str, float]:
    assert all(a.error is None for a in answers.values()), [a.error for a in answers.values()]
    return {k: v for a in answers.values() for k, v in a.matches}


@pytest.mark.slow  # CI: ~30 s; test_job keeps a preview answered by every shard
def test_previews_over_negative_values_are_right_and_never_fail_the_batch(spark, settings: Settings,
                                                                          tmp_path: Path) -> None:
    run = stream_settings(settings, tmp_path).model_copy(update={"preview_timeout_s": 60.0})
    ensure_topics(run)
    ensure_topics(run, {topic_name("temps", run): 2})
    warm, cold = SubscriptionSpec(1, on_temps(Aggregate.SUM, low=0.0)), SubscriptionSpec(2, on_temps(Aggregate.MIN,
                                                                                                       high=-5.0))
    publish_catalog(run, warm, cold)
    client = redis.Redis.from_url(run.redis_url)
    base, shards = recent_base(), run.spark_shuffle_partitions
    query = build_query(spark, run, TEMPS)
    stop = threading.Event()

    def heartbeats() -> None:  # a live feed's heartbeats: every shard runs a batch (and answers) every trigger
        with StreamPublisher(run, TEMPS) as publisher:
            while not stop.wait(0.3):
                publisher.heartbeat(base + 4_000)

    beating = threading.Thread(target=heartbeats, daemon=True)
    try:
        with StreamPublisher(run, TEMPS) as publisher:
            batch = publisher.publish_records([json.dumps({"key": k, "ts": base + dt, "temp": t}) for k, dt, t in RECORDS],
                                              ["test"] * len(RECORDS))
            assert not batch.rejected
            publisher.heartbeat(base + 4_000)
        wait_until(lambda: healthy([query]) and done(run, base + 2_000, "temps"), timeout_s=180, query=query)
        beating.start()
        assert matches(ask(run, client, on_temps(Aggregate.SUM, low=0.0), shards)) == {"k2": 4.0}
        assert matches(ask(run, client, on_temps(Aggregate.SUM, high=0.0), shards)) == {"k1": -3.5, "k3": -3.0}
        assert matches(ask(run, client, on_temps(Aggregate.COUNT, low=2.0, inclusive=True), shards)) == {
            "k1": 2.0, "k3": 2.0}
        assert matches(ask(run, client, on_temps(Aggregate.MIN, high=-1.0), shards)) == {"k1": -5.5, "k3": -2.0}
        assert matches(ask(run, client, on_temps(Aggregate.MAX, low=-1.5), shards)) == {"k1": 2.0, "k2": 4.0,
                                                                                         "k3": -1.0}
        assert matches(ask(run, client, on_temps(Aggregate.AVG, high=0.0), shards)) == {"k1": -1.75, "k3": -1.5}
        alien = Condition(Aggregate.SUM, "humidity", 5_000, low=0.0, stream="temps")  # a schema the query lacks
        failed = ask(run, client, alien, shards)
        assert {a.error for a in failed.values()} == {"stream 'temps' has no attribute 'humidity'"}
        assert matches(ask(run, client, on_temps(Aggregate.SUM, low=0.0), shards)) == {"k2": 4.0}  # and the next
        assert healthy([query]) and query.isActive, "no preview failed the stream's batches"
    finally:
        stop.set()
        stop_query(query, run)
    fired = {(t["subscription_id"], t["key"], t["state"], t["value"]) for t in transitions(run)}
    assert fired == {(1, "k2", "firing", 4.0), (2, "k1", "firing", -5.5)}
