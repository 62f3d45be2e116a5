"""A preview request no shard can read is dropped, and one that fails fails alone: neither is raised into the
shard's batch (real Redis)."""

from __future__ import annotations

import dataclasses
import time

import pytest
import redis

from core.redis_schema import RedisKeys
from core.settings import Settings
from core.stream_names import TRADES
from evaluator.catalog import Catalog
from evaluator.preview import PreviewAnswer, PreviewRequest
from evaluator.shard import ShardConfig
from evaluator.spark.catalog_source import CatalogSource
from evaluator.spark.shard_runner import ShardJob, ShardRunner, forget_copies
from evaluator.spec import Aggregate, Condition, SubscriptionSpec
from evaluator.streams import StreamShape
from evaluator.substreams import SubstreamShard
from ingest.model import ATTRIBUTES
from subscriptions.language import parse_condition
from subscriptions.service import publish_catalog
from tests.evaluator.shard_state import State
from tests.evaluator.test_shard import pane_rows


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
    assert [r for r, _ in source.previews(shard=0, stream="hosts")] == ["h"], "listed until its answer is stored"
    source.answered(0, "h", "hosts")
    assert source.previews(shard=0, stream="hosts") == [] and source.previews(shard=1, stream="other") == []
    assert [r for r, _ in source.previews(shard=0)] == ["t"]  # answered per (stream, shard, request)


def _ask(client: redis.Redis, keys: RedisKeys, request_id: str, condition: Condition) -> None:
    client.hset(keys.previews, request_id, PreviewRequest(condition, None, time.time()).to_json())


def _answers(client: redis.Redis, keys: RedisKeys, request_id: str) -> list[PreviewAnswer]:
    return [PreviewAnswer.from_json(a) for a in client.lrange(keys.preview_answers(request_id), 0, -1)]


def test_a_failing_preview_fails_only_its_request_with_its_reason_never_the_batch(
        settings: Settings, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    keys = RedisKeys(settings)
    assert publish_catalog(redis_client, keys, Catalog(1, [SubscriptionSpec(1, parse_condition("COUNT(*) OVER 1s >= 3"))]))
    job = ShardJob(settings, ShardConfig(ATTRIBUTES, 1_000, 60_000, 0, 1), str(settings.data_dir / "previews"), TRADES,
                   StreamShape(TRADES, ATTRIBUTES))
    broken = parse_condition("MAX(price) OVER 1s > 10")
    real = SubstreamShard.preview

    def preview(self: SubstreamShard, condition: Condition, keys: frozenset[str] | None = None):
        if condition == broken:
            raise RuntimeError("forced failure")
        return real(self, condition, keys)

    monkeypatch.setattr(SubstreamShard, "preview", preview)  # a preview that raises, whatever the reason
    _ask(redis_client, keys, "broken", broken)
    _ask(redis_client, keys, "count", parse_condition("COUNT(*) OVER 1s >= 1"))
    _ask(redis_client, keys, "alien", Condition(Aggregate.SUM, "heat", 1_000, low=1.0))  # not an attribute of trades
    forget_copies()
    state, runner, t0 = State(), ShardRunner(job), 1_700_000_000_000
    for i in range(2):  # two batches: A fires in the first; the requests are answered once, a new one at once
        rows = pane_rows([("A", t0 + i * 1_000 + j * 100, 10.0 + j, 1.0) for j in range(3)])
        result = runner.run(0, *state.clock, rows, {0: t0 + (i + 1) * 1_000 + 500}, state)  # raises nothing
        state.write(result)
        if i == 0:
            assert [(r["subscription_id"], r["key"], r["state"]) for r in result.output.to_dict("records")
                    if r["alert_id"]] == [(1, "A", "firing")], "the batch evaluated as usual"
            _ask(redis_client, keys, "next", parse_condition("MIN(price) OVER 1s <= 10"))
    assert _answers(redis_client, keys, "broken") == [PreviewAnswer.failed(0, t0 + 1_000, "RuntimeError: forced failure")]
    assert _answers(redis_client, keys, "alien") == [
        PreviewAnswer.failed(0, t0 + 1_000, "stream 'trades' has no attribute 'heat'")]
    assert _answers(redis_client, keys, "count") == [PreviewAnswer(0, t0 + 1_000, (("A", 3.0),), 1, 1)]
    assert _answers(redis_client, keys, "next") == [PreviewAnswer(0, t0 + 2_000, (("A", 10.0),), 1, 1)]
    forget_copies()
