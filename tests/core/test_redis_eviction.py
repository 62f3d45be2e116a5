"""A Redis that could evict alerts is refused; one that could evict dedupe marks is warned of; one that is full
holds the sink's batch until it has room (core.redis_eviction, core.redis_outage), against real redis-servers."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from structlog.testing import capture_logs

from core.redis_eviction import EvictionRefused, NodeMemory, check_eviction
from core.redis_schema import RedisKeys
from core.settings import Settings
from devstack.patience import deadline
from devstack.services import free_port, start_redis
from evaluator.spark.sink import RedisAlertSink, clock_record
from notifier.dispatcher import Dispatcher
from tests.evaluator.spark.test_sink import Batch, transition


@pytest.fixture
def own_redis(settings: Settings, tmp_path: Path) -> Iterator[tuple[Settings, redis.Redis]]:
    """A redis-server of this test's own (its configuration is changed), and settings pointing at it."""
    port = free_port()
    server = start_redis(port, tmp_path / "redis")
    client = redis.Redis(port=port, decode_responses=True)
    try:
        yield settings.model_copy(update={"redis_url": f"redis://127.0.0.1:{port}/0"}), client
    finally:
        client.close()
        server.stop()


def test_the_policy_decides_what_a_full_node_may_lose() -> None:
    assert NodeMemory("n", "allkeys-lru", 1 << 30).loses_alerts
    assert NodeMemory("n", "allkeys-random", 1).loses_alerts
    assert not NodeMemory("n", "allkeys-lru", 0).loses_alerts  # no limit: nothing is ever evicted
    assert NodeMemory("n", "volatile-ttl", 1 << 30).may_repeat_alerts
    assert not NodeMemory("n", "volatile-ttl", 1 << 30).loses_alerts
    assert not NodeMemory("n", "noeviction", 1 << 30).loses_alerts
    assert not NodeMemory("n", "noeviction", 1 << 30).may_repeat_alerts


def test_the_sink_and_the_dispatcher_refuse_a_node_that_may_evict_any_key(own_redis) -> None:
    """Under allkeys-lru a full Redis drops undispatched alert-stream entries and firing sets: alerts lost without a
    trace. Both processes that carry alerts through Redis refuse to start on it, saying what to set."""
    settings, client = own_redis
    client.config_set("maxmemory", "100mb")
    client.config_set("maxmemory-policy", "allkeys-lru")
    with pytest.raises(EvictionRefused, match=r"allkeys-lru, maxmemory 104857600.*maxmemory-policy to noeviction"):
        RedisAlertSink(settings)
    with pytest.raises(EvictionRefused, match="allkeys-lru"):
        Dispatcher(settings)
    client.config_set("maxmemory", "0")  # no limit: that policy never applies
    RedisAlertSink(settings)
    Dispatcher(settings)


def test_a_node_that_may_evict_keys_with_a_ttl_is_warned_of_and_the_default_passes(own_redis) -> None:
    settings, client = own_redis
    client.config_set("maxmemory", "100mb")
    client.config_set("maxmemory-policy", "volatile-lru")
    with capture_logs() as logs:
        RedisAlertSink(settings)
    [warning] = [e for e in logs if e["event"] == "redis_may_evict_dedupe_marks"]
    assert warning["policy"] == "volatile-lru" and warning["component"] == "sink"
    client.config_set("maxmemory-policy", "noeviction")
    with capture_logs() as logs:
        nodes = check_eviction(client, "test")
    assert [(n.policy, n.maxmemory) for n in nodes] == [("noeviction", 100 * 1024 * 1024)]
    assert not [e for e in logs if e["log_level"] in ("warning", "error")]


def test_a_redis_that_will_not_show_its_configuration_is_logged_as_unchecked(own_redis) -> None:
    """Managed Redis services deny CONFIG: the check cannot be made, which is said, not fatal."""
    _, client = own_redis
    client.acl_setuser("tocsin", enabled=True, passwords=["+secret"], keys=["*"], channels=["*"],
                       commands=["+@all", "-config"])
    limited = redis.Redis(port=client.connection_pool.connection_kwargs["port"], username="tocsin", password="secret")
    with capture_logs() as logs:
        assert check_eviction(limited, "test") == []
    assert [e["event"] for e in logs] == ["redis_eviction_unchecked"]


def test_a_full_redis_holds_the_batch_until_it_has_room_and_loses_nothing(own_redis) -> None:
    """noeviction refuses writes when full (OOM). The sink failed its batch on the first OOM; it rides it out as an
    outage, and every alert is stored once memory is freed."""
    settings, client = own_redis
    settings = settings.model_copy(update={"redis_outage_backoff_base_s": 0.01, "redis_outage_backoff_cap_s": 0.2})
    sink = RedisAlertSink(settings)
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory", str(used + 64 * 1024))  # full after a few hundred alerts
    done: list[BaseException | None] = []

    def write() -> None:
        try:
            at = 1_800_000_000_000
            sink(Batch([*(transition(sid, "K", "firing", at) for sid in range(1, 2_001)), clock_record(0, at)]),  # type: ignore[arg-type]
                 1)
            done.append(None)
        except BaseException as exc:  # noqa: BLE001 - reported below
            done.append(exc)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    wait = deadline(60)
    while not sink.outage.down:  # the sink met the OOM and waits
        assert not done, f"the sink ended while Redis was full: {done}"
        assert time.monotonic() < wait, "the sink never met a full Redis"
        thread.join(0.1)
    client.config_set("maxmemory", "0")
    thread.join(timeout=deadline(60) - time.monotonic())
    assert done == [None]
    keys = RedisKeys(settings)
    stored = sum(client.xlen(stream) for stream in keys.alerts_streams)
    assert stored == 2_000  # every alert once: what the calls before the OOM wrote is not written again
