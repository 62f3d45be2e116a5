"""A producer's clock cannot move a stream's evaluation clock (docs/clock.md), on the real job.

One producer runs four minutes fast on every partition beside an honest one publishing in real
time, straight to Kafka (events and heartbeats) or over the HTTP publishing API with publisher
tokens (the web app sends the heartbeats). The honest keys' alerts must be exactly the oracle's
without the fast producer's events; events a few seconds ahead count when the wall clock reaches
them; nothing is evaluated beyond the processing clock plus the tolerance; the fast source is named
for the dead man's switch. Before the clock rule the fast heartbeats (the web app's own, over HTTP)
took every shard four minutes ahead at once: honest alerts resolved early, later honest events were
dropped as too old.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import redis

from core.clock_ahead import ClockAhead, recent
from core.redis_schema import RedisKeys
from core.settings import Settings
from evaluator.spark.job import build_query
from evaluator.spark.sink import evaluated_through
from evaluator.spec import SubscriptionSpec
from ingest.kafka import ensure_topics
from ingest.model import Event
from ingest.publisher import EventPublisher
from subscriptions.language import parse_condition
from tests.evaluator.oracle import oracle
from tests.evaluator.spark.queries import stop_query
from tests.evaluator.spark.test_job import publish_catalog, transitions
from tests.evaluator.streams import wait_until
from tests.ingest.test_publisher import read_topic
from tests.users import new_user

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]  # real time, and a loaded machine's minute-long batches

SKEW_MS = 240_000  # the producer four minutes fast
SOON_MS = 8_000  # events a little ahead (beyond the tolerance, within TOCSIN_MAX_FUTURE_SKEW_MS)
HORIZON = 20_000
CONDITIONS = ("COUNT(*) OVER 5s >= 3", "SUM(volume) OVER 3s > 40")

Record = tuple[str, int, float, float]  # key, ts, price, volume
#: One tick of both producers: (honest events, fast events, honest progress, fast progress); None: no heartbeat.
Send = Callable[[list[Record], list[Record], int | None, int | None], None]


def wall_ms() -> int:
    return int(time.time() * 1000)


def run_settings(settings: Settings, tmp_path: Path) -> Settings:
    run = settings.model_copy(update={"max_window_ms": HORIZON, "checkpoint_dir": str(tmp_path / "checkpoint")})
    ensure_topics(run)
    return run


def fast_and_honest(spark, run: Settings, send: Send, specs: list[SubscriptionSpec]) -> None:
    """Both producers for 16 s, the honest one alone until the soon events' windows passed; returns the
    transitions, the events that are on time by the end, the last boundary judged and when the run ended."""
    rng = random.Random(5)
    honest: list[Record] = []
    query = build_query(spark, run)
    try:
        started = wall_ms()
        soon = [("F", started + SOON_MS + i * 100, 10.0, 20.0) for i in range(3)]
        send(soon, [], None, None)
        for _ in range(64):  # ~16 s (longer on a loaded machine: the phases count ticks, not seconds)
            now = wall_ms()
            tick = [(key, now - rng.randint(0, 500), 10.0, float(rng.randint(1, 30)))  # bursts and pauses
                    for key in ("H0", "H1", "H2") for _ in range(rng.choice([0, 0, 1, 3]))]
            honest += tick
            send(tick, [("S", now + SKEW_MS, 10.0, 50.0)], now - 500, now + SKEW_MS)
            time.sleep(0.25)
        end = max(wall_ms(), started + SOON_MS + 12_000)
        while (beat := min(wall_ms() - 500, end)) < end:  # honest time goes on to the end, never ahead
            send([], [], beat, None)
            time.sleep(0.25)
        send([], [], end, None)
        last = (end - run.watermark_delay_ms) // run.pane_ms * run.pane_ms
        stats = redis.Redis.from_url(run.redis_url, decode_responses=True)

        def evaluated_to_last() -> bool:
            done = evaluated_through(stats.hgetall(RedisKeys(run).evaluator_stats), run.spark_shuffle_partitions)
            return done is not None and done >= last

        wait_until(evaluated_to_last, query=query, timeout_s=600)  # a loaded machine: batches of a minute
        finished = wall_ms()
    finally:
        stop_query(query, run)
    got = transitions(run)
    expected = oracle(honest + soon, specs, last, run.pane_ms, HORIZON)
    assert len(expected) >= 6, "the honest stream should fire and resolve"
    assert {(t["subscription_id"], t["key"], t["state"], t["evaluated_at"]) for t in got
            if t["evaluated_at"] <= last} == expected
    soon_fired = [t["evaluated_at"] for t in got if t["key"] == "F" and t["state"] == "firing"]
    assert soon_fired and min(soon_fired) > started + SOON_MS, "the events ahead counted when their time came"
    assert not [t for t in got if t["key"] == "S"], "the fast producer's events wait for their time"
    assert max(t["evaluated_at"] for t in got) <= finished + run.clock_tolerance_ms
    assert int(stats.hget(RedisKeys(run).evaluator_stats, "events_ahead_of_clock") or 0) >= len(soon)


def marks(run: Settings) -> list[ClockAhead]:
    return recent(redis.Redis.from_url(run.redis_url, decode_responses=True), RedisKeys(run), window_s=600)


@pytest.mark.slow  # ~50 s of real time and Spark: CI runs it (pure: tests/evaluator/test_clock_rule.py)
def test_a_producer_running_fast_on_every_partition_moves_no_clock(spark, settings: Settings, tmp_path: Path) -> None:
    run = run_settings(settings, tmp_path)
    specs = [SubscriptionSpec(i, parse_condition(text)) for i, text in enumerate(CONDITIONS, 1)]
    publish_catalog(run, *specs)
    with EventPublisher(run) as publisher:
        def send(honest: list[Record], fast: list[Record], honest_beat: int | None, fast_beat: int | None) -> None:
            for key, ts, price, volume in honest + fast:
                publisher.publish(Event(key=key, ts=ts, price=price, volume=volume))
            for beat in (fast_beat, honest_beat):  # the fast producer's progress reaches every partition
                if beat is not None:
                    publisher.heartbeat(beat)
            publisher.flush()

        fast_and_honest(spark, run, send, specs)
    found = marks(run)
    assert {m.source for m in found} == {f"partition {p}" for p in range(run.event_partitions)}
    assert all(m.stream == "trades" and m.ahead_ms > SKEW_MS - 60_000 for m in found)


@contextmanager
def publishers(run: Settings) -> Iterator[tuple[httpx.Client, dict[str, str], dict[str, str], list[SubscriptionSpec]]]:
    """A real web app; the headers of an honest and a fast publisher token on ``trades``, and the subscriptions
    made through it (the web app publishes the evaluator's catalog)."""
    from tests.servers import serving
    from web.app import create_app

    _, token = new_user(run, role="operator")
    with serving(create_app(run)) as url, httpx.Client(base_url=url, timeout=60) as client:
        operator = {"Authorization": f"Bearer {token}"}
        headers = []
        for name in ("honest", "fast"):
            made = client.post("/api/publisher-tokens", headers=operator, json={"name": name, "streams": ["trades"]})
            assert made.status_code == 201, made.text
            headers.append({"Authorization": f"Bearer {made.json()['token']}"})
        specs = []
        for text in CONDITIONS:
            made = client.post("/api/subscriptions", headers=operator, json={"name": text, "condition": text})
            assert made.status_code == 201, made.text
            specs.append(SubscriptionSpec(made.json()["id"], parse_condition(text)))
        yield client, headers[0], headers[1], specs


@pytest.mark.slow  # the same rule as above through the web app (~2 min of real time): CI runs it
def test_a_publisher_running_fast_over_http_moves_no_clock(spark, settings: Settings, tmp_path: Path) -> None:
    run = run_settings(settings.model_copy(update={"publish_heartbeat_ms": 250}), tmp_path)
    with publishers(run) as (client, honest_token, fast_token, specs):
        def post(headers: dict[str, str], records: list[Record]) -> None:
            if records:
                body = [{"key": k, "ts": ts, "price": p, "volume": v} for k, ts, p, v in records]
                answer = client.post("/api/streams/trades/events", headers=headers, json=body)
                assert answer.status_code == 202 and answer.json()["accepted"] == len(body), answer.text

        def send(honest: list[Record], fast: list[Record], honest_beat: int | None, fast_beat: int | None) -> None:
            post(honest_token, honest)  # the web app sends the heartbeats
            post(fast_token, fast)

        fast_and_honest(spark, run, send, specs)
        made_by_web = [r for r in map(json.loads, read_topic(run, run.events_topic)) if r.get("kind") == "heartbeat"]
        assert made_by_web and max(r["ts"] for r in made_by_web) <= wall_ms(), "a heartbeat ahead of the web's clock"
    found = {m.source: m for m in marks(run)}
    fast = [m for source, m in found.items() if source.startswith("publisher token 'fast'")]
    assert fast and fast[0].ahead_ms > SKEW_MS - 60_000
    honest = [m for source, m in found.items() if source.startswith("publisher token 'honest'")]
    assert all(m.ahead_ms <= SOON_MS + 1_000 for m in honest), "the honest token sent only the soon events ahead"
