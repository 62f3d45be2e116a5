"""Whether a subscription is evaluated yet: its stream's shards have read it from the catalog, and admitted it.

A shard evaluates a subscription from the first batch that reads it from the catalog, and, after a burst of new
subscriptions, only once it admits it (``evaluator.admission``): until then "no key is in the condition" would
be untrue. Its page and the API say it is not evaluated yet, why, and on how many of the shards of its stream's
query (each reads the catalog and admits for its own keys).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from core.redis_schema import CATALOG_READ_VERSION, RedisKeys, admission_waiting_by_shard, per_shard


@dataclass(frozen=True)
class AdmissionStatus:
    """Of the shards of the stream's query that reported (``shards``): how many evaluated a catalog older than the
    subscription's last change (``unread_shards``), and how many have not admitted it yet."""

    waiting_shards: int
    shards: int
    unread_shards: int = 0

    @property
    def waiting(self) -> bool:
        """Not evaluated on some shard yet (or no shard of the stream's query has run a batch)."""
        return self.waiting_shards > 0 or self.unread_shards > 0 or self.shards == 0

    @property
    def nowhere(self) -> bool:
        """Not evaluated on any shard yet, as far as the counts tell."""
        return max(self.waiting_shards, self.unread_shards) >= self.shards

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "waiting": self.waiting}


def admission_status(client: Any, keys: RedisKeys, stream: str, subscription_id: int,
                     changed_at: int | None = None) -> AdmissionStatus:
    """Read from the shards' fields in ``stats:evaluator``; only a shard that has some waiting is asked about this
    subscription (its set, ``RedisKeys.admission_waiting``): in the steady state one read answers. ``changed_at``:
    the catalog version of the subscription's last change (``Subscription.catalog_version``; None: not judged),
    against the version each shard's last batch evaluated: versions, so no two hosts' clocks are compared."""
    fields = client.hgetall(keys.evaluator_stats)
    counts = admission_waiting_by_shard(fields).get(stream, {})
    unread = 0
    if changed_at is not None:
        unread = sum(int(read) < changed_at for read in per_shard(fields, CATALOG_READ_VERSION).get(stream, {}).values())
    busy = [shard for shard, waiting in sorted(counts.items()) if waiting]
    if not busy:
        return AdmissionStatus(0, len(counts), unread)
    pipe = client.pipeline(transaction=False)
    for shard in busy:
        pipe.sismember(keys.admission_waiting(stream, shard), subscription_id)
    return AdmissionStatus(sum(bool(member) for member in pipe.execute()), len(counts), unread)
