"""Loading the subscription catalog from Redis inside Spark's Python workers.

The version number is checked at most every ``refresh_s`` and the snapshot is
re-read only when it changed, so edits take effect within one trigger without
restarting the query and without a Redis round trip per key.
"""

from __future__ import annotations

import json
import time

import redis

from evaluator.catalog import Catalog
from infra.redis_schema import RedisKeys
from infra.settings import Settings


class CatalogSource:
    def __init__(self, settings: Settings, refresh_s: float = 0.2) -> None:
        self.keys = RedisKeys(settings)
        self.refresh_s = refresh_s
        self.redis = redis.Redis.from_url(settings.redis_url)
        self._catalog = Catalog.empty()
        self._checked = 0.0

    def current(self) -> Catalog:
        now = time.monotonic()
        if now - self._checked >= self.refresh_s:
            self._checked = now
            version = int(self.redis.get(self.keys.catalog_version) or 0)
            if version != self._catalog.version:
                raw = self.redis.get(self.keys.catalog_snapshot)
                if raw is not None:
                    self._catalog = Catalog.from_dict(json.loads(raw))
        return self._catalog
