"""Silences that must never silence by accident, nor stop the dispatcher: rows it cannot read, silences of
everything, a database it cannot ask. Real dispatcher, real Redis, SQLite and PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
import redis
from sqlalchemy import text
from structlog.testing import capture_logs

from core.settings import Settings
from devstack.patience import patient
from devstack.services import python_module, spawn
from evaluator.spark.sink import RedisAlertSink
from notifier.app import make_celery
from notifier.dispatcher import Dispatcher
from notifier.silences import KEEP_TTLS, SilenceCache
from subscriptions.db import session_factory
from subscriptions.models import Silence
from subscriptions.silences import SilenceRule
from tests.databases import POSTGRES_ADMIN, postgres_database
from tests.notifier.test_silences import (
    ROUTE,
    _dispatch,
    _queued,
    _silence,
    _subscription,
    _suppressions,
    _transition,
)

T = 1_700_000_060_000


@pytest.fixture(params=["sqlite", "postgresql"])
def settings(request: pytest.FixtureRequest, settings: Settings) -> Iterator[Settings]:
    if request.param == "sqlite":
        yield settings
        return
    with postgres_database() as url:
        yield settings.model_copy(update={"database_url": url})


def _stored(settings: Settings, owner, matchers: object) -> int:
    """A silence row written past the API (by hand, or by a newer version)."""
    now = datetime.now(UTC)
    with session_factory(settings.database_url)() as session:
        row = Silence(owner_id=owner.id, created_by=owner.id, comment="by hand", matchers=matchers,
                      starts_at=now - timedelta(minutes=1), ends_at=now + timedelta(hours=1), created_at=now)
        session.add(row)
        session.commit()
        return row.id


UNREADABLE = [
    {"name": "key", "op": "=", "value": "AAPL"},  # a dict, not a list of them
    [{"name": "key", "op": "="}],  # no value
    [{"name": "key", "op": "==", "value": "MSFT"}],  # an operator it does not know: not read as !=
    [{"name": "severity", "op": "!=", "value": "page"}],  # a newer label: not "" != "page", i.e. everything
    [{"name": "key", "op": "=", "value": 7}],
    ["key=AAPL"],
    "key=AAPL",
    [],
    None,
    [{"name": "key", "op": "!=", "value": "NEVER"}],  # matches everything: the API refuses it
    [{"name": "key", "op": "=~", "value": ".*"}, {"name": "subscription_name", "op": "!~", "value": "x"}],
]


def test_silences_the_dispatcher_cannot_read_are_skipped_with_a_log_line_and_never_stop_it(
        settings: Settings, redis_client: redis.Redis, owner) -> None:
    sid = _subscription(settings, redis_client, owner)
    unreadable = [_stored(settings, owner, m) for m in UNREADABLE]
    good = _silence(settings, owner, ("key", "=", "GOOD"))
    settings = settings.model_copy(update={"silence_cache_s": 0.05})
    dispatcher = Dispatcher(settings, make_celery(settings))
    with capture_logs() as logs:
        _dispatch(settings, dispatcher, *[_transition(sid, k, "firing", T) for k in ("AAPL", "MSFT", "OTHER", "GOOD")])
    time.sleep(0.1)
    with capture_logs() as again:  # reloaded, unchanged: not logged at every reload
        _dispatch(settings, dispatcher, _transition(sid, "GOOD", "resolved", T + 60_000))
    assert not [e for e in again if e["event"] == "silence_skipped"]
    assert _suppressions(redis_client, settings, sid) == [("GOOD", "firing", f"silenced by #{good}", good),
                                                          ("GOOD", "resolved", f"silenced by #{good}", good)]
    assert _queued(settings, redis_client) == [(sid, "firing", ("AAPL", "MSFT", "OTHER"), False)]
    skipped = sorted(e["silence_id"] for e in logs if e["event"] == "silence_skipped")
    assert skipped == unreadable


def test_silences_that_cannot_be_loaded_deliver_and_the_dispatcher_goes_on(
        settings: Settings, redis_client: redis.Redis, owner) -> None:
    """The silences table gone (a schema behind, a broken database): every alert is delivered, logged, counted."""
    sid = _subscription(settings, redis_client, owner)
    _silence(settings, owner, ("key", "=", "AAPL"))
    with session_factory(settings.database_url)() as session:
        session.execute(text("DROP TABLE silences"))
        session.commit()
    dispatcher = Dispatcher(settings, make_celery(settings))
    with capture_logs() as logs:
        _dispatch(settings, dispatcher, _transition(sid, "AAPL", "firing", T))
        with session_factory(settings.database_url)() as session:
            assert dispatcher.remind(session) == 0  # the reminder round does not raise either
    assert _queued(settings, redis_client) == [(sid, "firing", ("AAPL",), False)]
    assert any(e["event"] == "silences_unavailable_delivering" for e in logs)


def test_a_failed_reload_keeps_the_last_copy_for_a_while_then_fails_open() -> None:
    clock = [0.0]
    failing = [False]

    def load(_session: object, owners: set[int], _now: datetime) -> dict[int, list[SilenceRule]]:
        if failing[0]:
            raise OSError("database unreachable")
        return {o: [SilenceRule(1, 7, 0.0, 1e12, (("key", "=", "AAPL"),))] for o in owners}

    class Session:
        rolled_back = 0

        def rollback(self) -> None:
            self.rolled_back += 1

    session = Session()
    cache = SilenceCache(5.0, load, lambda: clock[0])
    cache.refresh(session, {7})  # type: ignore[arg-type]
    failing[0] = True
    clock[0] = 5.0
    cache.refresh(session, {7})  # type: ignore[arg-type]
    assert session.rolled_back == 1
    assert cache.silencing(ROUTE, "AAPL", time.time()) == 1  # a blip does not end a maintenance window
    clock[0] = KEEP_TTLS * 5.0
    cache.refresh(session, {7})  # type: ignore[arg-type]
    assert cache.silencing(ROUTE, "AAPL", time.time()) is None  # unreadable for long: delivered
    failing[0] = False
    clock[0] += 5.0
    cache.refresh(session, {7})  # type: ignore[arg-type]
    assert cache.silencing(ROUTE, "AAPL", time.time()) == 1  # readable again




def _wait(check, what: str, process, log_path: Path, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + patient(timeout_s)
    while not check():
        assert process.process.poll() is None, f"the dispatcher exited: {log_path.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"not within {timeout_s}s: {what}"
        time.sleep(0.2)


def _rename(database: str, to: str) -> None:
    with psycopg.connect(POSTGRES_ADMIN, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (database,))
        admin.execute(f'ALTER DATABASE "{database}" RENAME TO "{to}"')


@pytest.mark.slow  # fault injection (the database renamed away), ~11 s: run in CI
@pytest.mark.parametrize("settings", ["postgresql"], indirect=True)
def test_the_dispatcher_outlives_a_database_that_goes_away_and_dispatches_once_it_answers(
        settings: Settings, redis_client: redis.Redis, owner, tmp_path) -> None:
    """Routes and silences are read from the database at each decision: while it is away the dispatcher waits
    (logged), it does not exit, and what was written meanwhile is dispatched once it answers again."""
    sid = _subscription(settings, redis_client, owner)
    _silence(settings, owner, ("key", "=", "HELD"))
    database = settings.database_url.rsplit("/", 1)[1]
    log_path = tmp_path / "dispatcher.log"
    process = spawn("dispatcher", python_module("notifier.dispatcher"), log_path, env=settings.to_env())
    away = False
    try:
        RedisAlertSink(settings).write([_transition(sid, "AAPL", "firing", T)])
        _wait(lambda: _queued(settings, redis_client), "the first alert dispatched", process, log_path)
        _rename(database, f"{database}_away")
        away = True
        RedisAlertSink(settings).write([_transition(sid, "MSFT", "firing", T + 60_000),
                                        _transition(sid, "HELD", "firing", T + 60_000)])
        _wait(lambda: "database_unavailable" in log_path.read_text(), "a log line", process, log_path)
        time.sleep(1.5)
        assert process.process.poll() is None, log_path.read_text()[-3000:]  # still there, waiting
        _rename(f"{database}_away", database)
        away = False
        _wait(lambda: len(_queued(settings, redis_client)) == 2, "the alert written meanwhile", process, log_path)
    finally:
        process.stop()
        if away:
            _rename(f"{database}_away", database)
    assert _queued(settings, redis_client) == [(sid, "firing", ("AAPL",), False), (sid, "firing", ("MSFT",), False)]
    assert [k for k, *_ in _suppressions(redis_client, settings, sid)] == ["HELD"]


def test_one_silence_saved_compiles_that_one_not_every_silence_of_its_owner() -> None:
    """Compiling is the costly part (RE2 builds a program per pattern); an owner saving silences again and again
    must not make the dispatcher recompile all of them each time."""
    rules = {7: [SilenceRule(i, 7, 0.0, 1e12, (("key", "=~", f"K{i}.+"),)) for i in range(1, 4)]}
    cache = SilenceCache(0.0, lambda _s, owners, _n: {o: list(rules[o]) for o in owners})
    cache.refresh(None, {7})  # type: ignore[arg-type]
    before = cache._owners[7].silences
    rules[7] = [*rules[7][1:], SilenceRule(9, 7, 0.0, 1e12, (("key", "=", "NEW"),))]  # #1 expired, #9 saved
    cache.refresh(None, {7})  # type: ignore[arg-type]
    after = cache._owners[7].silences
    assert [s.id for s in after] == [2, 3, 9]
    assert after[0] is before[1] and after[1] is before[2]  # reused as compiled
    assert cache.silencing(ROUTE, "NEW", time.time()) == 9 and cache.silencing(ROUTE, "K1x", time.time()) is None
