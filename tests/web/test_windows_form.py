"""The issue-16 windows through the API, the form (help and live check) and the preview, which a real shard
evaluator answers (the operator's code path: ``ShardEvaluator.preview`` -> ``PreviewAnswer``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import redis

from core.redis_schema import RedisKeys, shard_clock_field
from core.settings import Settings
from evaluator.catalog import Catalog
from evaluator.preview import PreviewAnswer, PreviewRequest
from evaluator.shard import ShardConfig, ShardEvaluator
from ingest.kafka import ensure_topics
from ingest.model import ATTRIBUTES
from subscriptions.language import WINDOWS
from tests.evaluator.test_shard import pane_rows
from tests.users import api_client, new_user, sign_in

CONSTRUCTS = {  # as typed -> canonical
    "change(price) over 5m < -3%": "CHANGE(price) OVER 5m < -3%",
    "CHANGE(price) OVER 1m > 2": "CHANGE(price) OVER 1m > 2",
    "AVG(price) OVER last 100 events > 10": "AVG(price) OVER LAST 100 EVENTS > 10",
    "no data for 5m": "NO DATA FOR 5m",
    "RATE(volume) OVER 10s > 1": "RATE(volume) OVER 10s > 1",
}


def assert_accepted_and_refused(api, accepted: dict[str, str], refused: tuple[tuple[str, str], ...]) -> None:
    """Each condition of ``accepted`` (as typed) is saved as its canonical text; each of ``refused`` is a 422 whose
    field-level message on ``condition`` says what is wrong."""
    for typed, canonical in accepted.items():
        created = api.post("/api/subscriptions", json={"name": "w", "condition": typed, "keys": ["AAPL"]})
        assert created.status_code == 201, created.text
        assert created.json()["condition"] == canonical
    for text, message in refused:
        response = api.post("/api/subscriptions", json={"name": "w", "condition": text})
        assert response.status_code == 422, text
        assert any("condition" in map(str, e["loc"]) and message in e["msg"] for e in response.json()["detail"])


def test_the_api_accepts_the_new_windows_and_refuses_what_the_evaluator_cannot_keep(api, settings: Settings) -> None:
    assert_accepted_and_refused(api, CONSTRUCTS, (("AVG(price) OVER LAST 101 EVENTS > 1", "at most 100 events"),
                                                  ("AVG(price) OVER LAST 0 EVENTS > 1", "at least 1"),
                                                  ("NO DATA FOR 3h", "shorter than 3h"),
                                                  ("RATE(price) OVER LAST 5 EVENTS > 1", "time window only")))


@contextmanager
def subscription_form(settings: Settings) -> Iterator[tuple[str, Callable[[str], str]]]:
    """A new user's subscription form (its page) and its live check of a condition as typed (the check's HTML)."""
    user, _ = new_user(settings)
    with api_client(settings) as browser:
        sign_in(browser, user.email)
        form = browser.get("/subscriptions/new", headers={"accept": "text/html"}).text
        yield form, lambda condition: browser.post("/conditions/check", data={"condition": condition}).text


def test_the_form_lists_the_windows_and_checks_them_as_typed(settings: Settings) -> None:
    with subscription_form(settings) as (form, check):
        for syntax, _ in WINDOWS:
            assert syntax.replace(">", "&gt;") in form
        for name in ("CHANGE(attribute)", "PCT_CHANGE(attribute)", "RATE(attribute)"):
            assert name in form
        assert "in % of its first value" in check("CHANGE(price) OVER 5m > 3%")
        assert "at least 1, not 0 (at column 22)" in check("AVG(price) OVER LAST 0 EVENTS > 1")


def shard_answers(client: redis.Redis, keys: RedisKeys, shard: ShardEvaluator, stop: threading.Event) -> None:
    """Answer every preview request in Redis with ``shard``'s answer, as the evaluator's operator does, until
    ``stop``."""
    answered: set[str] = set()
    while not stop.is_set():
        for request_id, payload in client.hgetall(keys.previews).items():
            if request_id not in answered:
                answered.add(request_id)
                request = PreviewRequest.from_json(payload)
                answer = PreviewAnswer.of(0, *shard.preview(request.condition, request.keys), request.condition)
                client.rpush(keys.preview_answers(request_id), answer.to_json())
        time.sleep(0.01)


def shard_fed(events: list[tuple[str, int, float, float]], clock_ms: int, **config: int) -> ShardEvaluator:
    """One shard (1 s panes, a minute's horizon and of retained values, ``config`` besides) fed ``events`` in one
    batch, its one partition's progress at ``clock_ms``."""
    shard = ShardEvaluator(ShardConfig(ATTRIBUTES, 1_000, 60_000, 0, 1, value_retention_ms=60_000, **config))
    shard.step(pane_rows(events), {0: clock_ms}, Catalog.empty())
    return shard


@contextmanager
def previews_answered_by(shard: ShardEvaluator, settings: Settings, redis_client: redis.Redis
                         ) -> Iterator[Callable[..., dict]]:
    """A signed-in user's preview, ``preview(condition, keys=None) -> {key: value}``, answered by ``shard`` (its
    clock published as a live evaluator's) through the API and Redis, as in production."""
    ensure_topics(settings)
    settings = settings.model_copy(update={"preview_timeout_s": 2.0, "evaluator_stale_s": 30})
    keys = RedisKeys(settings)
    now = time.time()
    redis_client.hset(keys.evaluator_stats, mapping={"driver_started_at": now, "driver_heartbeat_at": now,
                                                     "last_batch_at": now, shard_clock_field(0): shard.evaluated_at})
    _, token = new_user(settings)
    stop = threading.Event()
    answering = threading.Thread(target=shard_answers, args=(redis_client, keys, shard, stop), daemon=True)
    answering.start()
    try:
        with api_client(settings, token) as api:
            def preview(condition: str, watch: list[str] | None = None) -> dict:
                response = api.post("/api/conditions/preview", json={"condition": condition, "keys": watch})
                assert response.status_code == 200, response.text
                return {m["key"]: m["value"] for m in response.json()["matches"]}

            yield preview
    finally:
        stop.set()
        answering.join()


def test_the_preview_answers_the_new_windows(settings: Settings, redis_client: redis.Redis) -> None:
    # AAPL rises 10 -> 12 (20 %), MSFT falls 10 -> 9 (-10 %), IBM reported once, long ago
    events = [("IBM", 1_000, 5.0, 1.0), ("AAPL", 40_100, 10.0, 1.0), ("AAPL", 41_100, 12.0, 1.0),
              ("MSFT", 40_200, 10.0, 1.0), ("MSFT", 41_200, 9.0, 1.0)]
    shard = shard_fed(events, 42_000, tuple_max_events=100)
    assert shard.evaluated_at == 42_000
    with previews_answered_by(shard, settings, redis_client) as preview:
        assert preview("CHANGE(price) OVER 5s > 3%") == {"AAPL": 20.0}
        assert preview("CHANGE(price) OVER 5s < -3%") == {"MSFT": -10.0}
        assert preview("AVG(price) OVER LAST 1 EVENTS >= 9") == {"AAPL": 12.0, "MSFT": 9.0}
        assert preview("NO DATA FOR 10s") == {"IBM": 0.0}
        assert preview("NO DATA FOR 10s", ["AAPL", "NEVER"]) == {"NEVER": 0.0}  # a listed key is watched
