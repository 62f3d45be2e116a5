"""A local 3-master Redis Cluster for the test session, and settings that put Tocsin on it.

The Celery broker stays on the single test Redis: kombu's Redis transport does not speak Redis
Cluster (docs/redis.md). Four slot partitions, so a test's subscriptions land on several nodes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from core.redis_client import make_redis
from core.settings import Settings
from tests.servers import redis_cluster

PARTITIONS = 4


@pytest.fixture(scope="session")
def cluster_url(workdir: Path) -> Iterator[str]:
    with redis_cluster(workdir / "redis-cluster") as url:
        yield url


@pytest.fixture
def cluster_settings(settings: Settings, cluster_url: str, redis_url: str) -> Settings:
    return settings.model_copy(update={"redis_url": cluster_url, "redis_cluster": True,
                                       "celery_broker_url": redis_url, "redis_partitions": PARTITIONS})


@pytest.fixture
def cluster_client(cluster_settings: Settings) -> Iterator[redis.Redis]:
    client = make_redis(cluster_settings, decode_responses=True)
    yield client
    client.close()
