"""Reading what the web app asks of the evaluator, inside Spark's Python workers.

The subscription catalog: the version number is checked at most every
``refresh_s`` and the snapshot is re-read only when it changed, so edits take
effect within one trigger without restarting the query and without a Redis
round trip per key. Condition previews: one-off questions every shard answers
once (see ``web.conditions``).
"""

from __future__ import annotations

import json
import time

import redis

from evaluator.catalog import Catalog
from evaluator.spec import Condition
from core.redis_schema import RedisKeys
from core.settings import Settings


class CatalogSource:
    def __init__(self, settings: Settings, refresh_s: float = 0.2) -> None:
        self.keys = RedisKeys(settings)
        self.refresh_s = refresh_s
        self.preview_max_age_s = settings.preview_timeout_s
        self.redis = redis.Redis.from_url(settings.redis_url)
        self._catalog = Catalog.empty()
        self._checked = 0.0
        self._answered: dict[tuple[int, str], float] = {}  # (shard, request) -> when, in this worker

    def previews(self, shard: int) -> list[tuple[str, Condition, frozenset[str] | None]]:
        """Preview requests still waited for that ``shard`` has not answered in this worker."""
        now = time.time()
        raw = self.redis.hgetall(self.keys.previews)
        self._answered = {k: at for k, at in self._answered.items() if now - at < 2 * self.preview_max_age_s}
        pending = []
        for request_id, payload in raw.items():
            request_id = request_id.decode()
            data = json.loads(payload)
            if now - data["at"] > self.preview_max_age_s or (shard, request_id) in self._answered:
                continue
            self._answered[(shard, request_id)] = now
            keys = frozenset(data["keys"]) if data["keys"] is not None else None
            pending.append((request_id, Condition.from_dict(data["condition"]), keys))
        return pending

    def current(self) -> Catalog:
        now = time.monotonic()
        if now - self._checked >= self.refresh_s:
            self._checked = now
            version = int(self.redis.get(self.keys.catalog_version) or 0)
            if version != self._catalog.version:
                raw = self.redis.get(self.keys.catalog_snapshot)
                if raw is not None:
                    self._catalog = Catalog.decode(raw)
        return self._catalog
