"""A change-log entry no reader can decode must not stop evaluation: readers keep the last catalog they could read."""

from __future__ import annotations

import pytest
import redis

from core.catalog_log import CatalogLog
from core.evaluator_status import CATALOG_STUCK, CATALOG_STUCK_SINCE
from core.redis_schema import RedisKeys
from core.settings import Settings
from evaluator.catalog import Catalog, CatalogChange
from evaluator.spark.catalog_source import CatalogSource, caught_up
from evaluator.spec import Aggregate, Condition, SubscriptionSpec


def _spec(i: int) -> SubscriptionSpec:
    return SubscriptionSpec(i, Condition(Aggregate.COUNT, None, 60_000, low=float(i)))


def test_an_undecodable_change_is_never_applied_and_raises_nothing(settings: Settings) -> None:
    client = redis.Redis.from_url(settings.redis_url)
    keys = RedisKeys(settings)
    catalog_log = CatalogLog(client, keys)
    client.xadd(keys.catalog_changes, {"c": CatalogChange(1, (_spec(1),)).encode()}, id="1-0")
    client.set(keys.catalog_version, 1)
    held = caught_up(catalog_log, Catalog.empty(), keep=100)
    assert held.version == 1 and [s.id for s in held.subscriptions] == [1]

    client.xadd(keys.catalog_changes, {"c": b"\x00not a change"}, id="2-0")
    client.xadd(keys.catalog_changes, {"c": CatalogChange(3, (_spec(3),)).encode()}, id="3-0")
    client.set(keys.catalog_version, 3)
    for _ in range(2):  # every later poll keeps the last catalog it could read, and raises nothing
        assert caught_up(catalog_log, held, keep=100) is held
    client.set(keys.catalog_snapshot_version, 3)
    client.set(keys.catalog_snapshot, b"\x00not a snapshot")  # nor does a snapshot it cannot read
    assert caught_up(catalog_log, held, keep=100) is held


def test_brought_forward_stops_before_an_undecodable_entry() -> None:
    good = CatalogChange(1, (_spec(1),)).encode()
    for bad in (b"", b"garbage", b"{}", b'{"version": 2, "upserts": [{"id": "x"}]}'):
        caught = Catalog.empty().brought_forward([(1, good), (2, bad), (3, CatalogChange(3, (_spec(3),)).encode())])
        assert caught.version == 1 and [s.id for s in caught.subscriptions] == [1]


def test_a_reader_stuck_behind_an_undecodable_change_tells_the_dead_mans_switch_and_clears_it_once_past(
        settings: Settings) -> None:
    from web.ops import collect_sample
    from web.watchdog import evaluate
    client = redis.Redis.from_url(settings.redis_url)
    keys = RedisKeys(settings)
    client.xadd(keys.catalog_changes, {"c": CatalogChange(1, (_spec(1),)).encode()}, id="1-0")
    client.set(keys.catalog_version, 1)
    source = CatalogSource(settings, refresh_s=0)
    assert source.current().version == 1
    assert not client.hexists(keys.evaluator_stats, CATALOG_STUCK_SINCE)

    client.xadd(keys.catalog_changes, {"c": b"\x00not a change"}, id="2-0")
    client.set(keys.catalog_version, 2)
    assert source.current().version == 1  # evaluation goes on with what it holds ...
    since = float(client.hget(keys.evaluator_stats, CATALOG_STUCK_SINCE))  # ... and the operators will know
    text = redis.Redis.from_url(settings.redis_url, decode_responses=True)  # as the web app reads
    sample = collect_sample(settings, text, None)
    assert sample["catalog_stuck"]["held"] == 1 and sample["catalog_stuck"]["published"] == 2
    status = evaluate([sample], [], settings, since + settings.watchdog_catalog_s + 1)["catalog"]
    assert status.firing and status.since == since and "version 1 of 2" in status.detail
    source.current()  # still stuck: the start is kept
    assert float(client.hget(keys.evaluator_stats, CATALOG_STUCK_SINCE)) == since

    client.set(keys.catalog_snapshot, Catalog(2, (_spec(1), _spec(2))).encode())  # a republish repairs it
    client.set(keys.catalog_snapshot_version, 2)
    assert source.current().version == 2
    assert not client.hexists(keys.evaluator_stats, CATALOG_STUCK_SINCE)
    assert not client.hexists(keys.evaluator_stats, CATALOG_STUCK)
    assert not evaluate([collect_sample(settings, text, None)], [], settings, since + 10_000)["catalog"].firing


def test_republish_catalog_moves_a_stuck_reader_past_an_undecodable_change(settings: Settings,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from subscriptions import admin
    from subscriptions.db import session_factory
    from subscriptions.models import Subscription
    from subscriptions.service import CatalogPublisher
    from tests.users import new_user
    monkeypatch.setattr(admin, "get_settings", lambda: settings)
    client = redis.Redis.from_url(settings.redis_url)
    keys = RedisKeys(settings)
    owner, _ = new_user(settings)
    with session_factory(settings.database_url)() as session:
        row = Subscription(owner_id=owner.id, name="n", condition="COUNT(*) OVER 1m > 1",
                           condition_spec=_spec(1).condition.to_dict(), keys=None, policy={})
        session.add(row)
        session.flush()
        CatalogPublisher(session, settings, client).commit_change(row)
        sid = row.id
    source = CatalogSource(settings, refresh_s=0)
    held = source.current()
    assert [s.id for s in held.subscriptions] == [sid]
    client.xadd(keys.catalog_changes, {"c": b"\x00written by a newer web app"}, id=f"{held.version + 1}-0")
    client.set(keys.catalog_version, held.version + 1)
    assert source.current() is held and client.hexists(keys.evaluator_stats, CATALOG_STUCK_SINCE)

    assert admin.main(["republish-catalog"]) == 0
    reached = source.current()
    assert reached.version > held.version + 1 and [s.id for s in reached.subscriptions] == [sid]
    assert not client.hexists(keys.evaluator_stats, CATALOG_STUCK_SINCE)
