"""What a subscription change costs with versioned catalog diffs, against publishing the whole catalog.

    python benchmarks/catalog.py            # 100,000 subscriptions, 100 changes/s (a few minutes)
    python benchmarks/catalog.py --quick    # smoke run (seconds)

Runs its own Redis and SQLite database. Three tables:

- publishing: one subscription edit through ``SubscriptionService.update`` (commit, then
  publication), ms and Redis bytes per change, before (every change re-reads every active
  subscription and publishes the whole snapshot) and after (the change alone; the snapshot
  rewritten every ``catalog_snapshot_every`` changes, its cost shown amortised);
- readers: a worker catching up on the changes of one poll (``refresh_s``) at the given rate,
  before (decode the whole snapshot) and after (the changes after its version), per poll and
  per change; and a new reader (snapshot + log);
- shard: ``ShardEvaluator.step`` over a synthetic stream, ms per batch with a fixed catalog and
  with the given rate of changes applied between batches (one batch per second of events).

Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import redis
from sqlalchemy import insert

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.report import add_markdown_option, markdown_run, table
from core.catalog_log import CatalogLog
from core.redis_schema import RedisKeys
from core.settings import Settings
from devstack.services import free_port, start_redis
from evaluator.catalog import Catalog, CatalogChange
from evaluator.panerows import PaneRows
from evaluator.shard import ShardConfig, ShardEvaluator
from evaluator.spark.catalog_source import caught_up
from evaluator.spec import SubscriptionSpec
from subscriptions.accounts import AccountService
from subscriptions.db import session_factory
from subscriptions.language import format_condition, parse_condition
from subscriptions.models import CatalogVersion, Subscription
from subscriptions.schemas import SubscriptionIn
from subscriptions.service import CatalogPublisher, SubscriptionService

ATTRS = ("price", "volume")
PANE_MS = 1_000
TEMPLATES = ("SUM(volume) OVER {w}s > {t}", "COUNT(*) OVER {w}s >= {c}", "MAX(price) OVER {w}s > {p}",
             "MIN(price) OVER {w}s < {p}", "AVG(price) OVER {w}s > {p}")
WINDOWS_S = (10, 30, 60, 300)
REFRESH_S = 0.2  # how often a worker's CatalogSource looks for changes


def condition_text(rng: random.Random) -> str:
    return rng.choice(TEMPLATES).format(w=rng.choice(WINDOWS_S), t=rng.randint(1, 400) * 1_000,
                                        c=rng.randint(2, 200), p=rng.randint(50, 150))


def watched_keys(rng: random.Random, keys: int) -> list[str] | None:
    """Most subscriptions name a few keys; one in a hundred watches every key."""
    return None if rng.random() < 0.01 else sorted({f"K{rng.randrange(keys)}" for _ in range(rng.randint(1, 3))})


def spec(rng: random.Random, sid: int, keys: int) -> SubscriptionSpec:
    named = watched_keys(rng, keys)
    return SubscriptionSpec(sid, parse_condition(condition_text(rng)), frozenset(named) if named else None)


class Diffs(CatalogPublisher):
    """Publication as it is, timed apart from the request's own database work."""

    publishing_s = 0.0

    def publish_change(self, change: CatalogChange) -> None:
        started = time.perf_counter()
        self.publish_now(change)
        Diffs.publishing_s += time.perf_counter() - started

    def publish_now(self, change: CatalogChange) -> None:
        super().publish_change(change)


class FullSnapshots(Diffs):
    """Publication as it was: every change re-reads every active subscription and publishes them all."""

    def publish_now(self, change: CatalogChange) -> None:
        self.publish(self.catalog(change.version))


def timed(fn: Callable[[], object], repeat: int) -> float:
    """Mean ms of ``fn``."""
    started = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - started) * 1_000 / repeat


def populate(settings: Settings, n: int, keys: int, rng: random.Random) -> tuple[object, list[int]]:
    """``n`` active subscriptions of one user, inserted in bulk, and the catalog published whole."""
    with session_factory(settings.database_url)() as session:
        user = AccountService(session, settings).sign_up("bench@example.com", "benchmark password")
    rows = []
    for _ in range(n):
        condition = parse_condition(condition_text(rng))
        rows.append({"owner_id": user.id, "name": "bench", "condition": format_condition(condition),
                     "condition_spec": condition.to_dict(), "keys": watched_keys(rng, keys), "active": True,
                     "policy": {}})
    with session_factory(settings.database_url)() as session:
        for first in range(0, n, 10_000):
            session.execute(insert(Subscription), rows[first:first + 10_000])
        session.add(CatalogVersion(id=1, version=0))
        session.commit()
        ids = [sid for (sid,) in session.query(Subscription.id).all()]
        client = redis.Redis.from_url(settings.redis_url)
        CatalogPublisher(session, settings, client).resnapshot()
    return user, ids


def publishing(settings: Settings, user: object, ids: list[int], changes: int, rng: random.Random,
               keys: int) -> list[list[object]]:
    client = redis.Redis.from_url(settings.redis_url)
    rows = []
    for name, publisher, count in (("before: whole snapshot", FullSnapshots, max(2, changes // 50)),
                                   ("after: diff", Diffs, changes)):
        Diffs.publishing_s = 0.0
        before_bytes = client.info("stats")["total_net_input_bytes"]
        with session_factory(settings.database_url)() as session:
            service = SubscriptionService(session, settings, client, user)  # type: ignore[arg-type]
            service.catalogs = publisher(session, settings, client)

            def edit(service: SubscriptionService = service) -> None:
                service.update(rng.choice(ids), SubscriptionIn(name="bench", condition=condition_text(rng),
                                                               keys=watched_keys(rng, keys)))

            ms = timed(edit, count)
        sent = (client.info("stats")["total_net_input_bytes"] - before_bytes) / count
        rows.append([name, count, ms, Diffs.publishing_s * 1_000 / count, sent / 1_000])
    return rows


def rewriting(settings: Settings, diff: list) -> list[list[object]]:
    """The snapshot rewrite (old snapshot + log, no database read), alone and amortised over the changes."""
    client = redis.Redis.from_url(settings.redis_url)
    with session_factory(settings.database_url)() as session:
        snapshot_ms = timed(CatalogPublisher(session, settings, client).rewrite_snapshot, 1)
    snapshot_kb = client.strlen(RedisKeys(settings).catalog_snapshot) / 1_000
    every = settings.catalog_snapshot_every
    return [[f"snapshot rewrite (every {every:,} changes)", 1, snapshot_ms, snapshot_ms, snapshot_kb],
            ["after, amortised", "", diff[2] + snapshot_ms / every, diff[3] + snapshot_ms / every,
             diff[4] + snapshot_kb / every]]


def readers(settings: Settings, per_poll: int, polls: int) -> list[list[object]]:
    """A reader polling once per ``refresh_s``, ``per_poll`` changes having arrived since its last look."""
    client = redis.Redis.from_url(settings.redis_url)
    log = CatalogLog(client, RedisKeys(settings))
    keep = settings.catalog_snapshot_every
    full = log.read_with_snapshot()
    base = Catalog.decode(full.snapshot) if full.snapshot else Catalog.empty()
    start = base.brought_forward([e for e in full.entries if e[0] <= full.version - per_poll * polls], keep)
    catalog, polled = start, 0
    started = time.perf_counter()
    while catalog.version < full.version:
        catalog = catalog.brought_forward(log.read(after=catalog.version).entries[:per_poll], keep)
        polled += 1
    per_poll_ms = (time.perf_counter() - started) * 1_000 / max(polled, 1)
    per_change = max(catalog.version - start.version, 1) / max(polled, 1)
    decode_ms = timed(lambda: Catalog.decode(full.snapshot or b"{}"), 3)
    new_ms = timed(lambda: caught_up(log, Catalog.empty(), keep), 3)
    return [["before: decode the whole snapshot", decode_ms, decode_ms / per_poll],
            [f"after: {per_change:.0f} changes from the log", per_poll_ms, per_poll_ms / per_change],
            [f"a new reader (snapshot + {len(full.entries)} changes)", new_ms, ""]]


def applying(n: int, keys: int, changes: int, seed: int) -> list[list[object]]:
    """``Catalog.applied`` per change, against rebuilding the catalog from its specs (what a version cost before)."""
    rng = random.Random(seed)
    catalog = Catalog(1, tuple(spec(rng, sid, keys) for sid in range(1, n + 1)))
    changes = max(changes, 3_000)  # enough for the overlay to be folded into new bases several times
    diffs = [CatalogChange(2 + j, (spec(rng, rng.randint(1, n), keys),)) for j in range(changes)]

    def apply_all() -> None:
        latest = catalog
        for diff in diffs:
            latest = latest.applied(diff)

    diff_ms = timed(apply_all, 1) / changes
    rebuild_ms = timed(lambda: Catalog(2, catalog.subscriptions[1:]).for_key("K0"), 3)
    return [["before: rebuild (specs by id, key index)", rebuild_ms], ["after: Catalog.applied", diff_ms]]


def stream(keys: int, events: int, second: int, rng: np.random.Generator) -> PaneRows:
    """One second of events (one pane per key that has any), built with NumPy."""
    key_ids = np.sort(rng.integers(0, keys, events))
    ts = second * PANE_MS + rng.integers(0, PANE_MS, events)
    values = np.vstack([rng.normal(100, 20, events), rng.integers(1, 1_000, events).astype(np.float64)])
    starts_at = np.flatnonzero(np.r_[True, key_ids[1:] != key_ids[:-1]])
    counts = np.diff(np.r_[starts_at, events])
    return PaneRows(np.array([f"K{k}" for k in key_ids[starts_at]], dtype=object),
                    np.full(starts_at.size, second * PANE_MS, dtype=np.int64), counts.astype(np.int64),
                    np.add.reduceat(values, starts_at, axis=1), np.minimum.reduceat(values, starts_at, axis=1),
                    np.maximum.reduceat(values, starts_at, axis=1), np.r_[starts_at, events].astype(np.int64),
                    ts, values)


def shard(n: int, keys: int, events: int, batches: int, rate: int, seed: int) -> list[list[object]]:
    """ms per batch of one shard with a fixed catalog and of a twin with ``rate`` changes applied between batches.

    The twins step the same rows in turn, so the machine's other load falls on both alike.
    """
    rng = random.Random(seed)
    specs = tuple(spec(rng, sid, keys) for sid in range(1, n + 1))
    config = ShardConfig(ATTRS, PANE_MS, max(WINDOWS_S) * 1_000, 0, 1)
    numbers = np.random.default_rng(seed)
    fixed = changing = Catalog(1, specs)
    next_id, live = n + 1, [s.id for s in specs]
    twins = (ShardEvaluator(config), ShardEvaluator(config))
    first = stream(keys, events, 0, numbers)
    for evaluator in twins:
        evaluator.step(first, {0: PANE_MS}, fixed)  # the first evaluation: every group
    step_ms: tuple[list[float], list[float]] = ([], [])
    apply_ms = []
    for second in range(1, batches + 1):
        changes: list[CatalogChange] = []
        for _ in range(rate):  # 60 % edits, 20 % new subscriptions, 20 % deletions or pauses
            i, kind, version = rng.randrange(len(live)), rng.random(), changing.version + 1 + len(changes)
            if kind < 0.6:
                change = CatalogChange(version, (spec(rng, live[i], keys),))
            elif kind < 0.8:
                change, next_id = CatalogChange(version, (spec(rng, next_id, keys),)), next_id + 1
                live.append(next_id - 1)
            else:
                change = CatalogChange(version, removals=(live[i],))
                live[i] = live[-1]
                live.pop()
            changes.append(change)
        started = time.perf_counter()
        for change in changes:
            changing = changing.applied(change)
        apply_ms.append((time.perf_counter() - started) * 1_000)
        rows_in = stream(keys, events, second, numbers)
        for evaluator, catalog, times in zip(twins, (fixed, changing), step_ms, strict=True):
            started = time.perf_counter()
            evaluator.step(rows_in, {0: (second + 1) * PANE_MS}, catalog)
            times.append((time.perf_counter() - started) * 1_000)
    return [[label, batches, float(np.median(times)), float(np.mean(times)), float(np.max(times)), applying]
            for label, times, applying in (("fixed catalog", step_ms[0], 0.0),
                                           (f"{rate} changes/s", step_ms[1], float(np.mean(apply_ms))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: small sizes")
    parser.add_argument("--subscriptions", type=int, default=100_000)
    parser.add_argument("--rate", type=int, default=100, help="subscription changes per second")
    parser.add_argument("--keys", type=int, default=5_000)
    parser.add_argument("--events", type=int, default=20_000, help="events per batch (one second)")
    parser.add_argument("--batches", type=int, default=10, help="shard batches timed per catalog")
    parser.add_argument("--shard-subscriptions", type=int, help="subscriptions in the shard table (default: all)")
    parser.add_argument("--changes", type=int, default=300, help="changes timed on the publishing side")
    add_markdown_option(parser)
    args = parser.parse_args()
    if args.quick:
        args.subscriptions, args.rate, args.keys, args.events, args.batches, args.changes = 2_000, 20, 200, 2_000, 3, 40
    rng = random.Random(14)
    with tempfile.TemporaryDirectory(prefix="tocsin-catalog-bench-") as work_dir:
        work = Path(work_dir)
        port = free_port()
        server = start_redis(port, work / "redis", work / "redis.log")
        try:
            settings = Settings(redis_url=f"redis://127.0.0.1:{port}/0", redis_prefix="bench",
                                database_url=f"sqlite:///{work}/db.sqlite", data_dir=work / "var")
            started = time.perf_counter()
            user, ids = populate(settings, args.subscriptions, args.keys, rng)
            print(f"{args.subscriptions:,} subscriptions stored and published in {time.perf_counter() - started:.1f} s")
            published = publishing(settings, user, ids, args.changes, rng, args.keys)
            per_poll = max(1, round(args.rate * REFRESH_S))
            read = readers(settings, per_poll, polls=min(5, args.changes // per_poll))
            published += rewriting(settings, published[1])
            table(f"Publishing one change, {args.subscriptions:,} subscriptions (SubscriptionService.update)",
                  ["how", "changes", "ms/change", "of which publishing", "KB to Redis/change"], published)
            table(f"A reader catching up, {args.rate} changes/s, polled every {REFRESH_S} s",
                  ["how", "ms/poll", "ms/change"], read)
            table(f"Applying one change to a catalog of {args.subscriptions:,} subscriptions",
                  ["how", "ms/change"], applying(args.subscriptions, args.keys, args.changes, seed=14))
        finally:
            server.stop()
    n = args.shard_subscriptions or args.subscriptions
    table(f"Shard: {n:,} subscriptions, {args.keys:,} keys, {args.events:,} events per batch",
          ["catalog", "batches", "median ms/batch", "mean ms/batch", "max ms/batch", "ms applying changes"],
          shard(n, args.keys, args.events, args.batches, args.rate, seed=14))


if __name__ == "__main__":
    with markdown_run():
        main()
