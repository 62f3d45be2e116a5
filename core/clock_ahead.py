"""Producer clocks ahead: marks naming where records came dated beyond the processing clock.

A record dated ahead of the processing clock by more than ``clock_tolerance_ms`` is kept, but it
does not move its stream's clock (``evaluator.clock``): a producer whose clock runs fast delays
its own events' windows. Operators must hear of it, and know whose clock to fix. So the evaluator
(which sees Kafka partitions) and the web app (which sees publisher tokens) leave a mark per
source in one Redis hash: field ``<stream>:<source>``, a JSON mark saying when it was last seen and
how far ahead. The dead man's switch (``web.watchdog``, rule ``clock``) fires while a mark is
younger than its window and names each source.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from core.redis_replies import text_hash
from core.redis_schema import RedisKeys


@dataclass(frozen=True)
class ClockAhead:
    """Records of ``stream`` from ``source`` (``partition 3``, ``publisher token 'x' (#5)``) were dated up to
    ``ahead_ms`` ahead of the processing clock, last seen at ``at`` (Unix seconds)."""

    stream: str
    source: str
    ahead_ms: int
    at: float

    @property
    def field(self) -> str:
        return f"{self.stream}:{self.source}"

    def describe(self) -> str:
        return f"stream {self.stream}, {self.source}: records {self.ahead_ms / 1000:.1f} s ahead of the clock"


def partition_source(partition: int) -> str:
    return f"partition {partition}"


def token_source(token_id: int, token_name: str) -> str:
    return f"publisher token {token_name!r} (#{token_id})"


def mark(pipe: Any, keys: RedisKeys, marks: Iterable[ClockAhead]) -> None:
    """Record ``marks`` on ``pipe`` (a Redis pipeline or client): the newest of each source replaces the last."""
    mapping = {m.field: json.dumps(asdict(m)) for m in marks}
    if mapping:
        pipe.hset(keys.clock_ahead, mapping=mapping)


def recent(client: Any, keys: RedisKeys, window_s: float, now: float | None = None) -> list[ClockAhead]:
    """The marks seen within the last ``window_s`` seconds, oldest first; older ones are deleted (they say
    nothing the rules read, and a source that stopped would otherwise stay listed)."""
    now = time.time() if now is None else now
    fresh: list[ClockAhead] = []
    stale: list[str] = []
    for name, raw in text_hash(client.hgetall(keys.clock_ahead)).items():
        try:
            found = ClockAhead(**json.loads(raw))
        except (TypeError, ValueError):  # not a mark this code wrote: gone with the stale ones
            stale.append(name)
            continue
        if now - found.at <= window_s:
            fresh.append(found)
        else:
            stale.append(name)
    if stale:
        client.hdel(keys.clock_ahead, *stale)
    return sorted(fresh, key=lambda m: m.at)
