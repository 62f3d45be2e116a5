"""Baselines (a window per part), STDDEV and ZSCORE through the API, the form and the preview, which a real shard
evaluator answers over several windows at once."""

from __future__ import annotations

import redis

from core.settings import Settings
from tests.web.test_windows_form import assert_accepted_and_refused, previews_answered_by, shard_fed, subscription_form

CONSTRUCTS = {  # as typed -> canonical
    "(sum(volume) over 5m) / (sum(volume) over 1h) * 12 > 3": "(SUM(volume) OVER 5m) / (SUM(volume) OVER 1h) * 12 > 3",
    "SUM(volume) / (SUM(volume) OVER 1h) OVER 5m > 0.25": "(SUM(volume) OVER 5m) / (SUM(volume) OVER 1h) > 0.25",
    "zscore(price) over 1h > 2": "ZSCORE(price) OVER 1h > 2",
    "STDDEV(price) OVER 15m > 1%": "STDDEV(price) OVER 15m > 1%",
}


def test_the_api_accepts_baselines_and_refuses_windows_the_evaluator_cannot_keep(api, settings: Settings) -> None:
    assert_accepted_and_refused(api, CONSTRUCTS, (
        ("(SUM(volume) OVER 5m) / (SUM(volume) OVER 4h) > 1", "at most 3h"),
        ("(STDDEV(price) OVER 2h) / (AVG(price) OVER 1m) > 1", "stddev's window may be at most 1h"),
        ("(SUM(volume) OVER 5m) / SUM(volume) > 3", "OVER and a window for the parts"),
    ))


def test_the_form_checks_a_baseline_as_typed(settings: Settings) -> None:
    with subscription_form(settings) as (form, check):
        assert "STDDEV(attribute)" in form and "ZSCORE(attribute)" in form and "its own baseline" in form
        ok = check("(SUM(volume) OVER 5m) / (SUM(volume) OVER 1h) > 2")
        assert "(SUM(volume) OVER 5m) / (SUM(volume) OVER 1h) is above 2" in ok
        assert "a window inside parentheses ends them" in check("(SUM(volume) OVER 5m - 1) > 2")


def test_the_preview_answers_over_several_windows(settings: Settings, redis_client: redis.Redis) -> None:
    # AAPL: 1 a second for 30 s, then 10 in the last second; MSFT: 1 a second throughout
    events = [(key, 10_000 + 1_000 * s + (100 if key == "AAPL" else 200), 10.0, 1.0)
              for s in range(30) for key in ("AAPL", "MSFT")]
    events += [("AAPL", 40_500, 10.0, 10.0), ("MSFT", 40_600, 10.0, 1.0)]
    shard = shard_fed(events, 41_000)
    assert shard.evaluated_at == 41_000  # the windows end with the second of AAPL's 10
    with previews_answered_by(shard, settings, redis_client) as preview:
        # the last second's volume against the mean second of the last 30: AAPL 10 / (39 / 30), MSFT 1 / 1
        ratio = preview("(SUM(volume) OVER 1s) / (SUM(volume) OVER 30s) * 30 > 2")
        assert list(ratio) == ["AAPL"] and abs(ratio["AAPL"] - 10 / (39 / 30)) < 1e-9
        assert set(preview("(SUM(volume) OVER 1s) / (SUM(volume) OVER 30s) * 30 > 0.5")) == {"AAPL", "MSFT"}
        assert list(preview("ZSCORE(volume) OVER 30s > 3")) == ["AAPL"]
