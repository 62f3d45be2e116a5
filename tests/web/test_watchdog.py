"""The dead man's switch end to end: a watermark that really stalls while records keep arriving on the
Tansu broker is noticed by the web app's own sampler, shown on /metrics and /ops, and an operator
endpoint gets exactly one "firing" and, after recovery, one "resolved" through a real Celery worker."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from core.redis_schema import RedisKeys, shard_clock_field
from core.settings import Settings
from devstack.receiver import WebhookReceiver
from ingest.kafka import ensure_topics
from ingest.model import Event
from ingest.publisher import EventPublisher
from subscriptions.db import session_factory
from subscriptions.schemas import EndpointIn
from subscriptions.service import SubscriptionService
from tests.notifier.test_delivery import _eventually
from tests.processes import running, worker_args
from tests.users import api_client, new_user, sign_in
from web.ops import sample_once
from web.watchdog import RULES

pytestmark = pytest.mark.e2e


def _firing(metrics: str, rule: str) -> float:
    line = next(x for x in metrics.splitlines() if x.startswith(f'tocsin_watchdog_firing{{rule="{rule}"}}'))
    return float(line.split()[-1])


CLOCK = 1_800_000_000_000


def beat(client: redis.Redis, settings: Settings, at: int) -> None:
    """What the evaluator writes: its heartbeat, and every shard's clock (here: stuck at ``at``)."""
    client.hset(RedisKeys(settings).evaluator_stats, mapping={
        "driver_heartbeat_at": time.time(), "driver_started_at": 1.0, "last_batch_at": time.time(),
        shard_clock_field(0): at, shard_clock_field(1): at})


def publish(publisher: EventPublisher, n: int) -> None:
    """``n`` trades dated from ``CLOCK``: records keep arriving."""
    for i in range(n):
        publisher.publish(Event(key=f"K{i % 5}", ts=CLOCK + i, price=1, volume=1))
    publisher.flush()


def test_a_stalled_watermark_fires_once_and_resolves_once(settings: Settings, redis_client: redis.Redis,
                                                          tmp_path: Path) -> None:
    ensure_topics(settings)
    operator, _ = new_user(settings, role="operator")
    receiver = WebhookReceiver()
    with session_factory(settings.database_url)() as session:
        endpoint = SubscriptionService(session, settings, redis_client, operator).create_endpoint(
            EndpointIn(kind="webhook", target=receiver.url))
    settings = settings.model_copy(update={
        "web_sampler": True, "dashboard_sample_s": 0.2, "watchdog_stall_s": 2.0, "evaluator_stale_s": 3600.0,
        "operator_endpoint_ids": [endpoint.id]})
    clock = CLOCK

    def evaluator_beats(at: int) -> None:
        beat(redis_client, settings, at)

    try:
        with running(settings, tmp_path / "logs", ("worker", worker_args())), \
                EventPublisher(settings) as publisher, api_client(settings) as api:
            sign_in(api, operator.email)
            evaluator_beats(clock)
            publish(publisher, 10)
            assert _firing(api.get("/metrics").text, "stalled") == 0

            def stalled_and_shown() -> bool:
                """records keep arriving, the clock stays: the app's sampler notices"""
                evaluator_beats(clock)
                publish(publisher, 5)
                return _firing(api.get("/metrics").text, "stalled") == 1

            _eventually(stalled_and_shown, 30)
            page = api.get("/ops").text
            assert "Dead man's switch firing" in page and "stalled" in page and "shard clock stuck at" in page
            firing = receiver.wait_for(lambda r: r.json["state"] == "firing")[0].json
            assert firing["subscription_name"] == "Tocsin dead man's switch: stalled" and firing["operator"]
            assert firing["watchdog"]["rule"] == "stalled" and firing["watchdog"]["since"] > 0
            for _ in range(10):  # more samples of the same incident send nothing more
                evaluator_beats(clock)
                publish(publisher, 5)
                time.sleep(0.2)
            assert [r.json["state"] for r in receiver.received] == ["firing"]

            def recovered() -> bool:
                """the clock moves again"""
                evaluator_beats(clock + int(time.time() * 1000) % 1_000_000)
                publish(publisher, 5)
                return _firing(api.get("/metrics").text, "stalled") == 0

            _eventually(recovered, 30)
            assert "Dead man's switch firing" not in api.get("/ops").text
            receiver.wait_for(lambda r: r.json["state"] == "resolved")
            time.sleep(1.0)
            metrics = api.get("/metrics").text
    finally:
        receiver.close()
    assert [r.json["state"] for r in receiver.received] == ["firing", "resolved"]
    assert receiver.received[1].json["watchdog"]["since"] == firing["watchdog"]["since"]
    for counter in ("late_events_applied", "late_events_dropped", "future_events_refused",
                    "future_heartbeats_refused", "dead_lettered"):
        assert f"tocsin_stream_{counter} " in metrics


def test_every_rule_has_its_series_before_the_first_sample() -> None:
    """A fresh process's /metrics shows each rule at 0, not nothing: an alert on `tocsin_watchdog_firing == 1` (or a
    test reading it right after start) never meets an absent series before the sampler's first round."""
    code = ("import web.watchdog\nfrom prometheus_client import generate_latest\n"
            "print(generate_latest().decode())")
    metrics = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    for rule in RULES:
        assert _firing(metrics, rule) == 0


def _judged(metrics: str) -> float:
    line = next(x for x in metrics.splitlines() if x.startswith("tocsin_watchdog_last_judged_timestamp_seconds "))
    return float(line.split()[-1])


def test_with_no_web_process_sampling_the_ops_page_and_metrics_say_nothing_watches(
        settings: Settings, redis_client: redis.Redis) -> None:
    """``TOCSIN_WEB_SAMPLER`` off in every web process left the dead man's switch silent, and so everything it
    watches: the operators' page says so, and each web process serves when a sample was last judged."""
    operator, _ = new_user(settings, role="operator")
    settings = settings.model_copy(update={"web_sampler": False, "dashboard_sample_s": 0.2})
    with api_client(settings) as api:
        sign_in(api, operator.email)
        assert "Dead man's switch not watching" in api.get("/ops").text
        assert "no web process has judged a sample yet" in api.get("/ops/watchdog").text
        assert _judged(api.get("/metrics").text) == 0
        taken = sample_once(settings, redis_client)  # another web process, with its sampler on, takes one
        assert taken is not None
        assert "not watching" not in api.get("/ops/watchdog").text
        _eventually(lambda: _judged(api.get("/metrics").text) == taken["t"], 30)  # this process's gauges follow

        def unwatched_again() -> bool:
            """no sample for five periods: nothing watches again"""
            fragment = api.get("/ops/watchdog").text
            return "Dead man's switch not watching" in fragment and "judged a sample since" in fragment
        _eventually(unwatched_again, 30)
