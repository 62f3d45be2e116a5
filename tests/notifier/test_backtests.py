"""Backtests end to end: history published to the (Tansu) topic, a job started over the API, run by a real worker of
the backtests lane, read back; and the job's lifecycle (cancellation, expiry, a lost worker, per-account limits).

The transitions equal the brute-force oracle's on the same events; the policy's cool-down thins the notifications as
the dispatcher would.
"""

from __future__ import annotations

import itertools
import json
import time
from datetime import UTC, datetime
from pathlib import Path

import psutil
import pytest
import redis
from confluent_kafka import Producer

from core.settings import Settings
from core.streams import trades_schema
from devstack.patience import deadline
from devstack.run import python_module
from evaluator.spec import Aggregate, Condition, SubscriptionSpec
from ingest.kafka import ensure_topics
from ingest.model import Event, Heartbeat
from notifier.backtests import run_backtest
from subscriptions.backtests import BacktestJobs, BacktestRequest
from subscriptions.errors import Conflict, NotFound
from subscriptions.policy import AlertPolicy
from tests.evaluator.oracle import oracle
from tests.processes import running
from tests.users import api_client, new_user

KEYS = ("AAA", "BBB", "CCC", "DDD", "EEE")


def publish_history(settings: Settings, start_ms: int, seconds: int, per_second: int = 20) -> list[tuple]:
    """Events on every key over ``seconds`` from ``start_ms``, each record stamped with its event time (as a producer
    sending it then would stamp it), volumes rising and falling so a SUM threshold is crossed many times; and a
    heartbeat per partition each second (a partition no key hashes to would otherwise hold event time back)."""
    ensure_topics(settings)
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, "linger.ms": 20})
    events = []
    for i in range(seconds * per_second):
        ts = start_ms + i * 1000 // per_second
        key = KEYS[i % len(KEYS)]
        volume = float((i // (per_second * 7)) % 4 * 3 + (i % 3))  # waves over ~7 s
        events.append((key, ts, 10.0, volume))
        producer.produce(settings.events_topic, key=key.encode(),
                         value=Event(key=key, ts=ts, price=10.0, volume=volume).to_json(), timestamp=ts)
        if (i + 1) % per_second == 0:  # each second, a heartbeat on every partition, as producers send them
            for p in range(settings.event_partitions):
                producer.produce(settings.events_topic, value=Heartbeat(partition=p, ts=ts).to_json(), partition=p,
                                 timestamp=ts)
        if i % 500 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0
    return events


def worker(settings: Settings) -> tuple[str, list[str]]:
    return ("worker-backtests", python_module("notifier.worker", "--lane", "backtests", "--pool", "prefork",
                                              "--concurrency", "1", "--loglevel", "INFO", "--without-gossip",
                                              "--without-mingle", "--without-heartbeat"))


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat()


def wait_done(client, job_id: str, seconds: float = 120) -> dict:
    until = deadline(seconds)
    while time.monotonic() < until:
        job = client.get(f"/api/backtests/{job_id}").json()
        if job["state"] not in ("queued", "running"):
            return job
        time.sleep(0.3)
    raise AssertionError(f"backtest {job_id} still {job['state']}: {job}")


@pytest.mark.jvm  # not a JVM, but a worker process and a broker under load: one such test at a time
def test_a_backtest_started_over_the_api_yields_the_oracles_transitions(settings: Settings, tmp_path) -> None:
    settings = settings.model_copy(update={"backtest_chart_points": 40, "event_partitions": 2})
    start = (int(time.time() * 1000) - 3_600_000) // 1000 * 1000
    events = publish_history(settings, start, 90)
    _, token = new_user(settings)
    text = "SUM(volume) OVER 5s > 40"
    with running(settings, tmp_path / "logs", worker(settings)), api_client(settings, token) as client:
        started = client.post("/api/backtests", json={
            "condition": text, "start": iso(start - 60_000), "end": iso(start + 200_000),
            "policy": {"cooldown_s": 40, "send_resolved": False}})
        assert started.status_code == 202, started.text
        job = wait_done(client, started.json()["id"])
    assert job["state"] == "done", job
    result = job["result"]
    assert result["events"] == len(events) < result["records"] and result["dead_lettered"] == 0
    assert result["stopped_short"]  # the history ends at 90 s of the 200 s range (said, not hidden)
    condition = Condition(Aggregate.SUM, "volume", 5_000, low=40.0)
    expected = oracle(events, [SubscriptionSpec(0, condition, None)], result["evaluated_to"], settings.pane_ms,
                      settings.max_window_ms)
    got = {(0, t["key"], t["state"], t["at"]) for t in result["transitions"]}
    assert result["transitions_total"] == len(expected) == len(got) > 10
    assert got == expected
    assert result["firings"] == sum(1 for *_, state, _ in expected if state == "firing")
    # send-resolved off: no resolution notified; a 40 s cool-down (the waves come every 28 s): one in two notified
    notified = [t for t in result["transitions"] if t["notified"]]
    assert notified and all(t["state"] == "firing" for t in notified)
    for key in KEYS:
        times = [t["at"] for t in notified if t["key"] == key]
        assert all(b - a >= 40_000 for a, b in itertools.pairwise(times))
    assert result["notifications"] == len(notified) < result["firings"]
    chart = result["chart"]
    assert chart["thresholds"] == [40.0] and 1 <= len(chart["keys"]) <= settings.backtest_chart_keys
    assert all(len(k["points"]) > 5 and k["marks"] for k in chart["keys"])
    assert sum(d["firing"] for d in result["per_day"]) == result["firings"]


def _request(settings: Settings, start_ms: int, end_ms: int) -> BacktestRequest:
    condition = Condition(Aggregate.SUM, "volume", 5_000, low=40.0)
    return BacktestRequest(stream_schema=trades_schema(settings), condition="SUM(volume) OVER 5s > 40",
                           condition_spec=condition.to_dict(), start_ms=start_ms, end_ms=end_ms,
                           policy=AlertPolicy())


def test_a_job_queued_with_the_streams_name_beside_its_schema_still_reads(settings: Settings) -> None:
    """Requests carried the stream's name beside its schema until 2026-11-29: one queued then still runs."""
    request = _request(settings, 0, 60_000)
    legacy = {**json.loads(request.model_dump_json()), "stream": "trades"}
    assert BacktestRequest.model_validate_json(json.dumps(legacy)) == request and request.stream == "trades"


def test_a_cancelled_backtest_stops_at_its_next_chunk(settings: Settings, redis_client: redis.Redis) -> None:
    settings = settings.model_copy(update={"backtest_chart_points": 20})
    start = (int(time.time() * 1000) - 3_600_000) // 1000 * 1000
    publish_history(settings, start, 60)
    jobs = BacktestJobs(redis_client, settings)
    job = jobs.submit(7, _request(settings, start, start + 60_000))
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    client.hset(jobs.keys.backtest(7, job.id), "cancel", 1)  # asked while it is being claimed
    run_backtest(settings, client, 7, job.id)
    status = jobs.get(7, job.id)
    assert status.state == "cancelled" and status.result is None
    assert 0 < status.records_read < status.records_total  # one chunk read, not the rest
    assert jobs.submit(7, _request(settings, start, start + 60_000)).state == "queued"  # its place is free again


def test_a_backtest_holds_its_lane_worker_at_most_backtest_max_run_s(settings: Settings,
                                                                      redis_client: redis.Redis) -> None:
    """One account's long backtest must not keep everyone else's queued until they expire: it is stopped, with why."""
    settings = settings.model_copy(update={"backtest_chart_points": 20, "backtest_max_run_s": 0.001})
    start = (int(time.time() * 1000) - 3_600_000) // 1000 * 1000
    publish_history(settings, start, 60)
    jobs = BacktestJobs(redis_client, settings)
    job = jobs.submit(8, _request(settings, start, start + 60_000))
    run_backtest(settings, redis.Redis.from_url(settings.redis_url, decode_responses=True), 8, job.id)
    status = jobs.get(8, job.id)
    assert status.state == "failed" and "narrow the range or the keys" in (status.error or "")
    assert 0 < status.records_read < status.records_total
    assert jobs.submit(8, _request(settings, start, start + 60_000)).state == "queued"  # its place is free again


def test_an_account_has_at_most_its_active_backtests_and_another_account_sees_none_of_them(
        settings: Settings, redis_client: redis.Redis) -> None:
    jobs = BacktestJobs(redis_client, settings)
    now = int(time.time() * 1000)
    first = jobs.submit(1, _request(settings, now - 60_000, now))
    with pytest.raises(Conflict, match="already has 1 backtest"):
        jobs.submit(1, _request(settings, now - 60_000, now))
    assert jobs.submit(2, _request(settings, now - 60_000, now)).state == "queued"  # another account's own place
    with pytest.raises(NotFound):
        jobs.get(2, first.id)
    assert jobs.cancel(1, first.id).state == "cancelled"
    assert jobs.submit(1, _request(settings, now - 60_000, now)).state == "queued"


def test_a_job_queued_too_long_expires_and_one_whose_worker_died_fails(settings: Settings,
                                                                       redis_client: redis.Redis) -> None:
    settings = settings.model_copy(update={"backtest_queue_timeout_s": 0.2, "backtest_stale_s": 0.2})
    jobs = BacktestJobs(redis_client, settings)
    now = int(time.time() * 1000)
    queued = jobs.submit(3, _request(settings, now - 60_000, now))
    lost = jobs.submit(4, _request(settings, now - 60_000, now))
    assert jobs.claim(4, lost.id) is not None  # running, then its worker is killed: no more progress
    time.sleep(0.3)
    assert jobs.claim(3, queued.id) is None  # the lane came back too late
    assert jobs.get(3, queued.id).state == "expired"
    status = jobs.get(4, lost.id)
    assert status.state == "failed" and "worker was lost" in (status.error or "")
    assert jobs.submit(4, _request(settings, now - 60_000, now)).state == "queued"


@pytest.mark.skipif(not Path("/proc/self/autogroup").exists(), reason="no autogroup scheduling on this kernel")
def test_the_backtest_worker_yields_the_cpu_to_other_sessions_too(settings: Settings, tmp_path) -> None:
    """Plain nice spares other sessions nothing under autogroup scheduling (measured: the live evaluator's batches
    as slow beside a niced backtest as beside one at nice 0): the worker, leading its session as infra/up starts it,
    nices its session's group as well."""
    with running(settings, tmp_path / "logs", worker(settings)) as (process,):
        pid = process.process.pid
        until = deadline(30)
        while time.monotonic() < until and "nice 0" in Path(f"/proc/{pid}/autogroup").read_text():
            time.sleep(0.2)
        assert Path(f"/proc/{pid}/autogroup").read_text().split()[-1] == str(settings.backtest_worker_nice)
        assert psutil.Process(pid).nice() == settings.backtest_worker_nice
