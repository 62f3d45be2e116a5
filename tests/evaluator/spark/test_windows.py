"""CHANGE %, tuple windows, NO DATA, STDDEV, ZSCORE and baselines (a window per part) through the real streaming
job: alerts equal the brute-force oracle's, with and without a SIGKILL and a restart from the checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from core.redis_schema import RedisKeys
from core.settings import Settings
from devstack.services import python_module, spawn
from evaluator.spark.job import build_query
from evaluator.spec import SubscriptionSpec
from ingest.kafka import ensure_topics
from subscriptions.language import parse_condition
from tests.evaluator.oracle import oracle
from tests.evaluator.spark.queries import stop_query
from tests.evaluator.spark.test_job import publish_catalog
from tests.evaluator.streams import (
    HORIZON,
    KEYS,
    alert_set,
    evaluated_everything,
    for_run,
    generated_stream,
    publish,
    wait_until,
)

pytestmark = pytest.mark.spark

SPECS = [
    SubscriptionSpec(1, parse_condition("CHANGE(price) OVER 5s > 1%")),
    SubscriptionSpec(2, parse_condition("CHANGE(price) OVER 5s < -1%")),
    SubscriptionSpec(3, parse_condition("AVG(price) OVER LAST 20 EVENTS > 101")),
    SubscriptionSpec(4, parse_condition("CHANGE(price) OVER LAST 10 EVENTS BETWEEN -0.5 AND 0.5")),
    SubscriptionSpec(5, parse_condition("NO DATA FOR 3s")),
    SubscriptionSpec(6, parse_condition("NO DATA FOR 2s"), frozenset({KEYS[0], KEYS[19], "NEVER"})),
    SubscriptionSpec(7, parse_condition("RATE(volume) OVER 5s > 5")),
    SubscriptionSpec(8, parse_condition("STDDEV(price) OVER 5s > 1")),
    SubscriptionSpec(9, parse_condition("ZSCORE(price) OVER 5s > 1.5")),
    SubscriptionSpec(10, parse_condition("ZSCORE(volume) OVER LAST 10 EVENTS > 2")),
    SubscriptionSpec(11, parse_condition("(SUM(volume) OVER 2s) / (SUM(volume) OVER 5s) > 0.6")),
    SubscriptionSpec(12, parse_condition("(AVG(price) OVER 1s) - (AVG(price) OVER 5s) > 0.5")),
]


def _expected(events: list, last: int, pane_ms: int) -> set[tuple]:
    expected = oracle(events, SPECS, last, pane_ms, HORIZON)
    assert {sid for sid, *_ in expected} == {s.id for s in SPECS}, "the stream should exercise every condition"
    assert (6, "NEVER", "firing") in {t[:3] for t in expected}
    return expected


@pytest.mark.slow  # a heavy property/Spark check: CI runs it (infra/test with CI set), a developer's default run not
def test_change_tuple_windows_and_no_data_equal_the_oracle(spark, settings: Settings, tmp_path: Path) -> None:
    ensure_topics(settings)
    events = generated_stream(seed=5, n=1_200)
    last = publish(settings, events)
    run = for_run(settings, "windows", tmp_path)
    publish_catalog(run, *SPECS)
    query = build_query(spark, run)
    try:
        wait_until(lambda: evaluated_everything(run, last, run.spark_shuffle_partitions), query=query)
    finally:
        stop_query(query, run)
    got = alert_set(run)
    assert len(got) == len(set(got)), "a transition was written twice"
    assert set(got) == _expected(events, last, run.pane_ms)


@pytest.mark.slow  # fault injection: run in CI
def test_sigkill_and_restart_give_the_oracle_alerts(spark, settings: Settings, tmp_path: Path) -> None:
    ensure_topics(settings)
    events = generated_stream(seed=13, n=1_200)
    last = publish(settings, events)
    shards = settings.spark_shuffle_partitions
    crashing = for_run(settings, "windows-crash", tmp_path)
    publish_catalog(crashing, *SPECS)
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    stats_key = RedisKeys(crashing).evaluator_stats
    logs = tmp_path / "logs"
    logs.mkdir()
    job = spawn("evaluator", python_module("evaluator.spark"), logs / "evaluator-1.log", env=crashing.to_env())
    try:
        wait_until(lambda: int(client.hget(stats_key, "last_batch_id") or -1) >= 2)
        job.kill()  # SIGKILL: the retained events of tuple windows come back from the snapshot and the log
        assert not evaluated_everything(crashing, last, shards), "killed too late to test anything"
        job = spawn("evaluator", python_module("evaluator.spark"), logs / "evaluator-2.log", env=crashing.to_env())
        wait_until(lambda: evaluated_everything(crashing, last, shards))
    finally:
        job.stop()
    got = alert_set(crashing)
    assert len(got) == len(set(got)), "a transition was written twice"
    assert set(got) == _expected(events, last, settings.pane_ms)
