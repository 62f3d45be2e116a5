"""Rank conditions through the API, the form and the preview (a real shard evaluator answers)."""

from __future__ import annotations

import httpx
import redis

from core.settings import Settings
from tests.users import api_client, new_user
from tests.web.test_windows_form import assert_accepted_and_refused, previews_answered_by, shard_fed, subscription_form

CONSTRUCTS = {  # as typed -> canonical
    "sum(volume) over 5m in top 10": "SUM(volume) OVER 5m IN TOP 10",
    "CHANGE(price) OVER 1h IN BOTTOM 5 WHERE key STARTS WITH 'AA'": "CHANGE(price) OVER 1h IN BOTTOM 5 WHERE key "
                                                                    "STARTS WITH 'AA'",
    "(SUM(volume) OVER 5m) / (SUM(volume) OVER 1h) IN TOP 3": "(SUM(volume) OVER 5m) / (SUM(volume) OVER 1h) IN TOP 3",
}


def test_the_api_accepts_ranks_and_refuses_what_a_rank_cannot_be(api, settings: Settings) -> None:
    assert_accepted_and_refused(api, CONSTRUCTS, (
        ("SUM(volume) OVER 5m IN TOP 0", "within the first 1 to 100 keys"),
        ("SUM(volume) OVER 5m IN TOP 10 FOR 2m", "a rank condition takes no FOR"),
        ("SUM(volume) OVER 5m IN MIDDLE 3", "expected TOP or BOTTOM after IN"),
        ("AVG(price) OVER LAST 20 EVENTS IN TOP 3", "a rank is over a time window"),
        ("SUM(volume) OVER 4h IN TOP 3", "at most 3h"),
    ))


def test_the_form_explains_a_rank(settings: Settings) -> None:
    with subscription_form(settings) as (form, check):
        assert "IN TOP 10" in form
        assert "is among the 10 highest of all keys with events in that window" in check("SUM(volume) OVER 5m IN TOP 10")


def test_the_preview_lists_the_first_k(settings: Settings, redis_client: redis.Redis) -> None:
    volumes = {"AAPL": 5.0, "MSFT": 9.0, "NVDA": 7.0, "TSLA": 1.0}
    events = [(key, 10_000 + 1_000 * s + 100, 10.0, volume) for s in range(5) for key, volume in volumes.items()]
    shard = shard_fed(events, 15_000)  # windows [10 s, 15 s): every event
    with previews_answered_by(shard, settings, redis_client) as preview:
        assert preview("SUM(volume) OVER 5s IN TOP 2") == {"MSFT": 45.0, "NVDA": 35.0}
        assert list(preview("SUM(volume) OVER 5s IN BOTTOM 1")) == ["TSLA"]


def test_a_user_has_at_most_user_max_ranks_rank_subscriptions(settings: Settings) -> None:
    """A rank costs the evaluator up to k entries per shard and boundary, a threshold none: they are counted apart."""
    settings = settings.model_copy(update={"user_max_ranks": 1})
    _, token = new_user(settings)
    with api_client(settings, token) as api:
        def save(condition: str, sid: int | None = None) -> httpx.Response:
            body = {"name": "r", "condition": condition}
            return api.put(f"/api/subscriptions/{sid}", json=body) if sid else api.post("/api/subscriptions", json=body)

        first = save("SUM(volume) OVER 5m IN TOP 10")
        assert first.status_code == 201
        over = save("COUNT(*) OVER 1m IN BOTTOM 3")
        assert over.status_code == 403 and "at most 1 rank subscriptions" in over.json()["detail"]
        plain = save("SUM(volume) OVER 5m > 10")
        assert plain.status_code == 201  # thresholds are not ranks
        assert save("SUM(volume) OVER 5m IN TOP 5", plain.json()["id"]).status_code == 403  # nor made one by an edit
        assert save("SUM(volume) OVER 5m IN TOP 5", first.json()["id"]).status_code == 200  # the rank itself, edited
