"""The 'catalog' dead man's switch when workers disagree, restart or are gone: one worker that is past a change
must not hide that another is still stuck behind it, and a mark left by workers that are gone must not fire.
Real Redis; two readers stand for two Spark Python workers."""

from __future__ import annotations

import time

import redis

from core.evaluator_status import CATALOG_STUCK, CATALOG_STUCK_SINCE
from core.redis_schema import RedisKeys
from core.settings import Settings
from evaluator.catalog import Catalog, CatalogChange
from evaluator.spark.catalog_source import CatalogSource, Reach
from tests.evaluator.test_catalog_poison import _spec
from web.ops import collect_sample
from web.watchdog import catalog


def _firing(settings: Settings, now: float) -> bool:
    sample = collect_sample(settings, redis.Redis.from_url(settings.redis_url, decode_responses=True), None)
    return catalog([sample], settings, now).firing


def test_a_worker_past_a_change_cannot_hide_one_still_stuck_behind_it(settings: Settings) -> None:
    client = redis.Redis.from_url(settings.redis_url)
    keys = RedisKeys(settings)
    client.xadd(keys.catalog_changes, {"c": CatalogChange(1, (_spec(1),)).encode()}, id="1-0")
    client.set(keys.catalog_version, 1)
    stuck = CatalogSource(settings, refresh_s=0, reassert_s=0.5)
    assert stuck.current().version == 1
    client.xadd(keys.catalog_changes, {"c": b"\x00written by a newer web app"}, id="2-0")
    client.set(keys.catalog_version, 2)
    assert stuck.current().version == 1
    since = float(client.hget(keys.evaluator_stats, CATALOG_STUCK_SINCE))

    # A worker of the newer version decodes it: its first view is 'past', and the mark is kept fresh by the other.
    newer = CatalogSource(settings, refresh_s=0)
    newer._report(Reach(Catalog(2, (_spec(1), _spec(2))), 2))
    assert float(client.hget(keys.evaluator_stats, CATALOG_STUCK_SINCE)) == since
    # One that was stuck too and then got past clears it, but the stuck one writes it back, with its own start.
    newer._report(Reach(Catalog(1, (_spec(1),)), 2, "stuck as well"))
    newer._report(Reach(Catalog(2, (_spec(1), _spec(2))), 2))
    assert not client.hexists(keys.evaluator_stats, CATALOG_STUCK)
    time.sleep(0.5)
    stuck.current()
    assert float(client.hget(keys.evaluator_stats, CATALOG_STUCK_SINCE)) == since
    assert _firing(settings, since + settings.watchdog_catalog_s + 1)


def test_a_mark_left_by_workers_that_are_gone_does_not_fire_and_a_new_worker_clears_it(settings: Settings) -> None:
    client = redis.Redis.from_url(settings.redis_url)
    keys = RedisKeys(settings)
    gone = CatalogSource(settings, refresh_s=0, reassert_s=1.0)
    gone._report(Reach(Catalog(1, (_spec(1),)), 2, "the change log stops at version 1 of 2"))
    since = float(client.hget(keys.evaluator_stats, CATALOG_STUCK_SINCE))
    assert _firing(settings, since + settings.watchdog_catalog_s + 1)  # rewritten every second: still there
    assert not _firing(settings, since + 2 * settings.watchdog_catalog_s + 1)  # nobody rewrote it: gone

    # A worker of a restarted job that is past it clears it at once (no stuck worker keeps it fresh).
    client.hset(keys.evaluator_stats, CATALOG_STUCK,
                '{"held": 1, "published": 2, "problem": "x", "seen_at": 1.0, "every_s": 1.0}')  # long ago
    CatalogSource(settings, refresh_s=0)._report(Reach(Catalog(2, (_spec(1), _spec(2))), 2))
    assert not client.hexists(keys.evaluator_stats, CATALOG_STUCK_SINCE)
