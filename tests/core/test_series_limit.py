"""A stream's series limit on a real Redis: new series beyond it are refused, admitted ones go on, and series
leave after the horizon without an event."""

from __future__ import annotations

import redis

from core.series_limit import SeriesLimit
from core.settings import Settings

T = 1_700_000_000_000


def limit_of(settings: Settings, client: redis.Redis, n: int) -> SeriesLimit:
    return SeriesLimit(client, settings.model_copy(update={"stream_max_series": n}))


def test_new_series_beyond_the_limit_are_refused_and_admitted_ones_go_on(settings: Settings,
                                                                         redis_client: redis.Redis) -> None:
    limit = limit_of(settings, redis_client, 3)
    assert limit.refused("hosts", ["a", "b"], [T, T]) == []
    assert limit.refused("hosts", ["c", "d", "a", "e"], [T, T, T + 5, T]) == [1, 3], "d and e: beyond 3"
    assert limit.refused("hosts", ["a", "b", "c"], [T + 9, T + 9, T + 9]) == [], "admitted series stay admitted"
    assert limit.active("hosts") == 3
    assert limit.refused("trades", ["d"], [T]) == [], "each stream has its own limit"


def test_a_series_leaves_after_the_horizon_without_an_event_and_makes_room(settings: Settings,
                                                                          redis_client: redis.Redis) -> None:
    limit = limit_of(settings, redis_client, 2)
    horizon = settings.max_window_ms + settings.watermark_delay_ms
    limit.refused("hosts", ["old", "kept"], [T, T])
    limit.refused("hosts", ["kept"], [T + horizon])  # "old" is exactly at the cutoff: still active
    assert limit.refused("hosts", ["new"], [T + horizon]) == [0]
    assert limit.refused("hosts", ["new"], [T + horizon + 1]) == [], "'old' left: its last event is past the horizon"
    assert redis_client.zrange(limit.keys.series("hosts"), 0, -1) == ["kept", "new"]


def test_a_series_last_seen_time_never_moves_back(settings: Settings, redis_client: redis.Redis) -> None:
    """A late batch (an earlier partition's) must not make an active series look idle."""
    limit = limit_of(settings, redis_client, 5)
    limit.refused("hosts", ["a"], [T + 100])
    limit.refused("hosts", ["a"], [T])
    assert redis_client.zscore(limit.keys.series("hosts"), "a") == T + 100


def test_more_series_than_one_script_call_takes(settings: Settings, redis_client: redis.Redis) -> None:
    limit = limit_of(settings, redis_client, SeriesLimit.CHUNK + 10)
    series = [f"k{i}" for i in range(SeriesLimit.CHUNK + 20)]
    assert limit.refused("hosts", series, [T] * len(series)) == list(range(SeriesLimit.CHUNK + 10, len(series)))


def test_forget_empties_a_stream_registry(settings: Settings, redis_client: redis.Redis) -> None:
    limit = limit_of(settings, redis_client, 1)
    limit.refused("hosts", ["a"], [T])
    limit.forget("hosts")
    assert limit.refused("hosts", ["b"], [T]) == []
