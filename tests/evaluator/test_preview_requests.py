"""A preview request no shard can read is dropped, not raised into the shard's batch (real Redis)."""

from __future__ import annotations

import time

import redis

from core.redis_schema import RedisKeys
from core.settings import Settings
from evaluator.preview import PreviewRequest
from evaluator.spark.catalog_source import CatalogSource
from subscriptions.language import parse_condition


def test_malformed_preview_requests_are_dropped_and_good_ones_answered(settings: Settings,
                                                                      redis_client: redis.Redis) -> None:
    keys = RedisKeys(settings)
    good = PreviewRequest(parse_condition("SUM(volume) OVER 1m > 100"), None, time.time())
    redis_client.hset(keys.previews, mapping={"good": good.to_json(), "junk": "{not json", "list": "[1]",
                                              "empty": "{}", "bytes": b"\xff\xfe"})
    pending = CatalogSource(settings).previews(shard=0)
    assert [request_id for request_id, _ in pending] == ["good"]
    assert pending[0][1] == good
    assert redis_client.hkeys(keys.previews) == ["good"]  # the unreadable ones are gone for every shard
