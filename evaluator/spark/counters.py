"""The evaluator's running totals in ``stats:evaluator``, added by the parser, the shards and the sink."""

from __future__ import annotations

from collections.abc import Mapping

import redis

from core.redis_schema import RedisKeys


def add_totals(pipe: redis.client.Pipeline, keys: RedisKeys, counts: dict[str, int]) -> None:
    """Add each non-zero count to its total in ``stats:evaluator``."""
    for name, n in counts.items():
        if n:
            pipe.hincrby(keys.evaluator_stats, name, n)


#: ``stats:evaluator`` fields ``admission_waiting:<stream>:<shard>``: new subscriptions each shard has not admitted
#: yet after its last batch (``evaluator.admission``).
ADMISSION_WAITING = "admission_waiting"


def admission_waiting_field(stream: str, shard: int) -> str:
    return f"{ADMISSION_WAITING}:{stream}:{shard}"


def admission_waiting(fields: Mapping[bytes | str, bytes | str]) -> dict[str, int]:
    """Per stream, the subscriptions its shards have not admitted yet (summed: each shard admits for its keys)."""
    waiting: dict[str, int] = {}
    for name, value in fields.items():
        kind, _, rest = (name.decode() if isinstance(name, bytes) else name).partition(":")
        if kind == ADMISSION_WAITING:
            stream = rest.rpartition(":")[0]
            waiting[stream] = waiting.get(stream, 0) + int(value)
    return waiting
