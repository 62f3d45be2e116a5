"""The evaluator's progress loop rides out Redis being away (it exited on an uncaught ClusterDownError about 26 s
into a cluster outage): the outage is logged and counted once, and the loop goes on until stopped."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from structlog.testing import capture_logs

from core.redis_outage import OUTAGES, Outage
from core.redis_schema import RedisKeys
from core.settings import Settings
from devstack.patience import patient
from devstack.services import free_port
from evaluator.spark.__main__ import _follow


def _running_query() -> SimpleNamespace:
    """What ``_follow`` reads of a Spark StreamingQuery that keeps running (the loop's Redis handling is the test)."""
    return SimpleNamespace(isActive=True, name="trades", lastProgress={
        "batchId": 1, "durationMs": {"triggerExecution": 10}, "numInputRows": 0, "sources": []})


def test_the_progress_loop_outlives_redis_being_away(settings: Settings) -> None:
    # Nothing listens there; no retries of redis-py's own, which would hold the first round for seconds.
    away = redis.Redis(port=free_port(), socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    outage = Outage("follow-test", settings)
    stop = threading.Event()
    failure: list[BaseException] = []

    def follow() -> None:
        try:
            _follow(_running_query(), away, RedisKeys(settings), stop, refresh_s=0.1, outage=outage)  # type: ignore[arg-type]
        except BaseException as exc:  # noqa: BLE001 - the test's point
            failure.append(exc)

    with capture_logs() as logs:
        loop = threading.Thread(target=follow)
        loop.start()
        deadline = time.monotonic() + patient(60)
        while outage.since is None:  # the first round met Redis away
            assert time.monotonic() < deadline and loop.is_alive(), f"no outage seen: {failure}"
            time.sleep(0.05)
        time.sleep(1)  # more rounds (0.1 s apart), each meeting Redis away: still one outage
        assert loop.is_alive(), f"the loop ended: {failure}"
        stop.set()
        loop.join(timeout=30)
    assert not failure and not loop.is_alive()
    assert [e["event"] for e in logs if e.get("component") == "follow-test"] == ["redis_outage"]
    assert OUTAGES.labels("follow-test")._value.get() == 1
