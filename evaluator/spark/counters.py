"""The evaluator's running totals in ``stats:evaluator``, added by the parser, the shards and the sink."""

from __future__ import annotations

import redis

from core.redis_schema import RedisKeys


def add_totals(pipe: redis.client.Pipeline, keys: RedisKeys, counts: dict[str, int]) -> None:
    """Add each non-zero count to its total in ``stats:evaluator``."""
    for name, n in counts.items():
        if n:
            pipe.hincrby(keys.evaluator_stats, name, n)
