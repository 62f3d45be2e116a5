"""Which subscriptions a shard has not admitted yet, in Redis, so a subscriber's page can say so.

A subscription waiting for admission (``evaluator.admission``) fires nothing; without this its page would read
"no key is in the condition" while nothing has been evaluated yet: the silence a subscriber must be able to tell
apart. Each shard keeps the set of ids it has not admitted (``RedisKeys.admission_waiting``) after every batch.

A copy that ran the shard's previous batch in this process writes what changed; any other (rebuilt, caught up
from another process's batches, or new here) rewrites the whole set in one transaction. Empty in the steady
state, so a batch writes nothing then.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from core.redis_outage import Outage
from core.redis_schema import RedisKeys

#: Ids per SADD/SREM command (a burst of 100,000 new subscriptions is one set).
CHUNK = 10_000
#: What this process last wrote, per (checkpoint, shard id, attributes) as ``shard_runner`` keys its copies, least
#: recently written first; as many as the copies it keeps.
_WRITTEN: dict[tuple, frozenset[int]] = {}
_KEPT = 16


def _chunks(ids: Iterable[int]) -> Iterable[list[int]]:
    batch: list[int] = []
    for sid in sorted(ids):
        batch.append(sid)
        if len(batch) == CHUNK:
            yield batch
            batch = []
    if batch:
        yield batch


def write_waiting(redis: Any, outage: Outage, keys: RedisKeys, stream: str, shard: int, copy_key: tuple,
                  waiting: frozenset[int], continued: bool) -> None:
    """Record ``waiting`` as the shard's set. ``continued``: this process's copy ran the shard's previous batch
    (what it wrote then is what Redis holds), so only the difference is written."""
    name = keys.admission_waiting(stream, shard)
    written = _WRITTEN.pop(copy_key, None)
    before = written if continued else None
    pipe = redis.pipeline(transaction=True)
    if before is None:
        pipe.delete(name)
        added, removed = waiting, frozenset[int]()
    else:
        added, removed = waiting - before, before - waiting
    for chunk in _chunks(removed):
        pipe.srem(name, *chunk)
    for chunk in _chunks(added):
        pipe.sadd(name, *chunk)
    if len(pipe):
        outage.execute(pipe)
    _WRITTEN[copy_key] = waiting
    while len(_WRITTEN) > _KEPT:
        del _WRITTEN[next(iter(_WRITTEN))]


def forget_written() -> None:
    """Drop what this process remembers writing (tests: another process wrote since)."""
    _WRITTEN.clear()
