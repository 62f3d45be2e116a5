"""A shard's set of waiting subscriptions in Redis (evaluator/spark/waiting.py), written by whichever process runs
the shard's batch: after every write, Redis holds exactly the set of the batch, whether the writer wrote only
what changed since its own previous batch or rewrote it."""

from __future__ import annotations

import redis
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from core.redis_outage import Outage
from core.redis_schema import RedisKeys
from core.settings import Settings
from evaluator.spark import waiting
from evaluator.spark.waiting import CHUNK, forget_written, write_waiting

COPY = ("checkpoint", 0, ("price", "volume"))
# per batch: which of two processes runs it, whether its copy ran the previous batch there (else it was rebuilt
# or caught up), and the ids waiting after it
batches = st.lists(st.tuples(st.integers(0, 1), st.booleans(), st.frozensets(st.integers(1, 40), max_size=12)),
                   min_size=1, max_size=12)


@hypothesis_settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=batches)
def test_redis_holds_each_batchs_waiting_set(settings: Settings, batches: list) -> None:
    client = redis.Redis.from_url(settings.redis_url)
    keys, outage = RedisKeys(settings), Outage("test", settings, client)
    name = keys.admission_waiting("trades", 0)
    client.delete(name)
    memories: list[dict] = [{}, {}]  # each process's own record of what it wrote
    last_writer = None
    for process, cached, ids in batches:
        forget_written()
        waiting._WRITTEN.update(memories[process])
        # a copy runs on from its own previous batch only where that process ran the batch before
        write_waiting(client, outage, keys, "trades", 0, COPY, ids, continued=cached and last_writer == process)
        memories[process] = dict(waiting._WRITTEN)
        last_writer = process
        assert {int(m) for m in client.smembers(name)} == set(ids)
    forget_written()


def test_a_burst_larger_than_a_command_and_its_end(settings: Settings) -> None:
    client = redis.Redis.from_url(settings.redis_url)
    keys, outage = RedisKeys(settings), Outage("test", settings, client)
    name = keys.admission_waiting("trades", 1)
    burst = frozenset(range(1, 2 * CHUNK + 7))
    forget_written()
    write_waiting(client, outage, keys, "trades", 1, COPY, burst, continued=False)
    assert client.scard(name) == len(burst)
    admitted = frozenset(range(1, CHUNK + 3))
    write_waiting(client, outage, keys, "trades", 1, COPY, burst - admitted, continued=True)
    assert {int(m) for m in client.smembers(name)} == burst - admitted
    write_waiting(client, outage, keys, "trades", 1, COPY, frozenset(), continued=True)
    assert not client.exists(name)
    forget_written()
