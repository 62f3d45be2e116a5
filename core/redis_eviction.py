"""Redis must never evict what carries alerts: an eviction policy that could drop them is refused at start-up.

A Redis with ``maxmemory`` set evicts keys by its ``maxmemory-policy`` once it is full. Under an
``allkeys-*`` policy any key may go: an alert-stream entry not yet dispatched, a firing set, a
delivery's order line, the catalog's change log. Alerts would then be lost without a trace, the
worst failure an alerting platform has, so the sink and the dispatcher refuse to start on such a
node. Under a ``volatile-*`` policy only keys with a TTL go: the sink's seen sets, the
dispatcher's decisions, delivery marks. Nothing is lost, but a replayed batch or a redelivered task
may then be sent twice: a warning. ``noeviction`` (Redis's default) refuses writes when full instead,
which the processes ride out as an outage (``core.redis_outage``) until memory is freed, holding their
work. With ``maxmemory`` 0 (no limit, the default) nothing is ever evicted, whatever the policy.

Every primary of a cluster is checked. A managed Redis that refuses ``CONFIG GET`` cannot be checked:
that is logged once, and docs/redis.md says what to set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis
import structlog

from core.redis_client import is_cluster

log = structlog.get_logger(__name__)

SAFE_POLICY = "noeviction"


class EvictionRefused(RuntimeError):
    """A Redis node could evict keys that carry alerts."""


@dataclass(frozen=True)
class NodeMemory:
    node: str
    policy: str
    maxmemory: int

    @property
    def loses_alerts(self) -> bool:
        """Full, it may evict any key (``allkeys-*``)."""
        return self.maxmemory > 0 and self.policy.startswith("allkeys")

    @property
    def may_repeat_alerts(self) -> bool:
        """Full, it may evict keys with a TTL (``volatile-*``): seen sets and decisions, not alerts."""
        return self.maxmemory > 0 and self.policy.startswith("volatile")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def node_memory(client: redis.Redis) -> list[NodeMemory]:
    """``maxmemory`` and ``maxmemory-policy`` of the node, or of every primary of a cluster."""
    def read(config: dict, node: str) -> NodeMemory:
        values = {_text(k): _text(v) for k, v in config.items()}
        return NodeMemory(node, values["maxmemory-policy"], int(values["maxmemory"]))

    if is_cluster(client):
        cluster: Any = client
        return [read(cluster.config_get("maxmemory*", target_nodes=node), node.name)
                for node in cluster.get_primaries()]
    kwargs = client.connection_pool.connection_kwargs
    return [read(client.config_get("maxmemory*"), f"{kwargs.get('host')}:{kwargs.get('port')}")]


def check_eviction(client: redis.Redis, component: str) -> list[NodeMemory]:
    """Refuse (:class:`EvictionRefused`) a node that may evict alerts, warn of one that may repeat them; returns
    what was read (empty if Redis would not say)."""
    try:
        nodes = node_memory(client)
    except redis.ResponseError as exc:  # CONFIG renamed or denied (managed Redis, ACLs)
        log.info("redis_eviction_unchecked", component=component, error=str(exc),
                 advice=f"set maxmemory-policy to {SAFE_POLICY} (docs/redis.md#memory-and-eviction)")
        return []
    losing = [n for n in nodes if n.loses_alerts]
    if losing:
        names = ", ".join(f"{n.node} ({n.policy}, maxmemory {n.maxmemory})" for n in losing)
        raise EvictionRefused(
            f"Redis may evict any key when full on {names}: undispatched alerts, firing sets and the catalog log "
            f"would be dropped without a trace. Set maxmemory-policy to {SAFE_POLICY} (or a volatile-* policy), "
            f"or maxmemory to 0 (docs/redis.md#memory-and-eviction)")
    for n in nodes:
        if n.may_repeat_alerts:
            log.warning("redis_may_evict_dedupe_marks", component=component, node=n.node, policy=n.policy,
                        maxmemory=n.maxmemory, advice=f"{SAFE_POLICY}: when full, a replayed batch or a redelivered "
                        "task could be sent twice (docs/redis.md#memory-and-eviction)")
    return nodes
