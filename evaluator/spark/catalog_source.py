"""Reading what the web app asks of the evaluator, inside Spark's Python workers.

The subscription catalog: the version number is checked at most every
``refresh_s`` and the snapshot is re-read only when it changed, so edits take
effect within one trigger without restarting the query and without a Redis
round trip per key. Condition previews: one-off questions every shard answers
once (see ``web.conditions``).
"""

from __future__ import annotations

import time

import redis
import structlog

from core.redis_schema import RedisKeys
from core.settings import Settings
from evaluator.catalog import Catalog
from evaluator.preview import PreviewRequest

log = structlog.get_logger("evaluator")


class CatalogSource:
    def __init__(self, settings: Settings, refresh_s: float = 0.2) -> None:
        self.keys = RedisKeys(settings)
        self.refresh_s = refresh_s
        self.preview_max_age_s = settings.preview_timeout_s
        self.redis = redis.Redis.from_url(settings.redis_url)
        self._catalog = Catalog.empty()
        self._checked = 0.0
        self._answered: dict[tuple[int, str], float] = {}  # (shard, request) -> when, in this worker

    def previews(self, shard: int) -> list[tuple[str, PreviewRequest]]:
        """Preview requests still waited for that ``shard`` has not answered in this worker, by request id."""
        now = time.time()
        raw: dict[bytes, bytes] = self.redis.hgetall(self.keys.previews)  # type: ignore[assignment]  # bytes: no decode_responses
        self._answered = {k: at for k, at in self._answered.items() if now - at < 2 * self.preview_max_age_s}
        pending = []
        for raw_id, payload in raw.items():
            request_id = raw_id.decode(errors="replace")
            try:
                request = PreviewRequest.from_json(payload)
            except (ValueError, KeyError, TypeError) as exc:  # a request no shard can read must not fail the batch
                self.redis.hdel(self.keys.previews, raw_id)
                log.warning("malformed_preview_request_dropped", request_id=request_id,
                            reason=f"{type(exc).__name__}: {exc}")
                continue
            if now - request.at > self.preview_max_age_s or (shard, request_id) in self._answered:
                continue
            self._answered[(shard, request_id)] = now
            pending.append((request_id, request))
        return pending

    def current(self) -> Catalog:
        now = time.monotonic()
        if now - self._checked >= self.refresh_s:
            self._checked = now
            version = int(self.redis.get(self.keys.catalog_version) or 0)
            if version != self._catalog.version:
                raw: bytes | None = self.redis.get(self.keys.catalog_snapshot)  # type: ignore[assignment]  # bytes: no decode_responses
                if raw is not None:
                    self._catalog = Catalog.decode(raw)
        return self._catalog


_SHARED: dict[tuple[str, str], CatalogSource] = {}


def shared_catalog_source(settings: Settings) -> CatalogSource:
    """One catalog reader (and Redis client) per worker process and deployment."""
    key = (settings.redis_url, settings.redis_prefix)
    if key not in _SHARED:
        _SHARED[key] = CatalogSource(settings)
    return _SHARED[key]
