"""The evaluator's sink on a Redis Cluster: each partition's script on its own slot, a replay adds nothing."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from core.redis_eviction import EvictionRefused, check_eviction
from core.redis_schema import RedisKeys, shard_clocks
from core.settings import Settings
from evaluator.rank import Rank, RankEntry
from evaluator.spark.sink import TRANSITION_COLUMNS, RedisAlertSink, clock_record
from tests.evaluator.spark.test_sink import Batch, transition
from tests.rediscluster.conftest import PARTITIONS

SUBSCRIPTIONS = range(1, 13)  # three per partition


def _stream(client: redis.Redis, key: str) -> list[dict]:
    return [json.loads(fields["alert"]) for _, fields in client.xrange(key)]


def test_each_partition_is_one_slot_and_the_partitions_spread_over_the_nodes(cluster_settings: Settings,
                                                                             cluster_client: redis.Redis) -> None:
    keys = RedisKeys(cluster_settings)
    cluster: RedisCluster = cluster_client  # type: ignore[assignment]
    for sid in SUBSCRIPTIONS:
        p = keys.partition(sid)
        together = [keys.alerts_stream_of(p), keys.alerts_dead_of(p), keys.alert_mark(sid, "a"), keys.firing(sid),
                    keys.history(sid), keys.counters(sid), keys.key_states(sid), keys.decision(sid, "a"),
                    keys.delivery_log(sid), keys.mark_prefix(p) + "a", keys.firing_prefix(p) + str(sid),
                    keys.seen(sid, 1), keys.seen_prefix(p) + "2"]
        assert {cluster.keyslot(k) for k in together} == {cluster.keyslot(keys.alerts_stream_of(p))}
    nodes = {cluster.get_node_from_key(stream).name for stream in keys.alerts_streams}
    assert len(nodes) > 1, "every partition on one node: the test would not span the cluster"
    catalog = [keys.catalog_version, keys.catalog_changes, keys.catalog_snapshot, keys.catalog_snapshot_version]
    assert len({cluster.keyslot(k) for k in catalog}) == 1


def test_the_sink_writes_every_partition_and_a_replay_adds_nothing(cluster_settings: Settings,
                                                                   cluster_client: redis.Redis) -> None:
    keys = RedisKeys(cluster_settings)
    sink = RedisAlertSink(cluster_settings)
    sink.CHUNK = 2  # several script calls per partition: the firing hash still takes each key's last state
    batch = [transition(sid, key, "firing", 60_000) for sid in SUBSCRIPTIONS for key in ("A", "B")]
    batch += [transition(sid, "A", "resolved", 61_000) for sid in SUBSCRIPTIONS]
    sink(Batch([*batch, clock_record(0, 61_000), clock_record(1, 60_000)]), 0)  # type: ignore[arg-type]

    for p in range(PARTITIONS):
        own = [t for t in batch if keys.partition(t["subscription_id"]) == p]
        assert own and _stream(cluster_client, keys.alerts_stream_of(p)) == own  # in batch order
    for sid in SUBSCRIPTIONS:
        assert _stream(cluster_client, keys.history(sid)) == [t for t in batch if t["subscription_id"] == sid]
        firing = {k: json.loads(v)["alert_id"] for k, v in cluster_client.hgetall(keys.firing(sid)).items()}
        assert firing == {"B": transition(sid, "B", "firing", 60_000)["alert_id"]}
        assert cluster_client.hgetall(keys.counters(sid)) == {"firing": "2", "resolved": "1"}
    stats = cluster_client.hgetall(keys.evaluator_stats)
    assert sorted(shard_clocks(stats)) == [60_000, 61_000] and stats["transitions"] == str(len(batch))

    # The batch again after a crash before Spark's commit, with one transition more: only that one is new.
    late = transition(5, "C", "firing", 62_000)
    sink(Batch([*batch, late, clock_record(0, 62_000)]), 0)  # type: ignore[arg-type]
    assert sink.write(batch) == 0
    p = keys.partition(5)
    assert _stream(cluster_client, keys.alerts_stream_of(p))[-1] == late
    assert sum(cluster_client.xlen(stream) for stream in keys.alerts_streams) == len(batch) + 1
    assert cluster_client.hgetall(keys.counters(5)) == {"firing": "3", "resolved": "1"}


def test_every_primary_is_checked_for_a_policy_that_could_evict_alerts(cluster_settings: Settings,
                                                                       cluster_client: redis.Redis) -> None:
    """One primary that may evict any key loses the alerts of the partitions it holds: the sink refuses the cluster,
    naming that node."""
    cluster: Any = cluster_client
    primaries = cluster.get_primaries()
    assert len(check_eviction(cluster_client, "test")) == len(primaries) >= 3
    one = primaries[1]
    cluster.config_set("maxmemory", "1gb", target_nodes=one)
    cluster.config_set("maxmemory-policy", "allkeys-lfu", target_nodes=one)
    try:
        with pytest.raises(EvictionRefused, match=f"{one.name} \\(allkeys-lfu"):
            RedisAlertSink(cluster_settings)
    finally:
        cluster.config_set("maxmemory", "0", target_nodes=one)
        cluster.config_set("maxmemory-policy", "noeviction", target_nodes=one)


def test_rank_merges_keep_each_state_in_its_subscriptions_slot(cluster_settings: Settings,
                                                              cluster_client: redis.Redis) -> None:
    """Every subscription's rank state beside its alerts (one slot), the merged transitions in its partition's
    stream, and the batch again adding nothing."""
    keys = RedisKeys(cluster_settings)
    cluster: RedisCluster = cluster_client  # type: ignore[assignment]
    sink = RedisAlertSink(cluster_settings, shard_ids=(0, 1))
    entries = [RankEntry(shard, sid, 60_000, 0, key, value, True, Rank(1))
               for sid in SUBSCRIPTIONS for shard, key, value in ((0, "A", 5.0), (1, "B", 9.0))]
    rows = [dict(zip(TRANSITION_COLUMNS, e.to_row(), strict=True)) for e in entries]
    batch = Batch([*rows, clock_record(0, 60_000), clock_record(1, 60_000)])
    sink(batch, 0)  # type: ignore[arg-type]
    for sid in SUBSCRIPTIONS:
        assert cluster.keyslot(keys.rank_state(sid)) == cluster.keyslot(keys.alerts_stream_of(keys.partition(sid)))
        assert [(t["key"], t["state"]) for t in _stream(cluster_client, keys.history(sid))] == [("B", "firing")]
    sink(batch, 0)  # type: ignore[arg-type]
    assert sum(cluster_client.xlen(stream) for stream in keys.alerts_streams) == len(SUBSCRIPTIONS)


def test_a_burst_handed_over_is_stored_on_the_cluster_in_order(cluster_settings: Settings,
                                                              cluster_client: redis.Redis) -> None:
    """The handoff's list and pieces share a slot (written in one transaction, popped by one script), and what it
    stores after the batch lands in every partition as the batch would have stored it."""
    keys = RedisKeys(cluster_settings)
    cluster: RedisCluster = cluster_client  # type: ignore[assignment]
    assert cluster.keyslot(keys.handoff("trades")) == cluster.keyslot(keys.handoff_piece("trades", "x"))
    sink = RedisAlertSink(cluster_settings.model_copy(update={"sink_batch_transitions": 3}))
    sink.handoff.PIECE = 5  # several pieces
    batch = [transition(sid, key, "firing", 60_000) for sid in SUBSCRIPTIONS for key in ("A", "B")]
    later = [transition(sid, "A", "resolved", 61_000) for sid in SUBSCRIPTIONS]
    sink(Batch([*batch, clock_record(0, 60_000), clock_record(1, 60_000)]), 0)  # type: ignore[arg-type]
    sink(Batch([*later, clock_record(0, 61_000), clock_record(1, 61_000)]), 1)  # type: ignore[arg-type]
    assert sink.handoff.drained(60)
    for sid in SUBSCRIPTIONS:
        assert _stream(cluster_client, keys.history(sid)) == [t for t in batch + later if t["subscription_id"] == sid]
        assert set(cluster_client.hgetall(keys.firing(sid))) == {"B"}
    assert shard_clocks(cluster_client.hgetall(keys.evaluator_stats)) == [61_000, 61_000]
    assert not cluster_client.exists(keys.handoff("trades"))
    sink.handoff.stop()
