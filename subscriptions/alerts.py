"""Reading a subscription's alerts from Redis: the keys firing now, and its history.

The evaluator's sink writes both atomically with each transition (see
``evaluator.spark.sink``): ``firing:<id>`` holds the latest firing transition per
key, ``history:<id>`` a stream of the newest ``HISTORY_LENGTH`` transitions, each a
:class:`evaluator.transition.Transition`; the views hand them on as its fields.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import redis

from core.redis_schema import RedisKeys
from evaluator.transition import Transition

_SCAN_CHUNK = 500
_STREAM_PART_MAX = 2**64 - 1
CURSOR_PATTERN = r"^[0-9]{1,20}-[0-9]{1,20}$"


def valid_cursor(text: str) -> bool:
    """A history cursor is a Redis stream id: two unsigned 64-bit numbers (Redis refuses anything else)."""
    if not re.fullmatch(CURSOR_PATTERN, text):
        return False
    return all(int(part) <= _STREAM_PART_MAX for part in text.split("-"))


@dataclass(frozen=True)
class HistoryFilter:
    state: str | None = None  # firing | resolved
    key: str | None = None
    since_ms: int | None = None  # evaluated_at >= since
    until_ms: int | None = None  # evaluated_at < until

    def admits(self, alert: Transition) -> bool:
        return ((self.state is None or alert.state == self.state)
                and (self.key is None or alert.key == self.key)
                and (self.since_ms is None or alert.evaluated_at >= self.since_ms)
                and (self.until_ms is None or alert.evaluated_at < self.until_ms))


class AlertViews:
    def __init__(self, client: redis.Redis, keys: RedisKeys) -> None:
        self.redis = client  # decode_responses=True
        self.keys = keys

    def firing(self, subscription_id: int) -> dict[str, dict[str, Any]]:
        raw: dict[str, str] = self.redis.hgetall(self.keys.firing(subscription_id))  # type: ignore[assignment]  # decoded
        return {key: Transition.from_json(payload).to_dict() for key, payload in sorted(raw.items())}

    def history(self, subscription_id: int, where: HistoryFilter, limit: int = 100,
                before: str | None = None) -> tuple[list[dict[str, Any]], str | None]:
        """Newest first, matching ``where``; returns the page and the cursor of the next (None at the end)."""
        stream = self.keys.history(subscription_id)
        found: list[dict[str, Any]] = []
        upper = f"({before}" if before else "+"
        while True:
            entries: list[tuple[str, dict[str, str]]] = self.redis.xrevrange(  # type: ignore[assignment]  # decoded
                stream, max=upper, min="-", count=_SCAN_CHUNK)
            for entry_id, fields in entries:
                alert = Transition.from_json(fields["alert"])
                if where.admits(alert):
                    found.append({**alert.to_dict(), "cursor": entry_id})
                    if len(found) == limit:
                        return found, entry_id
                if where.since_ms is not None and alert.evaluated_at < where.since_ms - 3_600_000:
                    return found, None  # entries are in write order, close to evaluation order: far enough
            if len(entries) < _SCAN_CHUNK:
                return found, None
            upper = f"({entries[-1][0]}"
