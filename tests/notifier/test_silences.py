"""Silences in the dispatcher: the matcher (pure, against Python's re as an oracle), the per-owner cache, and the
real dispatcher on real Redis logging suppressions with the silence id while the rest is delivered."""

from __future__ import annotations

import base64
import json
import re
import time
from datetime import datetime

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from core.redis_schema import RedisKeys, celery_queue_keys
from core.settings import Settings
from evaluator.spark.sink import RedisAlertSink
from evaluator.transition import alert_id
from notifier.app import make_celery
from notifier.deliveries import DeliveryRecords
from notifier.dispatcher import Dispatcher
from notifier.policy import KeyState
from notifier.silences import (
    ActiveSilence,
    Matcher,
    SilenceCache,
    alert_labels,
    silenced_by,
    silenced_decision,
)
from subscriptions.db import session_factory
from subscriptions.policy import AlertPolicy
from subscriptions.routing import Route
from subscriptions.schemas import EndpointIn, SubscriptionIn
from subscriptions.service import SubscriptionService
from subscriptions.silences import SilenceIn, SilenceRule, SilenceService
from tests.users import new_user

CONDITION = "SUM(volume) OVER 1m > 100"
ROUTE = Route(12, 7, "Tech volume", CONDITION, True, AlertPolicy(), ())

# -- the matcher (pure) -----------------------------------------------------------------------------------------

labels_text = st.text(alphabet="AB.x1", max_size=6)
patterns = st.sampled_from(["A.*", ".*", "A|B", "AB?", "[AB]+", "x1", "", ".", "A.B", "(A|x)1*", r"\.", "B{2}"])


@given(label=labels_text, pattern=patterns)
def test_regex_matchers_match_the_whole_label_like_anchored_python_re(label: str, pattern: str) -> None:
    """RE2 with Alertmanager's anchoring agrees with Python's re.fullmatch (the oracle) on RE2's syntax."""
    expected = re.fullmatch(pattern, label) is not None
    assert Matcher.of("key", "=~", pattern).matches({"key": label}) is expected
    assert Matcher.of("key", "!~", pattern).matches({"key": label}) is not expected


@given(label=labels_text, value=labels_text)
def test_equality_matchers_and_a_missing_label_is_empty(label: str, value: str) -> None:
    assert Matcher.of("key", "=", value).matches({"key": label}) is (label == value)
    assert Matcher.of("key", "!=", value).matches({"key": label}) is (label != value)
    assert Matcher.of("key", "=~", re.escape(value)).matches({"key": label}) is (label == value)
    assert Matcher.of("subscription_name", "=", value).matches({"key": label}) is (value == "")


def test_a_silence_needs_every_matcher_and_its_time_window() -> None:
    labels = alert_labels(ROUTE, "AAPL")
    assert labels == {"key": "AAPL", "subscription": "12", "subscription_name": "Tech volume"}
    both = ActiveSilence.of(SilenceRule(3, 7, 100.0, 200.0, (("key", "=~", "AA.*"), ("subscription", "=", "12"))))
    assert both.silences(labels, 100.0) and both.silences(labels, 199.9)
    assert not both.silences(labels, 99.9) and not both.silences(labels, 200.0)  # pending, then ended
    assert not both.silences(alert_labels(ROUTE, "MSFT"), 150.0)
    other = ActiveSilence.of(SilenceRule(2, 7, 0.0, 1e12, (("subscription_name", "!=", "Tech volume"),
                                                            ("key", "=~", ".+"))))
    assert not other.silences(labels, 150.0)
    by_name = ActiveSilence.of(SilenceRule(5, 7, 0.0, 1e12, (("subscription_name", "=~", "Tech.*"),)))
    assert silenced_by((other, both, by_name), labels, 150.0) == 3  # the oldest that matches
    assert silenced_by((other, both, by_name), labels, 250.0) == 5
    assert silenced_by((), labels, 150.0) is None


def test_a_silenced_firing_leaves_the_episode_unnotified_and_a_silenced_resolution_closes_it() -> None:
    told = KeyState(notified_at=50.0, open=True)
    assert silenced_decision(4, told, "firing") == ("silenced by #4", told)
    assert silenced_decision(4, told, "resolved") == ("silenced by #4", KeyState(50.0, False))


def test_the_cache_reloads_an_owner_only_after_its_period_and_all_due_owners_at_once() -> None:
    loads: list[set[int]] = []
    rules = {7: [SilenceRule(1, 7, 0.0, 1e12, (("key", "=", "AAPL"),))], 8: []}
    clock = [0.0]

    def load(_session: object, owners: set[int], _now: datetime) -> dict[int, list[SilenceRule]]:
        loads.append(set(owners))
        return {o: list(rules[o]) for o in owners}

    cache = SilenceCache(5.0, load, lambda: clock[0])
    cache.refresh(None, {7, 8})  # type: ignore[arg-type]
    assert loads == [{7, 8}] and cache.silencing(ROUTE, "AAPL", time.time()) == 1
    rules[7] = []  # expired in the database
    clock[0] = 4.9
    cache.refresh(None, {7, 8})  # type: ignore[arg-type]
    assert loads == [{7, 8}] and cache.silencing(ROUTE, "AAPL", time.time()) == 1  # within the period: no query
    clock[0] = 5.0
    cache.refresh(None, {7})  # type: ignore[arg-type]
    assert loads == [{7, 8}, {7}] and cache.silencing(ROUTE, "AAPL", time.time()) is None


# -- the dispatcher, real Redis -----------------------------------------------------------------------------------


def _transition(subscription_id: int, key: str, state: str, evaluated_at: int) -> dict:
    return {"alert_id": alert_id(subscription_id, key, state, evaluated_at), "subscription_id": subscription_id,
            "key": key, "state": state, "value": 150.0 if state == "firing" else 50.0,
            "window_start": evaluated_at - 60_000, "window_end": evaluated_at, "evaluated_at": evaluated_at}


def _dispatch(settings: Settings, dispatcher: Dispatcher, *transitions: dict) -> None:
    """Transitions through the evaluator's sink and the dispatcher (no worker: deliveries stay queued)."""
    assert RedisAlertSink(settings).write(list(transitions)) == len(transitions)
    assert dispatcher.read(block_ms=1_000) == len(transitions)
    dispatcher.flush(force=True)


def _queued(settings: Settings, client: redis.Redis) -> list[tuple[int, str, tuple[str, ...], bool]]:
    """(subscription, state, keys, reminder) of each delivery task waiting in the broker's queue."""
    found = []
    for raw in client.lrange(celery_queue_keys(settings)[0], 0, -1):
        args, _kwargs, _embed = json.loads(base64.b64decode(json.loads(raw)["body"]))
        n = args[0]
        found.append((n["subscription_id"], n["state"], tuple(a["key"] for a in n["alerts"]), n.get("reminder", False)))
    return sorted(found)


def _subscription(settings: Settings, client: redis.Redis, user, name: str = "vol", **policy: object) -> int:
    with session_factory(settings.database_url)() as session:
        service = SubscriptionService(session, settings, client, user)
        endpoint = service.create_endpoint(EndpointIn(kind="webhook", target="https://hooks.example.com/x"))
        return service.create(SubscriptionIn(name=name, condition=CONDITION, endpoint_ids=[endpoint.id],
                                             policy=policy)).id


def _silence(settings: Settings, user, *matchers: tuple[str, str, str]) -> int:
    with session_factory(settings.database_url)() as session:
        data = SilenceIn(matchers=[{"name": n, "op": o, "value": v} for n, o, v in matchers], comment="maintenance",
                         duration_s=3600)
        return SilenceService(session, settings, user).create(data).id


def _expire(settings: Settings, user, silence_id: int) -> None:
    with session_factory(settings.database_url)() as session:
        SilenceService(session, settings, user).expire(silence_id)


def _suppressions(client: redis.Redis, settings: Settings, subscription_id: int) -> list[tuple]:
    log = DeliveryRecords(client, RedisKeys(settings)).log(subscription_id)
    return sorted((e["keys"][0], e["state"], e["reason"], e.get("silence_id")) for e in log
                  if e["outcome"] == "suppressed")


def test_a_silenced_firing_is_logged_with_the_silence_id_and_the_others_are_delivered(
        settings: Settings, redis_client: redis.Redis, owner) -> None:
    other_user, _ = new_user(settings)
    mine = _subscription(settings, redis_client, owner, "mine")
    also_mine = _subscription(settings, redis_client, owner, "also mine")
    theirs = _subscription(settings, redis_client, other_user, "theirs")
    silence = _silence(settings, owner, ("key", "=~", "AA.*"), ("subscription", "=", str(mine)))
    everything_of_theirs = _silence(settings, other_user, ("key", "=~", ".+"))

    t = 1_700_000_060_000
    _dispatch(settings, Dispatcher(settings, make_celery(settings)),
              _transition(mine, "AAPL", "firing", t), _transition(mine, "MSFT", "firing", t),
              _transition(also_mine, "AAPL", "firing", t), _transition(theirs, "AAPL", "firing", t))

    assert _suppressions(redis_client, settings, mine) == [("AAPL", "firing", f"silenced by #{silence}", silence)]
    assert _suppressions(redis_client, settings, also_mine) == []  # the silence names the other subscription
    # the other user's silence of everything holds back their alert only, never this owner's
    assert _suppressions(redis_client, settings, theirs) == [
        ("AAPL", "firing", f"silenced by #{everything_of_theirs}", everything_of_theirs)]
    assert _queued(settings, redis_client) == [(mine, "firing", ("MSFT",), False),
                                               (also_mine, "firing", ("AAPL",), False)]


def test_a_saved_or_expired_silence_applies_within_the_cache_period(settings: Settings, redis_client: redis.Redis,
                                                                    owner) -> None:
    settings = settings.model_copy(update={"silence_cache_s": 0.5})
    sid = _subscription(settings, redis_client, owner)
    dispatcher = Dispatcher(settings, make_celery(settings))
    # The cache's own clock, stepped by the test: with the wall clock, a loaded machine took longer than the
    # period between K0 and K1, so K1 saw the silence too (a CI failure)
    elapsed = [0.0]
    dispatcher.silences = SilenceCache(settings.silence_cache_s, clock=lambda: elapsed[0])
    t = 1_700_000_060_000
    _dispatch(settings, dispatcher, _transition(sid, "K0", "firing", t))  # loads the owner's (no) silences

    silence = _silence(settings, owner, ("key", "=~", "K[0-9]+"))
    elapsed[0] = settings.silence_cache_s * 0.9
    _dispatch(settings, dispatcher, _transition(sid, "K1", "firing", t))  # decided from the cached copy
    elapsed[0] = settings.silence_cache_s
    _dispatch(settings, dispatcher, _transition(sid, "K2", "firing", t))  # the bound has passed: silenced
    _expire(settings, owner, silence)
    elapsed[0] = settings.silence_cache_s * 2
    _dispatch(settings, dispatcher, _transition(sid, "K3", "firing", t))

    assert _suppressions(redis_client, settings, sid) == [("K2", "firing", f"silenced by #{silence}", silence)]
    assert [keys for _, _, keys, _ in _queued(settings, redis_client)] == [("K0",), ("K1",), ("K3",)]


def test_a_key_still_firing_when_its_silence_ends_is_reminded_then_its_resolution_sent(
        settings: Settings, redis_client: redis.Redis, owner) -> None:
    settings = settings.model_copy(update={"silence_cache_s": 0.2})
    sid = _subscription(settings, redis_client, owner, renotify_s=60)
    silence = _silence(settings, owner, ("key", "=", "AAPL"))
    dispatcher = Dispatcher(settings, make_celery(settings))
    t = 1_700_000_060_000
    _dispatch(settings, dispatcher, _transition(sid, "AAPL", "firing", t))
    with session_factory(settings.database_url)() as session:
        assert dispatcher.remind(session) == 0  # reminders are held back while silenced, too
    assert _queued(settings, redis_client) == []

    _expire(settings, owner, silence)
    time.sleep(settings.silence_cache_s)
    with session_factory(settings.database_url)() as session:
        assert dispatcher.remind(session) == 1  # the silence is over and AAPL still fires: told now
    _dispatch(settings, dispatcher, _transition(sid, "AAPL", "resolved", t + 60_000))
    assert _queued(settings, redis_client) == [(sid, "firing", ("AAPL",), True), (sid, "resolved", ("AAPL",), False)]
    assert _suppressions(redis_client, settings, sid) == [("AAPL", "firing", f"silenced by #{silence}", silence)]


def test_a_resolution_while_silenced_of_a_notified_firing_is_sent_to_close_it(settings: Settings,
                                                                              redis_client: redis.Redis,
                                                                              owner) -> None:
    settings = settings.model_copy(update={"silence_cache_s": 0.01})
    sid = _subscription(settings, redis_client, owner)
    dispatcher = Dispatcher(settings, make_celery(settings))
    t = 1_700_000_060_000
    _dispatch(settings, dispatcher, _transition(sid, "AAPL", "firing", t))  # notified (e.g. a PagerDuty incident)
    silence = _silence(settings, owner, ("subscription_name", "=", "vol"))
    time.sleep(0.02)
    _dispatch(settings, dispatcher, _transition(sid, "MSFT", "firing", t + 60_000))  # new noise: held back
    _dispatch(settings, dispatcher, _transition(sid, "AAPL", "resolved", t + 60_000))  # closes what was told
    _dispatch(settings, dispatcher, _transition(sid, "MSFT", "resolved", t + 120_000))  # never told: held back
    assert _suppressions(redis_client, settings, sid) == [("MSFT", "firing", f"silenced by #{silence}", silence),
                                                          ("MSFT", "resolved", f"silenced by #{silence}", silence)]
    assert _queued(settings, redis_client) == [(sid, "firing", ("AAPL",), False), (sid, "resolved", ("AAPL",), False)]
    state = json.loads(redis_client.hget(RedisKeys(settings).key_states(sid), "AAPL"))
    assert state["open"] is False  # the next firing is a new episode


@pytest.mark.parametrize("op", ["=~", "!~"])
def test_a_stored_pattern_that_no_longer_compiles_silences_nothing(op: str) -> None:
    cache = SilenceCache(5.0, lambda _s, owners, _n: {7: [SilenceRule(1, 7, 0.0, 1e12, (("key", op, "(bad"),))]})
    cache.refresh(None, {7})  # type: ignore[arg-type]
    assert cache.silencing(ROUTE, "AAPL", time.time()) is None


def test_what_was_matched_is_remembered_per_subscription_name_and_key_until_the_silences_change() -> None:
    rules = {7: [SilenceRule(1, 7, 0.0, 1e12, (("subscription_name", "=~", "Tech.*"), ("key", "!=", "MSFT")))]}
    cache = SilenceCache(0.0, lambda _s, owners, _n: {o: list(rules[o]) for o in owners})
    cache.refresh(None, {7})  # type: ignore[arg-type]
    now = time.time()
    assert cache.silencing(ROUTE, "AAPL", now) == 1 and cache.silencing(ROUTE, "MSFT", now) is None
    renamed = Route(12, 7, "Energy volume", CONDITION, True, AlertPolicy(), ())
    assert cache.silencing(renamed, "AAPL", now) is None  # the name is part of what is remembered
    cache.refresh(None, {7})  # type: ignore[arg-type]  # reloaded, unchanged: the memo stays
    assert cache.silencing(ROUTE, "AAPL", now) == 1
    rules[7] = [SilenceRule(2, 7, now + 60, 1e12, (("key", "=", "AAPL"),))]  # changed: matched anew
    cache.refresh(None, {7})  # type: ignore[arg-type]
    assert cache.silencing(ROUTE, "AAPL", now) is None  # pending: its start is checked per alert
    assert cache.silencing(ROUTE, "AAPL", now + 60) == 2
