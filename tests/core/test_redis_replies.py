"""Replies of a real Redis through the typed views: text from a decoding client, an error otherwise."""

from __future__ import annotations

import pytest
import redis

from core.redis_replies import text_entries, text_hash
from core.settings import Settings


def test_a_decoding_client_gives_text(settings: Settings, redis_client: redis.Redis) -> None:
    key = f"{settings.redis_prefix}test:replies"
    redis_client.hset(f"{key}:hash", mapping={"a": "1", "b": "x"})
    redis_client.xadd(f"{key}:stream", {"alert": "{}"}, id="5-0")
    assert text_hash(redis_client.hgetall(f"{key}:hash")) == {"a": "1", "b": "x"}
    assert text_hash(redis_client.hgetall(f"{key}:missing")) == {}
    assert text_entries(redis_client.xrange(f"{key}:stream")) == [("5-0", {"alert": "{}"})]
    assert text_entries(redis_client.xrange(f"{key}:missing")) == []


def test_a_client_that_does_not_decode_is_refused(settings: Settings) -> None:
    key = f"{settings.redis_prefix}test:replies"
    raw = redis.Redis.from_url(settings.redis_url)
    raw.hset(f"{key}:hash", "a", "1")
    raw.xadd(f"{key}:stream", {"alert": "{}"})
    with pytest.raises(TypeError, match="decode_responses"):
        text_hash(raw.hgetall(f"{key}:hash"))
    with pytest.raises(TypeError, match="decode_responses"):
        text_entries(raw.xrange(f"{key}:stream"))
