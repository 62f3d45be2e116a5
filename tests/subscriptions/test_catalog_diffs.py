"""Catalog diffs through a real Redis: every reader holds exactly the catalog the database held at its version.

Whatever happens between commit and publication: writers publishing out of order, a
writer dying before it publishes, Redis losing its data, the web app starting again,
readers starting late or falling behind the change log.
"""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path

import pytest
import redis
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from core.catalog_log import CatalogLog
from core.redis_schema import RedisKeys
from core.settings import Settings
from evaluator.catalog import Catalog, CatalogChange
from evaluator.spark.catalog_source import caught_up
from evaluator.spec import SubscriptionSpec
from subscriptions.db import session_factory
from subscriptions.models import CatalogVersion
from subscriptions.schemas import SubscriptionIn
from subscriptions.service import CatalogPublisher, SubscriptionService
from tests.examples import examples
from tests.users import new_user

CONDITIONS = ("COUNT(*) OVER 1m >= 2", "SUM(volume) OVER 5m > 2e6", "MAX(price) OVER 30s < 10")
_examples = itertools.count()


class World:
    """One deployment (its own database and Redis keys) with writers whose publication the test schedules."""

    def __init__(self, template: Settings, directory: Path, **overrides: object) -> None:
        n = next(_examples)
        self.settings = template.model_copy(update={
            "database_url": f"sqlite:///{directory / f'catalog{n}.db'}", "redis_prefix": f"{template.redis_prefix}c{n}",
            "deployment_id": None, **overrides})
        self.user, _ = new_user(self.settings)
        self.redis = redis.Redis.from_url(self.settings.redis_url)
        self.keys = RedisKeys(self.settings)
        self.sessions = session_factory(self.settings.database_url)
        self.ids: list[int] = []
        self.pending: list[CatalogChange] = []  # committed, not yet published
        self.states: dict[int, dict[int, SubscriptionSpec]] = {0: {}}  # what the database held at each version

    def change(self, act: str, pick: int, active: bool, condition: int, keys: list[str] | None) -> None:
        """One request: commit a change; its publication is held back (see ``publish``)."""
        with self.sessions() as session:
            service = SubscriptionService(session, self.settings, self.redis, self.user)
            service.catalogs.publish_change = self.pending.append  # type: ignore[method-assign]
            data = SubscriptionIn(name="s", condition=CONDITIONS[condition], keys=keys, active=active)
            if act == "create" or not self.ids:
                self.ids.append(service.create(data).id)
            else:
                sid = self.ids[pick % len(self.ids)]
                if act == "update":
                    service.update(sid, data)
                elif act == "delete":
                    service.delete(sid)
                    self.ids.remove(sid)
                else:
                    service.set_active(sid, act == "resume")

    def publisher(self, session: object) -> CatalogPublisher:
        return CatalogPublisher(session, self.settings, self.redis)  # type: ignore[arg-type]

    def publish(self, pick: int) -> None:
        with self.sessions() as session:
            self.publisher(session).publish_change(self.pending.pop(pick % len(self.pending)))

    def restart(self) -> None:
        """The web app starts: it republishes what Redis lacks."""
        with self.sessions() as session:
            self.publisher(session).republish()

    def flush(self) -> None:
        self.redis.delete(self.keys.catalog_version, self.keys.catalog_changes, self.keys.catalog_snapshot,
                          self.keys.catalog_snapshot_version)

    def record(self) -> None:
        """The database's catalog at its version (each step makes at most one version)."""
        with self.sessions() as session:
            row = session.get(CatalogVersion, 1)
            version = row.version if row else 0
            if version not in self.states:
                self.states[version] = {s.id: s for s in self.publisher(session).catalog(version).subscriptions}

    def read(self, catalog: Catalog) -> Catalog:
        log = CatalogLog(self.redis, self.keys)
        return caught_up(log, catalog, self.settings.catalog_snapshot_every)


def holds(catalog: Catalog) -> dict[int, SubscriptionSpec]:
    return {s.id: s for s in catalog.subscriptions}


keys = st.none() | st.lists(st.sampled_from(["A", "B", "C"]), min_size=1, max_size=2, unique=True)
steps = st.lists(st.one_of(
    st.tuples(st.sampled_from(["create", "update", "pause", "resume", "delete"]), st.integers(0, 20), st.booleans(),
              st.integers(0, len(CONDITIONS) - 1), keys),
    st.tuples(st.sampled_from(["publish", "lose", "read"]), st.integers(0, 20)),
    st.tuples(st.sampled_from(["flush", "restart"])),
), max_size=40)


@pytest.mark.parametrize("snapshot_every", [2, 1_000])
def test_readers_hold_exactly_what_the_database_held(settings: Settings, tmp_path: Path, snapshot_every: int) -> None:
    @hypothesis_settings(max_examples=examples(20), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(steps=steps)
    def run(steps: list[tuple]) -> None:
        world = World(settings, tmp_path, catalog_snapshot_every=snapshot_every, catalog_gap_wait_s=0.0)
        readers: list[Catalog] = []
        for step in steps:
            act = step[0]
            if act in ("create", "update", "pause", "resume", "delete"):
                world.change(*step)
            elif act == "publish" and world.pending:
                world.publish(step[1])
            elif act == "lose" and world.pending:  # the writer died between commit and publication
                world.pending.pop(step[1] % len(world.pending))
            elif act == "flush":
                world.flush()
            elif act == "restart":
                world.restart()
            elif act == "read":
                i = step[1] % (len(readers) + 1)
                if i == len(readers):
                    readers.append(Catalog.empty())  # a reader that starts late
                readers[i] = world.read(readers[i])
            world.record()
            for reader in readers:
                assert holds(reader) == world.states[reader.version], f"reader at {reader.version}"
        for change in reversed(world.pending):  # the last writers publish, out of order
            world.pending.remove(change)
            with world.sessions() as session:
                world.publisher(session).publish_change(change)
            world.record()
        world.change("create", 0, True, 0, None)  # the next change alone heals lost changes and a flushed Redis
        world.publish(0)
        world.record()
        newest = max(world.states)
        for reader in [*readers, Catalog.empty()]:
            reader = world.read(reader)
            assert reader.version == newest and holds(reader) == world.states[newest]
        world.flush()
        world.restart()  # and so does a start-up
        world.record()
        newest = max(world.states)
        for reader in [*readers, Catalog.empty()]:
            reader = world.read(reader)
            assert reader.version == newest and holds(reader) == world.states[newest]

    run()


def test_a_change_waits_for_its_late_predecessor_instead_of_publishing_everything(settings: Settings,
                                                                                   tmp_path: Path) -> None:
    world = World(settings, tmp_path, catalog_gap_wait_s=2.0)
    for _ in range(3):
        world.change("create", 0, True, 0, None)
    first, second, third = world.pending
    world.publish(0)  # v1
    world.pending.remove(third)
    late = threading.Timer(0.2, world.publish, args=(0,))  # v2, after v3 started waiting
    late.start()
    started = time.monotonic()
    with world.sessions() as session:
        world.publisher(session).publish_change(third)  # v3 waits for v2
    late.join()
    assert world.pending == []
    assert 0.15 < time.monotonic() - started < 2.0
    log = CatalogLog(world.redis, world.keys)
    read = log.read_with_snapshot()
    assert read.snapshot is None and [v for v, _ in read.entries] == [1, 2, 3]
    assert holds(world.read(Catalog.empty())) == {s.id: s for s in (*first.upserts, *second.upserts, *third.upserts)}


def test_a_change_that_finds_its_predecessor_lost_publishes_the_database(settings: Settings, tmp_path: Path) -> None:
    world = World(settings, tmp_path, catalog_gap_wait_s=0.05)
    world.change("create", 0, True, 0, None)
    world.change("create", 0, True, 1, ["A"])
    world.pending.pop(0)  # v1's writer died
    world.publish(0)
    world.record()
    read = CatalogLog(world.redis, world.keys).read_with_snapshot()
    assert read.snapshot_version == read.version == 3 and read.entries == []  # v2 could not be appended: v3 whole
    assert holds(world.read(Catalog.empty())) == world.states[3] and len(world.states[3]) == 2


def test_the_snapshot_is_rewritten_every_n_changes_and_the_log_stays_bounded(settings: Settings,
                                                                             tmp_path: Path) -> None:
    world = World(settings, tmp_path, catalog_snapshot_every=5)
    for n in range(23):
        world.change("create", 0, True, n % len(CONDITIONS), None)
        world.publish(0)
    log = CatalogLog(world.redis, world.keys)
    read = log.read_with_snapshot()
    assert read.version == 23 and read.snapshot_version == 20 and [v for v, _ in read.entries] == [21, 22, 23]
    assert world.redis.xlen(world.keys.catalog_changes) <= 2 * 5
    assert Catalog.decode(read.snapshot or b"").version == 20
    lagging = world.read(Catalog.empty())
    assert lagging.version == 23 and len(lagging.subscriptions) == 23
