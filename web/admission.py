"""Whether a subscription still waits for its first evaluation (``evaluator.admission``).

A burst of new subscriptions is admitted a share per micro-batch; until a shard admits one it evaluates nothing
for it, so "no key is in the condition" would be untrue. Its page and the API say it waits, and on how many of
the shards of its stream's query (each admits for its own keys).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from core.redis_schema import RedisKeys, admission_waiting_by_shard


@dataclass(frozen=True)
class AdmissionStatus:
    """Of the shards of the stream's query that reported (``shards``), how many have not admitted it yet."""

    waiting_shards: int
    shards: int

    @property
    def waiting(self) -> bool:
        return self.waiting_shards > 0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "waiting": self.waiting}


def admission_status(client: Any, keys: RedisKeys, stream: str, subscription_id: int) -> AdmissionStatus:
    """Read from the shards' counts in ``stats:evaluator``; only a shard that has some waiting is asked about this
    subscription (its set, ``RedisKeys.admission_waiting``): in the steady state one read answers."""
    shards = admission_waiting_by_shard(client.hgetall(keys.evaluator_stats)).get(stream, {})
    busy = [shard for shard, waiting in sorted(shards.items()) if waiting]
    if not busy:
        return AdmissionStatus(0, len(shards))
    pipe = client.pipeline(transaction=False)
    for shard in busy:
        pipe.sismember(keys.admission_waiting(stream, shard), subscription_id)
    return AdmissionStatus(sum(bool(member) for member in pipe.execute()), len(shards))
