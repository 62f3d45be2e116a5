"""A preview request no shard can read is dropped, not raised into the shard's batch (real Redis)."""

from __future__ import annotations

import dataclasses
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


def test_a_preview_is_answered_by_the_query_of_the_stream_its_condition_names(settings: Settings,
                                                                             redis_client: redis.Redis) -> None:
    keys = RedisKeys(settings)
    trades = PreviewRequest(parse_condition("SUM(volume) OVER 1m > 100"), None, time.time())
    hosts = PreviewRequest(dataclasses.replace(parse_condition("SUM(volume) OVER 1m > 100"), stream="hosts"), None,
                           time.time())
    redis_client.hset(keys.previews, mapping={"t": trades.to_json(), "h": hosts.to_json()})
    source = CatalogSource(settings)
    assert [r for r, _ in source.previews(shard=0)] == ["t"]
    assert [r for r, _ in source.previews(shard=0, stream="hosts")] == ["h"]  # same shard id, another query
    assert source.previews(shard=0, stream="hosts") == [] and source.previews(shard=1, stream="other") == []
