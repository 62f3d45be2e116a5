"""The one place Redis clients are made: a single Redis (the default) or a Redis Cluster.

``TOCSIN_REDIS_CLUSTER=true`` makes ``TOCSIN_REDIS_URL`` name any node of a cluster; the client
then finds the others and routes each command by its key's slot. Code takes the client as a
``redis.Redis``: :class:`redis.cluster.RedisCluster` offers the same commands for keys of one
slot, which is what every atomic script and transaction here touches (``core.redis_schema``
tags their keys so). The Celery broker is never the cluster (``notifier.app``): kombu's Redis
transport speaks to one Redis only, so it has its own URL (:func:`broker_client`).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, NamedTuple, cast
from urllib.parse import urlparse

import redis
import redis.asyncio
from redis.client import Pipeline
from redis.cluster import ClusterPipeline, RedisCluster
from redis.commands.core import Script
from redis.connection import parse_url
from redis.typing import EncodableT, KeyT

from core.settings import Settings


def make_redis(settings: Settings, decode_responses: bool = False, **options: Any) -> redis.Redis:
    """A client of the deployment's Redis, single or cluster as configured, whose every command and connection
    attempt gives up after ``redis_socket_timeout_s`` unless ``options`` say otherwise (see :func:`timeouts`)."""
    return connect(settings.redis_url, settings.redis_cluster, decode_responses, **timeouts(settings, options))


def timeouts(settings: Settings, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with the deployment's socket timeouts where they name none: without them a read from a node
    that vanished with its host (no reset) waits for ever, and a process that should ride out the outage
    (``core.redis_outage``) hangs instead."""
    return {"socket_timeout": settings.redis_socket_timeout_s,
            "socket_connect_timeout": settings.redis_socket_timeout_s, **options}


def connect(url: str, cluster: bool, decode_responses: bool = False, **options: Any) -> redis.Redis:
    """A client of the Redis (``cluster``: of the Redis Cluster one of whose nodes) at ``url``."""
    if cluster:
        # The same commands as redis.Redis for one slot's keys (see the module's docstring).
        return cast("redis.Redis", RedisCluster.from_url(url, decode_responses=decode_responses, **options))
    return redis.Redis.from_url(url, decode_responses=decode_responses, **options)


def make_async_redis(settings: Settings, **options: Any) -> redis.asyncio.Redis:
    """An asyncio client of the deployment's Redis, single or cluster as configured (for code on an event loop
    that must not wait on a thread for Redis). Make it on the loop that uses it: its connections belong there."""
    options = timeouts(settings, options)
    if settings.redis_cluster:
        return cast("redis.asyncio.Redis", redis.asyncio.RedisCluster.from_url(settings.redis_url, **options))
    return redis.asyncio.Redis.from_url(settings.redis_url, **options)


def is_cluster(client: redis.Redis | Pipeline) -> bool:
    return isinstance(client, RedisCluster)  # a ClusterPipeline is a RedisCluster too


@lru_cache(maxsize=8)
def _broker(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, decode_responses=True)


def broker_client(settings: Settings) -> redis.Redis:
    """A (shared, decoding) client of the Celery broker's Redis, for reading its queues."""
    return _broker(settings.broker_url)


class LimitsStorage(NamedTuple):
    """What ``limits.storage.storage_from_string`` takes for the deployment's Redis: its URI and client options."""

    uri: str
    options: dict[str, Any]


def limits_storage(settings: Settings) -> LimitsStorage:
    """The ``limits`` library's storage for the deployment's Redis, as every other client reaches it.

    A single Redis keeps its URL (``redis://``, ``rediss://`` with TLS; ``unix://`` becomes ``limits``' own
    ``redis+unix://``). A cluster's scheme (``redis+cluster://``) names nodes only, so what the URL said
    besides (TLS, and its ``ssl_*`` query options) travels as client options: a ``rediss://`` cluster is
    never reached in clear.
    """
    url = settings.redis_url
    scheme = urlparse(url).scheme
    if scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"TOCSIN_REDIS_URL: scheme {scheme!r} is not redis://, rediss:// or unix://")
    if not settings.redis_cluster:
        return LimitsStorage("redis+" + url if scheme == "unix" else url, {})
    if scheme == "unix":
        raise ValueError("TOCSIN_REDIS_URL: a Redis Cluster is reached over TCP (redis:// or rediss://), "
                         "not a unix socket")
    parsed = urlparse(url)
    auth = f"{parsed.username or ''}:{parsed.password}@" if parsed.password else ""
    options = {name: value for name, value in parse_url(url).items()
               if name not in ("host", "port", "db", "username", "password", "connection_class")}
    if scheme == "rediss":
        options["ssl"] = True
    return LimitsStorage(f"redis+cluster://{auth}{parsed.hostname}:{parsed.port or 6379}", options)


def run_script(script: Script, pipe: Pipeline, keys: list[KeyT], args: list[EncodableT]) -> None:
    """Queue a script call on a pipeline.

    A cluster pipeline cannot load a missing script at execute time (redis-py's script
    object only does that for single-Redis pipelines), so there the source travels with
    the call: EVAL, routed by the first key's slot.
    """
    if isinstance(pipe, ClusterPipeline):
        pipe.execute_command("EVAL", script.script, len(keys), *keys, *args)
    else:
        script(keys=keys, args=args, client=pipe)
