"""Alert lifecycles through the real streaming job: a SIGKILL mid-stream and a restart from the checkpoint give
exactly the lifecycle oracle's transitions (pending periods, keep-firing, hysteresis, damping and crossings whose
state lives in the shard's snapshot and change log), none twice."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from core.redis_schema import RedisKeys
from core.settings import Settings
from core.stream_names import TRADES
from devstack.services import python_module, spawn
from evaluator.spark.graceful import hold
from evaluator.spark.source import stop_file
from evaluator.spec import SubscriptionSpec
from ingest.kafka import ensure_topics
from subscriptions.language import parse_condition
from tests.evaluator.oracle import lifecycle_oracle
from tests.evaluator.spark.test_job import publish_catalog, transitions
from tests.evaluator.streams import (
    HORIZON,
    evaluated_everything,
    for_run,
    generated_stream,
    publish,
    wait_until,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SPECS = [
    SubscriptionSpec(1, parse_condition("SUM(volume) OVER 10s > 600 FOR 3s")),
    SubscriptionSpec(2, parse_condition("AVG(price) OVER 5s > 101 KEEP FIRING FOR 4s")),
    SubscriptionSpec(3, parse_condition("COUNT(*) OVER 5s > 8 RESOLVE BELOW 6 FOR 2s KEEP FIRING FOR 3s")),
    SubscriptionSpec(4, parse_condition("MAX(price) OVER 10s >= 108 DAMPEN 10s")),
    SubscriptionSpec(5, parse_condition("LAST(price) OVER 5s CROSSES 100")),
    SubscriptionSpec(6, parse_condition("MIN(price) OVER 5s < 92")),
]


def test_sigkill_and_restart_give_the_lifecycle_oracles_transitions(settings: Settings, tmp_path: Path) -> None:
    ensure_topics(settings)
    events = generated_stream(seed=5, n=1_500)
    last = publish(settings, events)
    shards = settings.spark_shuffle_partitions
    # small batches, so the kill lands mid-stream
    run = for_run(settings, "lifecycle", tmp_path).model_copy(update={"source_max_records_per_trigger": 120})
    publish_catalog(run, *SPECS)
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    stats_key = RedisKeys(run).evaluator_stats
    logs = tmp_path / "logs"
    logs.mkdir()
    job = spawn("evaluator", python_module("evaluator.spark"), logs / "evaluator-1.log", env=run.to_env())
    try:
        wait_until(lambda: int(client.hget(stats_key, "last_batch_id") or -1) >= 3)
        job.kill()  # SIGKILL: no chance to commit, flush or clean up
        assert not evaluated_everything(run, last, shards), "killed too late to test anything"
        for left in (stop_file(run), stop_file(run, TRADES)):  # as a run killed while it stopped leaves them
            hold(left)
        job = spawn("evaluator", python_module("evaluator.spark"), logs / "evaluator-2.log", env=run.to_env())
        wait_until(lambda: evaluated_everything(run, last, shards))
    finally:
        job.stop()

    got = [(t["subscription_id"], t["key"], t["state"], t["evaluated_at"], t.get("kind", "state"))
           for t in transitions(run)]
    expected = lifecycle_oracle(events, SPECS, last, settings.pane_ms, HORIZON)
    assert len(got) == len(set(got)), "a transition was written twice"
    assert set(got) == expected
    assert {sid for sid, *_ in expected} == {s.id for s in SPECS}, "the stream should exercise every clause"
    assert any(kind == "crossing" for *_, kind in expected)
    crossing_firing = client.hkeys(RedisKeys(run).firing(5))
    assert crossing_firing == [], "a crossing is an event: nothing stays firing"
