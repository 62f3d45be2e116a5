"""A stream's series limit on a real Redis: new series beyond it are refused, admitted ones go on, and series
leave after the horizon without an event."""

from __future__ import annotations

import numpy as np
import pytest
import redis

from core import series_limit
from core.series_limit import Refusal, SeriesLimit
from core.settings import Settings

T = 1_700_000_000_000


def limit_of(settings: Settings, client: redis.Redis, n: int, share: float = 1.0) -> SeriesLimit:
    return SeriesLimit(client, settings.model_copy(update={"stream_max_series": n,
                                                           "publish_token_series_share": share}))


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
    horizon = limit.leave_after_ms  # the horizon and its sixteenth (the reports' slack)
    assert horizon == (settings.max_window_ms + settings.watermark_delay_ms) * 17 // 16
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


def test_one_publisher_token_fills_its_share_and_not_the_stream(settings: Settings, redis_client: redis.Redis) -> None:
    """A flooding collector (token 1) is held to its share; another collector's (token 2) new series still come in,
    up to the stream's limit; records with no token (Kafka producers) meet the stream's limit only."""
    limit = limit_of(settings, redis_client, 5, share=0.4)  # 2 series per token
    assert limit.refusals("hosts", ["a", "b", "c", "d"], [T] * 4, token=1) == {2: Refusal.TOKEN, 3: Refusal.TOKEN}
    assert limit.refused("hosts", ["e", "f"], [T, T], token=2) == [], "the flood left room for the others"
    assert limit.refused("hosts", ["a", "b"], [T + 1, T + 1], token=1) == [], "its admitted series go on"
    assert limit.refusals("hosts", ["e"], [T], token=1) == {0: Refusal.TOKEN}, "a series new to the token counts"
    assert limit.refused("hosts", ["g"], [T]) == [], "no token: the stream's limit only"
    assert limit.refusals("hosts", ["h"], [T], token=3) == {0: Refusal.STREAM}, "the stream is full"
    assert limit.active("hosts") == 5
    assert 0 < redis_client.pttl(limit.keys.token_series("hosts", 1)) <= limit.horizon_ms, "an idle token's set goes"


def test_a_token_series_leave_after_the_horizon(settings: Settings, redis_client: redis.Redis) -> None:
    limit = limit_of(settings, redis_client, 10, share=0.1)  # 1 series per token
    limit.refused("hosts", ["old"], [T], token=1)
    assert limit.refused("hosts", ["new"], [T + limit.leave_after_ms], token=1) == [0]
    assert limit.refused("hosts", ["new"], [T + limit.leave_after_ms + 1], token=1) == []


def test_a_token_series_reason_names_its_share(settings: Settings, redis_client: redis.Redis) -> None:
    limit = limit_of(settings, redis_client, 10, share=0.5)
    why = limit.reason("hosts", "web-1", {"region": "r7"}, (), Refusal.TOKEN)
    assert why.startswith("series: a series (key 'web-1', dimensions {'region': 'r7'}) new to this publisher token "
                          "beyond the 5 active series one token may have in stream 'hosts'"), why
    assert "TOCSIN_PUBLISH_TOKEN_SERIES_SHARE" in why


def test_forget_empties_the_tokens_registries_too(settings: Settings, redis_client: redis.Redis) -> None:
    limit = limit_of(settings, redis_client, 4, share=0.25)
    limit.refused("hosts", ["a"], [T], token=7)
    limit.refused("other", ["a"], [T], token=7)
    limit.forget("hosts")
    assert limit.refused("hosts", ["b"], [T], token=7) == []
    assert limit.refused("other", ["b"], [T], token=7) == [0], "another stream's registries stay"


class Asked:
    """The series a limit sends to the registry, call by call."""

    def __init__(self, limit: SeriesLimit) -> None:
        self.calls: list[list[str]] = []
        real = limit.refusals

        def counted(stream: str, series: list[str], newest: list[int], token: int | None = None) -> dict:
            self.calls.append(list(series))
            return real(stream, series, newest, token)

        limit.refusals = counted  # type: ignore[method-assign]


def events(*pairs: tuple[str, int]) -> tuple[np.ndarray, np.ndarray]:
    return np.array([p[0] for p in pairs], dtype=object), np.array([p[1] for p in pairs], dtype=np.int64)


def test_a_worker_reports_a_series_it_admitted_again_only_past_the_slack_or_the_wall_time(
        settings: Settings, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    limit = SeriesLimit(redis_client, settings.model_copy(update={"stream_max_series": 2}), remember_s=30)
    asked = Asked(limit)
    clock = [1000.0]
    monkeypatch.setattr(series_limit.time, "monotonic", lambda: clock[0])
    assert limit.event_refusals("hosts", *events(("a", T), ("b", T), ("c", T))).tolist() == [0, 0, 1]
    assert asked.calls == [["a", "b", "c"]]
    assert limit.event_refusals("hosts", *events(("a", T + 5), ("c", T + 5))).tolist() == [0, 1], "c: still refused"
    assert asked.calls[-1] == ["c"], "a was reported: not asked again; a refused series always is"
    assert limit.event_refusals("hosts", *events(("b", T + limit.slack_ms + 1))).tolist() == [0]
    assert asked.calls[-1] == ["b"], "b's events are past its report by more than the slack"
    clock[0] += 31
    limit.event_refusals("hosts", *events(("a", T + 6)))
    assert asked.calls[-1] == ["a"], "a registry emptied behind the worker's back is filled again within remember_s"
    assert limit.event_refusals("hosts", *events(("a", T + 7)), token=1).tolist() == [0]
    assert asked.calls[-1] == ["a"], "a publisher token's records are always checked"


def test_an_active_series_never_leaves_for_a_report_a_worker_skipped(settings: Settings,
                                                                   redis_client: redis.Redis) -> None:
    """a's newest event (T + slack) is remembered, not reported: the registry holds T for it. A new series at T +
    slack + horizon must not push a out (its last event is exactly a horizon old: active), one later may."""
    limit = SeriesLimit(redis_client, settings.model_copy(update={"stream_max_series": 1}), remember_s=30)
    horizon, slack = limit.horizon_ms, limit.slack_ms
    limit.event_refusals("hosts", *events(("a", T)))
    limit.event_refusals("hosts", *events(("a", T + slack)))  # within the slack: not reported
    assert redis_client.zscore(limit.keys.series("hosts"), "a") == T
    assert limit.event_refusals("hosts", *events(("new", T + slack + horizon))).tolist() == [1]
    assert limit.event_refusals("hosts", *events(("a", T + slack + horizon))).tolist() == [0]
    assert limit.event_refusals("hosts", *events(("new", T + 2 * slack + 2 * horizon + 1))).tolist() == [0]


def test_forget_forgets_what_the_worker_reported_too(settings: Settings, redis_client: redis.Redis) -> None:
    limit = SeriesLimit(redis_client, settings.model_copy(update={"stream_max_series": 1}), remember_s=30)
    limit.event_refusals("hosts", *events(("a", T)))
    limit.forget("hosts")
    limit.event_refusals("hosts", *events(("a", T + 1)))
    assert redis_client.zscore(limit.keys.series("hosts"), "a") == T + 1
