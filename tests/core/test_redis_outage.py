"""Riding out a Redis outage (core.redis_outage) against a real redis-server that is stopped and started again."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from structlog.testing import capture_logs

from core.redis_outage import OUTAGES, Outage, is_transient
from core.settings import Settings
from devstack.services import free_port, start_redis


def _outages(component: str) -> float:
    return OUTAGES.labels(component)._value.get()


def test_an_operation_waits_for_redis_to_come_back_and_the_outage_counts_once(settings: Settings,
                                                                              tmp_path: Path) -> None:
    port = free_port()
    server = start_redis(port, tmp_path / "redis")
    # redis-py's own retries (a few seconds' worth by default) would hide a short outage: none here.
    client = redis.Redis(port=port, decode_responses=True, socket_timeout=1, retry=Retry(NoBackoff(), 0))
    quick = settings.model_copy(update={"redis_outage_backoff_base_s": 0.01, "redis_outage_backoff_cap_s": 0.2})
    outage = Outage("test-wait", quick)
    before = _outages("test-wait")
    server.kill()
    restarted: list = []

    def restart() -> None:
        time.sleep(1.5)  # several failed tries: still one outage
        restarted.append(start_redis(port, tmp_path / "redis"))

    thread = threading.Thread(target=restart)
    thread.start()
    try:
        with capture_logs() as logs:
            pipe = client.pipeline(transaction=False)
            pipe.set("a", "1")
            pipe.incr("n")
            assert outage.execute(pipe) == [True, 1], "the same commands, once, after the outage"
            assert outage.ride_out(lambda: client.get("a")) == "1"
        thread.join()
        assert _outages("test-wait") - before == 1
        events = [e["event"] for e in logs if e.get("component") == "test-wait"]
        assert events == ["redis_outage", "redis_recovered"], events
        assert not outage.down
    finally:
        thread.join()
        for each in restarted:
            each.stop()
        server.stop()


def test_an_error_no_wait_cures_is_raised_at_once(settings: Settings, redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    client.set("t31-string", "x")
    outage = Outage("test-wrong", settings)
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        outage.ride_out(lambda: client.lpush("t31-string", "y"))
    assert not outage.down and _outages("test-wrong") == 0
    assert not is_transient(redis.ResponseError("WRONGTYPE")) and is_transient(redis.ConnectionError("gone"))
    assert is_transient(redis.exceptions.RedisClusterException("Redis Cluster cannot be connected."))
    assert not is_transient(redis.exceptions.CrossSlotTransactionError("cross slot"))


def test_a_stop_ends_the_wait_with_the_error(settings: Settings) -> None:
    client = redis.Redis(port=free_port(), socket_connect_timeout=0.2)  # nothing listens there
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    with pytest.raises(redis.ConnectionError):
        Outage("test-stop", settings).ride_out(client.ping, stop)


def test_a_wait_with_a_limit_ends_with_the_error_and_the_caller_says_what_is_waited_out(settings: Settings) -> None:
    """``for_s`` bounds the wait (a delivery worker holds a sent attempt's records at most so long); ``transient``
    widens or narrows what is waited out (the worker's own judgement, which also waits for its broker)."""
    client = redis.Redis(port=free_port(), socket_connect_timeout=0.2)  # nothing listens there
    fast = settings.model_copy(update={"redis_outage_backoff_base_s": 0.05, "redis_outage_backoff_cap_s": 0.1})
    started = time.monotonic()
    with pytest.raises(redis.ConnectionError):
        Outage("test-limit", fast).ride_out(client.ping, for_s=0.5)
    assert time.monotonic() - started >= 0.5  # tried until the limit, not given up at the first failure
    tries = []

    def refused() -> None:
        tries.append(1)
        raise redis.ConnectionError("gone")
    with pytest.raises(redis.ConnectionError):
        Outage("test-narrow", fast).ride_out(refused, transient=lambda exc: False)
    assert len(tries) == 1  # not waited out: raised at once
