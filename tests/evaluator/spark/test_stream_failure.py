"""A stream query that cannot run (its checkpoint made unreadable) on the real Spark session: the supervisor
restarts it with backoff, its failures in a row reach ``stats:evaluator`` with Spark's error, and the web app's
dead man's switch opens the ``stream`` incident naming it."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
import redis

from core.redis_schema import QUERY_FAILING, RedisKeys, stream_stat
from core.settings import Settings
from core.streams import Attribute, StreamSchema, topic_name, trades_schema
from devstack.patience import patient
from evaluator.spark.job import build_query
from evaluator.spark.registry import RegistryReader, checkpoint_of
from evaluator.spark.supervisor import StreamSupervisor
from ingest.kafka import ensure_topics
from subscriptions.streams import publish_registry
from tests.evaluator.spark.test_streams import stream_settings
from web.ops import sample_once, wait_for_probe
from web.watchdog import open_incidents

pytestmark = pytest.mark.spark

BAD = StreamSchema(name="bad", attributes=(Attribute(name="x"),), retention_ms=3_600_000, partitions=2)


def test_a_poisoned_stream_query_is_counted_in_redis_and_opens_the_incident(spark, settings: Settings,
                                                                            tmp_path: Path) -> None:
    run = stream_settings(settings, tmp_path).model_copy(update={"dashboard_sample_s": 0.2})
    client, keys = redis.Redis.from_url(run.redis_url, decode_responses=True), RedisKeys(run)
    ensure_topics(run)
    ensure_topics(run, {topic_name("bad", run): 2})
    checkpoint = Path(checkpoint_of(run, "bad"))
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "metadata").write_text(json.dumps({"id": str(uuid.uuid4())}))  # the query starts ...
    (checkpoint / "offsets" / "0").write_text("not a Spark offset log\n")  # ... and dies on a torn offset log
    publish_registry(client, keys, [trades_schema(run), BAD])
    supervisor = StreamSupervisor(spark, run, RegistryReader(client, keys, run), build_query)
    failing: dict = {}
    deadline = time.monotonic() + patient(240)
    try:
        while failing.get("failures", 0) < run.watchdog_stream_failures:
            assert time.monotonic() < deadline, f"the supervisor recorded {failing or 'no failure'}"
            supervisor.poll()
            failing = json.loads(client.hget(keys.evaluator_stats, stream_stat("bad", QUERY_FAILING)) or "{}")
            time.sleep(0.5)
        client.hset(keys.evaluator_stats, "driver_heartbeat_at", time.time())
        sample_once(run, client)
    finally:
        supervisor.stop_all()
        wait_for_probe()
    assert supervisor.failures >= run.watchdog_stream_failures, "each failure was a query that ran and died"
    assert "MALFORMED_LOG_FILE" in failing["error"] and "bad/offsets/0" in failing["error"], failing["error"]
    incident = open_incidents(client, run)["stream"]
    assert incident["detail"].startswith(f"stream bad: its query failed {failing['failures']} times in a row (last: ")
    assert "MALFORMED_LOG_FILE" in incident["detail"]
    assert incident["since"] == failing["since"]
