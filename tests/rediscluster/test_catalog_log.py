"""The catalog's change log on a Redis Cluster: its scripts' four keys share one slot."""

from __future__ import annotations

import pytest
from redis.exceptions import RedisClusterException

from core.catalog_log import Appended, CatalogLog
from core.redis_client import make_redis
from core.redis_schema import RedisKeys
from core.settings import Settings


def test_append_snapshot_and_read_on_the_cluster(cluster_settings: Settings) -> None:
    client = make_redis(cluster_settings)  # payloads are bytes, as the evaluator reads them
    log = CatalogLog(client, RedisKeys(cluster_settings), keep=1)
    assert log.publish_snapshot(1, b"catalog-1")
    assert log.append(2, b"change-2") == (Appended.APPENDED, 1)
    assert log.append(4, b"change-4") == (Appended.GAP, 1)
    assert log.append(3, b"change-3") == (Appended.APPENDED, 1)
    assert log.append(3, b"again") == (Appended.STALE, 1)
    read = log.read(after=1)
    assert (read.version, read.entries) == (3, [(2, b"change-2"), (3, b"change-3")])
    whole = log.read_with_snapshot()
    assert (whole.version, whole.snapshot_version, whole.snapshot) == (3, 1, b"catalog-1")
    assert whole.entries == [(2, b"change-2"), (3, b"change-3")]
    assert log.version() == 3


def test_a_cross_slot_script_is_refused_by_the_cluster(cluster_settings: Settings) -> None:
    """Why the keys are tagged: the same script over untagged keys in other slots does not run on a cluster."""
    client = make_redis(cluster_settings)
    keys = RedisKeys(cluster_settings.model_copy(update={"redis_cluster": False, "redis_partitions": 1}))
    log = CatalogLog(client, keys)
    with pytest.raises(RedisClusterException, match="same key slot"):
        log.publish_snapshot(1, b"catalog-1")
