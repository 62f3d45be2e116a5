"""One evaluator shard without Spark: ms per boundary by plan, at high selectivity, and under key churn.

    python benchmarks/shard.py            # full run (several minutes)
    python benchmarks/shard.py --quick    # smoke run

High selectivity: 5,000 Zipf keys over 5 shards (this shard holds the ~1,000 keys hashed to it and
their events, as in the pipeline), 1 s panes, 5-minute horizon, windows of 1 and 5 minutes,
a mix of COUNT / SUM / AVG / MAX / MIN conditions, BETWEEN ranges and key-restricted
subscriptions whose thresholds are drawn around the 92nd (or 8th) percentile of the
values, so ~8 % of (subscription, key) pairs match. The shard is warmed up over the
horizon, the catalog arrives, and then boundaries are timed: the incremental plan (the
default), the index plan (every group by collective index lookups, each boundary in full)
and naive (every subscription on every key), the last two started from a snapshot of the
warmed shard. Catching up: a copy that replays missed deltas (a Spark worker whose cached
shard is behind) against one that evaluated them. Key churn: keys live a few seconds, ~1M distinct keys over the run with
~5k in the horizon at a time; memory and ms per boundary early vs late. Baselines: conditions comparing a key's
1-minute aggregates with its own 5-minute ones, incremental against naive. Ranks: IN TOP / BOTTOM k, the shard's
books against ranking from scratch, and the sink's merge. The pipeline's mix: the pipeline benchmark's drain
(``benchmarks/pipeline.py``: its 10,000 subscriptions, 20,000 events per event-second) in one of its two shards,
the evaluation alone (``--pipeline-mix-only``).

Nothing here asserts a time; numbers are read.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.report import add_markdown_option, markdown_run, table
from core import cli
from core.gc_policy import apply_gc_policy
from core.settings import Settings
from evaluator.catalog import Catalog
from evaluator.panerows import PaneRows
from evaluator.rank import RankEntry, RankMerge
from evaluator.shard import BatchStats, Delta, ShardConfig, ShardEvaluator
from evaluator.spec import Aggregate, Condition, SubscriptionSpec
from subscriptions.language import parse_condition

ATTRS = ("price", "volume")
PANE = 1_000
MINUTE = 60_000
SHARDS = 5  # the high-selectivity shard holds one fifth of the keys


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class GcClock:
    """Wall time CPython spends in its garbage collector while installed (``gc.callbacks``), per generation."""

    def __init__(self) -> None:
        self.ms = [0.0, 0.0, 0.0]
        self.runs = [0, 0, 0]
        self._started = 0.0

    def __enter__(self) -> GcClock:
        gc.callbacks.append(self._tick)
        return self

    def __exit__(self, *_: object) -> None:
        gc.callbacks.remove(self._tick)

    def _tick(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.ms[info["generation"]] += 1000 * (time.perf_counter() - self._started)
            self.runs[info["generation"]] += 1


def pane_rows(keys: np.ndarray, ts: np.ndarray, price: np.ndarray, volume: np.ndarray) -> PaneRows:
    """One micro-batch's (key, pane) rows, vectorised, as Spark's pre-aggregation hands them over."""
    starts = ts // PANE * PANE
    order = np.lexsort((ts, keys, starts))
    keys, ts, starts, values = keys[order], ts[order], starts[order], np.vstack([price[order], volume[order]])
    first = np.flatnonzero(np.r_[True, (np.diff(keys) != 0) | (np.diff(starts) != 0)])
    counts = np.diff(np.r_[first, keys.size])
    names = np.array([f"k{k}" for k in keys[first].tolist()], dtype=object)
    return PaneRows(names, starts[first], counts.astype(np.int64), np.add.reduceat(values, first, axis=1),
                    np.minimum.reduceat(values, first, axis=1), np.maximum.reduceat(values, first, axis=1),
                    np.r_[first, keys.size].astype(np.int64), ts.astype(np.int64), values)


class Feed:
    """Events per second over keys ``base + Zipf`` (or a sliding band, for churn), prices per key."""

    def __init__(self, keys: int, per_second: int, seed: int, churn: int = 0, shards: int = 1) -> None:
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.keys, self.per_second, self.churn, self.shards = keys, per_second, churn, shards
        self.base_price = self.rng.lognormal(4, 1, keys)

    def second(self, t: int) -> PaneRows:
        n = self.per_second
        self.rng = np.random.default_rng((self.seed, t))  # each second's data depends on the second only
        if self.churn:  # a band of ``keys`` keys sliding by ``churn`` keys per second
            keys = t // PANE * self.churn + self.rng.integers(0, self.keys, n)
            price = 50 * self.rng.lognormal(0, 0.2, n)
        else:
            keys = (self.rng.zipf(1.3, n) - 1) % self.keys
            price = self.base_price[keys] * self.rng.lognormal(0, 0.1, n)
        mine = keys % self.shards == 0  # the keys of shard 0 (the others' events go elsewhere)
        keys, price, n = keys[mine], price[mine], int(mine.sum())
        ts = t + self.rng.integers(0, PANE, n)
        volume = np.round(self.rng.exponential(10, n), 2)
        return pane_rows(keys.astype(np.int64), ts.astype(np.int64), np.round(price, 2), volume)


def catalog_for(n: int, shard: ShardEvaluator, seed: int) -> Catalog:
    """``n`` subscriptions with thresholds around the 92nd (8th) percentile of the current values: ~8 % match."""
    rng = np.random.default_rng(seed)
    now = shard.evaluated_at - 1  # type: ignore[operator]  # warmed up
    keys = sorted(shard._known())
    kinds = [(Aggregate.COUNT, None), (Aggregate.SUM, "volume"), (Aggregate.AVG, "price"), (Aggregate.MAX, "price"),
             (Aggregate.MIN, "price")]
    samples: dict[tuple, np.ndarray] = {}
    specs = []
    for i in range(n):
        aggregate, attribute = kinds[i % len(kinds)]
        window = (MINUTE, 5 * MINUTE)[(i // len(kinds)) % 2]
        sample = samples.get((aggregate, window))
        if sample is None:
            c = Condition(aggregate, attribute, window, low=0.0)
            picked = rng.choice(keys, min(len(keys), 400), replace=False)
            values = [shard.value(c, k, now) for k in picked]
            sample = samples[(aggregate, window)] = np.array([v for v in values if v is not None])
        shape = rng.random()
        if shape < 0.1:  # a range holding ~8 % of the keys
            lo = rng.uniform(0.5, 0.9)
            low, high = np.quantile(sample, [lo, lo + 0.08])
            condition = Condition(aggregate, attribute, window, low=float(low), high=float(high),
                                  low_inclusive=True, high_inclusive=True)
        elif aggregate is Aggregate.MIN or shape < 0.2:  # below the 8th percentile
            condition = Condition(aggregate, attribute, window, high=float(np.quantile(sample, rng.uniform(0.03, 0.13))))
        else:
            condition = Condition(aggregate, attribute, window, low=float(np.quantile(sample, rng.uniform(0.87, 0.97))))
        restricted = frozenset(rng.choice(keys, 3, replace=False).tolist()) if rng.random() < 0.1 else None
        specs.append(SubscriptionSpec(i + 1, condition, restricted))
    return Catalog(1, tuple(specs))


def run_boundaries(shard: ShardEvaluator, feed: Feed, t: int, boundaries: int, catalog: Catalog,
                   desc: str, clock: Callable[[], float] = time.perf_counter) -> tuple[float, BatchStats, int]:
    """Feed ``boundaries`` seconds; returns ms per boundary (wall time, or ``clock``'s), the stats, and the next
    second."""
    stats, elapsed = BatchStats(), 0.0
    for _ in tqdm(range(boundaries), desc=desc, file=sys.stderr, leave=False):
        rows = feed.second(t)
        started = clock()
        shard.step(rows, {0: t + PANE}, catalog, stats)
        elapsed += clock() - started
        t += PANE
    return 1000 * elapsed / max(stats.boundaries, 1), stats, t


def high_selectivity(sizes: list[int], warm_s: int, measured: int, naive_upto: int, per_second: int) -> None:
    config = ShardConfig(ATTRS, PANE, 5 * MINUTE, 0, 1)
    rows, ratio_rows, per_size = [], [], {}
    for n in sizes:
        feed = Feed(5_000, per_second, seed=7, shards=SHARDS)
        shard, t = ShardEvaluator(config), 1_000_000
        _, _, t = run_boundaries(shard, feed, t, warm_s, Catalog.empty(), f"warm {n:,}")
        catalog = catalog_for(n, shard, seed=11)
        first = time.perf_counter()
        _, stats0, t = run_boundaries(shard, feed, t, 1, catalog, "first")
        first_ms = 1000 * (time.perf_counter() - first)
        warm = shard.snapshot()
        gc.collect()
        ms, stats, _ = run_boundaries(shard, feed, t, measured, catalog, f"incremental {n:,}")  # same seconds as below
        b = max(stats.boundaries, 1)
        matches = sum(len(v) for v in shard.firing.values())
        rows.append([f"{n:,}", "incremental", ms, stats.changed_keys / b, stats.candidates / b, stats.transitions / b,
                     matches, first_ms, rss_mb()])
        per_size[(n, "incremental")] = ms
        plans = [("index", replace(config, plan="index"), 1 if n > naive_upto else max(2, measured // 5))]
        if n <= naive_upto:
            plans.append(("naive", replace(config, collective=False), 1))
        for plan, plan_config, count in plans:
            restored = ShardEvaluator.from_snapshot(plan_config, warm)
            _ = restored.indexes  # built from the store before timing: a running index plan keeps them up to date
            gc.collect()
            ms, stats, _ = run_boundaries(restored, feed, t, count, catalog, f"{plan} {n:,}")
            b = max(stats.boundaries, 1)
            rows.append([f"{n:,}", plan, ms, "", stats.candidates / b, stats.transitions / b,
                         stats.matches / b, "", rss_mb()])
            per_size[(n, plan)] = ms
        del shard
        _ = stats0
    table(f"High selectivity (~8 %), one of {SHARDS} shards of 5,000 Zipf keys, {per_second:,} events/s in all, "
          "1 s panes, windows 1 and 5 min "
          "(ms per boundary)",
          ["subscriptions", "plan", "ms/boundary", "changed keys/b", "candidates/b", "transitions/b", "matches",
           "first eval ms", "RSS MB"], rows)
    small, big = sizes[0], sizes[min(1, len(sizes) - 1)]
    for plan in ("incremental", "index"):
        if (small, plan) in per_size and (big, plan) in per_size:
            ratio_rows.append([plan, f"{big:,} / {small:,}", per_size[(big, plan)] / per_size[(small, plan)]])
    for n in sizes:
        if (n, "naive") in per_size:
            ratio_rows.append([f"naive / incremental at {n:,}", "", per_size[(n, "naive")] / per_size[(n, "incremental")]])
        if (n, "index") in per_size:
            ratio_rows.append([f"index / incremental at {n:,}", "", per_size[(n, "index")] / per_size[(n, "incremental")]])
    table("Ratios (time per boundary)", ["what", "sizes", "ratio"], ratio_rows)


def catch_up(subscriptions: int, warm_s: int, batches: int, per_second: int) -> None:
    """What a stale copy of the shard pays to catch up (the operator's restore), against evaluating a batch: one
    copy evaluates ``batches`` seconds, another replays their deltas (as a Spark worker whose cached copy is
    behind), and a third is rebuilt from a snapshot; each then evaluates the next second. Once with CPython's
    garbage collector as it comes and once as the evaluator's workers run it (``core.gc_policy``), on the same
    shard in turn."""
    config = ShardConfig(ATTRS, PANE, 5 * MINUTE, 0, 1)
    feed = Feed(5_000, per_second, seed=7, shards=SHARDS)
    shard, t = ShardEvaluator(config), 1_000_000
    _, _, t = run_boundaries(shard, feed, t, warm_s, Catalog.empty(), f"warm {subscriptions:,}")
    catalog = catalog_for(subscriptions, shard, seed=11)
    _, _, t = run_boundaries(shard, feed, t, 2, catalog, "first")
    started = time.perf_counter()
    blob = shard.snapshot()
    snapshot_ms = 1000 * (time.perf_counter() - started)
    stale = ShardEvaluator.from_snapshot(config, blob)
    run_boundaries(stale, feed, t, 1, catalog, "stale copy")  # a cached copy that evaluated (its first in full)
    started = time.perf_counter()
    ShardEvaluator.from_snapshot(config, blob)
    rebuild_ms = 1000 * (time.perf_counter() - started)
    default, tuned = gc.get_threshold(), Settings().python_gc_threshold
    rows = []
    for policy, threshold in ((f"CPython's default ({default[0]:,})", 0), (f"Tocsin's workers ({tuned:,})", tuned)):
        gc.set_threshold(*default)
        apply_gc_policy(threshold)
        with GcClock() as clock:
            measured, t = _catch_up_round(shard, stale, feed, t, catalog, batches)
        rows.append([policy, f"{sum(clock.ms) / (batches + 1):.1f} ({', '.join(map(str, clock.runs))})", *measured])
    gc.set_threshold(*default)
    table(f"Catching up, {subscriptions:,} subscriptions (the operator's restore without Spark; ms; snapshot "
          f"{snapshot_ms:.0f} ms, {len(blob) / 2**20:.1f} MB, rebuilt from it in {rebuild_ms:.0f} ms)",
          ["garbage collector", "collecting per batch (runs by generation)", "evaluate a batch",
           "transitions per batch", "replay a missed delta", "of which reading it", "next batch, cached copy",
           "next batch, after replay", "explicit keys after replay", "group scans after replay"], rows)


def _catch_up_round(shard: ShardEvaluator, stale: ShardEvaluator, feed: Feed, t: int, catalog: Catalog,
                    batches: int) -> tuple[list[float], int]:
    """``shard`` evaluates ``batches`` seconds, ``stale`` replays their deltas, then both evaluate the next one."""
    evaluate_ms, read_ms, replay_ms, transitions, deltas = 0.0, 0.0, 0.0, 0, []
    for _ in tqdm(range(batches), desc="batches", file=sys.stderr, leave=False):
        started = time.perf_counter()
        found, delta = shard.step(feed.second(t), {0: t + PANE}, catalog)
        evaluate_ms += 1000 * (time.perf_counter() - started)
        transitions += len(found)
        deltas.append(delta.to_bytes())
        t += PANE
    for blob_delta in deltas:
        started = time.perf_counter()
        missed = Delta.from_bytes(blob_delta)
        read_ms += 1000 * (time.perf_counter() - started)
        stale.replay(missed)
        replay_ms += 1000 * (time.perf_counter() - started)
    following = feed.second(t)
    timings = []
    for copy in (shard, stale):
        stats = BatchStats()
        started = time.perf_counter()
        copy.step(following, {0: t + PANE}, catalog, stats)
        timings.append((1000 * (time.perf_counter() - started), stats.explicit_keys, stats.scans))
    return [evaluate_ms / batches, transitions / batches, replay_ms / batches, read_ms / batches, timings[0][0],
            timings[1][0], timings[1][1], timings[1][2]], t + PANE


def key_churn(seconds: int, band: int, slide: int, per_second: int, subscriptions: int, horizon_s: int = 5) -> None:
    """Keys ``t * slide + [0, band)``: ``slide * seconds`` distinct keys, ~band + slide * horizon_s known at a time."""
    config = ShardConfig(ATTRS, PANE, horizon_s * 1_000, 0, 1)
    feed = Feed(band, per_second, seed=3, churn=slide)
    rng = np.random.default_rng(5)
    specs = tuple(SubscriptionSpec(i + 1, Condition(
        (Aggregate.COUNT, Aggregate.SUM, Aggregate.MAX)[i % 3], (None, "volume", "price")[i % 3], 2_000,
        low=float((rng.uniform(16, 22), rng.uniform(180, 250), rng.uniform(80, 95))[i % 3])))  # ~1-3 % match
        for i in range(subscriptions))
    catalog = Catalog(1, specs)
    shard, t = ShardEvaluator(config), 1_000_000
    rows, chunk = [], max(seconds // 5, 1)
    for part in range(5):
        ms, stats, t = run_boundaries(shard, feed, t, chunk, catalog, f"churn {part + 1}/5")
        rows.append([f"{(part + 1) * chunk:,}", f"{(part + 1) * chunk * slide:,}", len(shard.running.keys),
                     shard.running.keys.capacity, len(shard.running.store), ms, stats.changed_keys / chunk, rss_mb()])
    table(f"Key churn: {slide:,} new keys/s over a band of {band:,}, {horizon_s} s horizon, 2 s windows, "
          f"{subscriptions:,} subscriptions",
          ["seconds", "distinct keys so far", "key ids live", "key id capacity", "panes held", "ms/boundary",
           "changed keys/b", "RSS MB"], rows)


def mix_catalog(n: int, shard: ShardEvaluator, seed: int) -> Catalog:
    """The high-selectivity mix with four in ten subscriptions replaced by issue-16 constructs: CHANGE % over 1
    minute moving up or down (two in ten), AVG or MAX over the last 50 events, and NO DATA FOR 30s (a tenth of
    them listing 3 keys); thresholds again around the 92nd (8th) percentile of the current values."""
    base = catalog_for(n, shard, seed)
    rng = np.random.default_rng(seed + 1)
    now = shard.evaluated_at - 1  # type: ignore[operator]  # warmed up
    keys = sorted(shard._known())
    picked = rng.choice(keys, min(len(keys), 400), replace=False)
    samples: dict[Condition, np.ndarray] = {}

    def threshold(c: Condition, q: float) -> float:
        if c not in samples:
            values = [shard.value(c, k, now) for k in picked]
            samples[c] = np.array([v for v in values if v is not None])
        return float(np.quantile(samples[c], q))

    specs = []
    for spec in base.subscriptions:
        kind, up = spec.id % 10, rng.random() < 0.5
        if kind in (0, 1):
            probe = Condition(Aggregate.PCT_CHANGE, "price", MINUTE, low=0.0)
            q = rng.uniform(0.87, 0.97) if up else rng.uniform(0.03, 0.13)
            level = threshold(probe, q)
            spec = replace(spec, condition=Condition(Aggregate.PCT_CHANGE, "price", MINUTE, low=level if up else None,
                                                     high=None if up else level))
        elif kind == 2:
            aggregate = (Aggregate.AVG, Aggregate.MAX)[spec.id // 10 % 2]
            probe = Condition(aggregate, "price", 0, low=0.0, events=50)
            spec = replace(spec, condition=Condition(aggregate, "price", 0, events=50,
                                                     low=threshold(probe, rng.uniform(0.87, 0.97))))
        elif kind == 3:
            spec = replace(spec, condition=Condition(Aggregate.COUNT, None, 30_000, high=0.0, high_inclusive=True,
                                                     no_data=True))
        specs.append(spec)
    return Catalog(1, tuple(specs))


def incremental_against_naive(shard: ShardEvaluator, config: ShardConfig, feed: Feed, t: int, catalog: Catalog,
                              measured: int, label: str, extra: Callable[[ShardEvaluator], str] | None = None
                              ) -> list[list[object]]:
    """The table rows of a warmed ``shard`` given ``catalog``: its first boundary, then ``measured`` boundaries of the
    incremental plan against one of naive started from the same snapshot, and their ratio. ``extra``: one more cell
    per plan, before RSS."""
    _, _, t = run_boundaries(shard, feed, t, 1, catalog, "first")
    warm = shard.snapshot()
    gc.collect()
    rows: list[list[object]] = []
    per_plan = {}
    n = f"{len(catalog.subscriptions):,}"
    for plan, plan_config, count in (("incremental", config, measured),
                                     ("naive", replace(config, collective=False), 1)):
        copy = shard if plan == "incremental" else ShardEvaluator.from_snapshot(plan_config, warm)
        gc.collect()
        ms, stats, _ = run_boundaries(copy, feed, t, count, catalog, f"{label} {plan}")
        b = max(stats.boundaries, 1)
        per_plan[plan] = ms
        rows.append([n, plan, ms, stats.changed_keys / b if plan == "incremental" else "", stats.candidates / b,
                     stats.transitions / b, sum(len(v) for v in copy.firing.values()),
                     *([extra(copy)] if extra else []), rss_mb()])
    rows.append([n, "naive / incremental", per_plan["naive"] / per_plan["incremental"],
                 *[""] * (len(rows[0]) - 3)])
    return rows


def issue16_mix(n: int, warm_s: int, measured: int, per_second: int) -> None:
    """The realistic mix with CHANGE %, tuple windows and NO DATA: incremental against naive at ``n``."""
    config = ShardConfig(ATTRS, PANE, 5 * MINUTE, 0, 1, value_retention_ms=MINUTE, tuple_max_events=100)
    feed = Feed(5_000, per_second, seed=7, shards=SHARDS)
    shard, t = ShardEvaluator(config), 1_000_000
    _, _, t = run_boundaries(shard, feed, t, warm_s, Catalog.empty(), f"warm mix {n:,}")
    catalog = mix_catalog(n, shard, seed=11)
    rows = incremental_against_naive(shard, config, feed, t, catalog, measured, f"mix {n:,}")
    table(f"Realistic mix with issue-16 constructs: {n:,} subscriptions, 2/10 CHANGE % over 1 min, 1/10 AVG or MAX "
          "OVER LAST 50 EVENTS, 1/10 NO DATA FOR 30s, the rest as above (ms per boundary)",
          ["subscriptions", "plan", "ms/boundary", "changed keys/b", "candidates/b", "transitions/b", "firing",
           "RSS MB"], rows)


#: Baseline conditions (a key against its own longer window), without their thresholds (set per subscription).
BASELINES = ("(SUM(volume) OVER 1m) / (SUM(volume) OVER 5m) * 5", "(AVG(price) OVER 1m) / (AVG(price) OVER 5m)",
             "(COUNT(*) OVER 1m) / (COUNT(*) OVER 5m) * 5", "(MAX(price) OVER 1m) - (AVG(price) OVER 5m)")


def baseline_catalog(n: int, shard: ShardEvaluator, seed: int) -> Catalog:
    """``n`` baseline subscriptions over the four shapes of :data:`BASELINES`, thresholds around the 92nd percentile
    of each shape's current values (~8 % of the pairs match), a tenth of them listing 3 keys."""
    rng = np.random.default_rng(seed)
    now = shard.evaluated_at - 1  # type: ignore[operator]  # warmed up
    keys = sorted(shard._known())
    picked = rng.choice(keys, min(len(keys), 400), replace=False)
    samples = {}
    for text in BASELINES:
        probe = parse_condition(f"{text} > 0")
        values = [shard.value(probe, k, now) for k in picked]
        samples[text] = np.array([v for v in values if v is not None])
    specs = []
    for i in range(n):
        text = BASELINES[i % len(BASELINES)]
        level = float(np.quantile(samples[text], rng.uniform(0.87, 0.97)))
        restricted = frozenset(rng.choice(keys, 3, replace=False).tolist()) if rng.random() < 0.1 else None
        specs.append(SubscriptionSpec(i + 1, parse_condition(f"{text} > {level!r}"), restricted))
    return Catalog(1, tuple(specs))


def baselines(n: int, warm_s: int, measured: int, per_second: int) -> None:
    """Baseline conditions evaluated collectively (one running aggregate per window length and key, shared by every
    subscription that reads it; a key re-evaluated when any of its windows changed) against naive (each
    subscription on each key, alone)."""
    config = ShardConfig(ATTRS, PANE, 5 * MINUTE, 0, 1)
    feed = Feed(5_000, per_second, seed=7, shards=SHARDS)
    shard, t = ShardEvaluator(config), 1_000_000
    _, _, t = run_boundaries(shard, feed, t, warm_s, Catalog.empty(), f"warm baselines {n:,}")
    catalog = baseline_catalog(n, shard, seed=17)
    rows = incremental_against_naive(shard, config, feed, t, catalog, measured, f"baselines {n:,}",
                                     lambda copy: ", ".join(f"{ms // 1000} s" for ms in sorted(copy.running.windows)))
    table(f"Baselines, a key against its own longer window: {n:,} subscriptions over four shapes ({'; '.join(BASELINES)}"
          "), thresholds around the 92nd percentile (ms per boundary; running windows: the lengths kept, each one "
          "aggregate per key for every subscription reading it)",
          ["subscriptions", "plan", "ms/boundary", "changed keys/b", "candidates/b", "transitions/b", "firing",
           "running windows", "RSS MB"], rows)


#: Rank conditions (``IN TOP k`` / ``IN BOTTOM k``) without their rank, set per subscription.
RANKED = ("SUM(volume) OVER 1m", "SUM(volume) OVER 5m", "COUNT(*) OVER 1m", "AVG(price) OVER 5m",
          "MAX(price) - MIN(price) OVER 5m")


def rank_catalog(n: int) -> Catalog:
    """``n`` rank subscriptions over the shapes of :data:`RANKED`, k of 1, 5, 10, 25 or 100, TOP and BOTTOM."""
    ks = (1, 5, 10, 25, 100)
    specs = []
    for i in range(n):
        side = "TOP" if (i // len(RANKED)) % 2 == 0 else "BOTTOM"
        specs.append(SubscriptionSpec(i + 1, parse_condition(f"{RANKED[i % len(RANKED)]} IN {side} "
                                                             f"{ks[(i // (2 * len(RANKED))) % len(ks)]}")))
    return Catalog(1, tuple(specs))


def ranks(sizes: list[int], warm_s: int, measured: int, per_second: int) -> None:
    """Rank subscriptions: the shard's books (only the keys whose windows changed move; each subscription's first k
    read off and sent when they differ) against ranking every key from scratch at each boundary (values of every key,
    sorted); and the sink's merge of 5 shards' lists (this shard's, as 5 shards of such keys would send them)."""
    config = ShardConfig(ATTRS, PANE, 5 * MINUTE, 0, 1)
    rows = []
    for n in sizes:
        feed = Feed(5_000, per_second, seed=7, shards=SHARDS)
        shard, t = ShardEvaluator(config), 1_000_000
        _, _, t = run_boundaries(shard, feed, t, warm_s, Catalog.empty(), f"warm ranks {n:,}")
        catalog = rank_catalog(n)
        _, _, t = run_boundaries(shard, feed, t, 1, catalog, "first")  # every list sent once
        shard.take_ranked()
        entries, merge_s, merges = 0, 0.0, {sid: RankMerge(sid) for sid in range(1, n + 1)}
        stats, elapsed = BatchStats(), 0.0
        for _ in tqdm(range(measured), desc=f"ranks {n:,} books", file=sys.stderr, leave=False):
            rows_in = feed.second(t)
            started = time.perf_counter()
            shard.step(rows_in, {0: t + PANE}, catalog, stats)
            elapsed += time.perf_counter() - started
            sent = shard.take_ranked()
            entries += len(sent)
            five = [replace(e, shard=s, key=f"{e.key}/{s}") if e.key else replace(e, shard=s)
                    for e in sent for s in range(SHARDS)]
            by_sid: dict[int, list[RankEntry]] = {}
            for e in five:
                by_sid.setdefault(e.subscription_id, []).append(e)
            started = time.perf_counter()
            for sid, own in by_sid.items():
                merges[sid].merge(own, t + PANE)
            merge_s += time.perf_counter() - started
            t += PANE
        b = max(stats.boundaries, 1)
        books_ms = 1000 * elapsed / b
        started = time.perf_counter()
        scratch = 0
        for _ in range(min(measured, 3)):
            for spec in catalog.subscriptions:
                shard.preview(spec.condition)  # every key's value, sorted: the first k from scratch
            scratch += 1
        scratch_ms = 1000 * (time.perf_counter() - started) / scratch
        rows.append([f"{n:,}", len(shard._known()), stats.rank_moved / b, entries / b, books_ms, scratch_ms,
                     scratch_ms / books_ms, 1000 * merge_s / b, rss_mb()])
    table(f"Ranks: IN TOP/BOTTOM k (k 1-100) over {'; '.join(RANKED)}; one shard of 5 (5,000 Zipf keys, "
          f"{per_second:,} events/s), ms per boundary; from scratch: every key's value computed and sorted for each "
          "subscription at each boundary; merge: the sink's, of 5 shards' lists per subscription",
          ["subscriptions", "keys in shard", "book moves/b", "entries sent/b", "books ms/b", "from scratch ms/b",
           "scratch / books", "merge ms/b (5 shards)", "RSS MB"], rows)


def pipeline_mix(n: int, batches: int, per_second: int, batch_s: int = 20, keys: int = 5_000) -> None:
    """The pipeline benchmark's drain, one shard without Spark: its mix of ``n`` subscriptions
    (``benchmarks.pipeline.subscriptions``: COUNT / SUM / AVG / MAX / MIN over 1 min to 1 h, a fifth listing keys),
    the keys of shard 0 of 2 among ``keys`` Zipf keys, ``per_second`` events per event-second in batches of
    ``batch_s`` event-seconds (400,000 records a batch in all at the defaults, the production cap), and the live
    configuration's event retention (an hour of every event for QUANTILE, 100 a key for tuple windows). The first
    batch (every subscription's first evaluation) is timed apart; CPU time of this process, so another job on the
    machine does not inflate it."""
    from benchmarks.pipeline import level, subscriptions, zipf_weights  # the pipeline's own mix (it imports Spark)

    names = [f"k{i}" for i in range(keys)]
    catalog = Catalog(1, subscriptions(n, names, per_second))
    settings = Settings()
    config = ShardConfig(ATTRS, PANE, 3_600_000, 0, 1, value_retention_ms=settings.quantile_max_window_ms,
                         tuple_max_events=settings.tuple_max_events)
    rng, weights = np.random.default_rng(5), zipf_weights(keys)
    price = np.array([level(i) for i in range(keys)])

    def batch(start: int) -> PaneRows:
        nonlocal price
        parts: list[tuple[np.ndarray, ...]] = []
        for second in range(batch_s):
            drawn = rng.choice(keys, per_second, p=weights)
            price = price * (1 + rng.normal(0, 0.0005 * np.sqrt(per_second * weights), keys))  # a walk per event
            drawn = drawn[drawn % 2 == 0]  # shard 0's keys
            parts.append((drawn, start + second * PANE + rng.integers(0, PANE, drawn.size),
                          np.round(price[drawn] * 4) / 4, np.floor(rng.lognormal(4, 1, drawn.size)) + 1))
        return pane_rows(*(np.concatenate(column) for column in zip(*parts, strict=True)))

    shard, t = ShardEvaluator(config), 1_000_000_000
    rows = [batch(t + i * batch_s * 1_000) for i in tqdm(range(batches + 1), desc="feed", file=sys.stderr, leave=False)]
    started = time.process_time()
    shard.step(rows[0], {0: t + batch_s * 1_000}, catalog)
    first_ms = 1000 * (time.process_time() - started)
    stats, elapsed, records = BatchStats(), 0.0, 0
    for i, part in enumerate(tqdm(rows[1:], desc=f"pipeline mix {n:,}", file=sys.stderr, leave=False), 1):
        started = time.process_time()
        shard.step(part, {0: t + (i + 1) * batch_s * 1_000}, catalog, stats)
        elapsed += time.process_time() - started
        records += int(part.counts.sum())
    b = max(stats.boundaries, 1)
    table(f"The pipeline benchmark's drain mix in one shard (shard 0 of 2: {keys // 2:,} of {keys:,} Zipf keys, "
          f"{per_second:,} events per event-second, batches of {batch_s} event-seconds, the live event retention), "
          "CPU ms of this process",
          ["subscriptions", "first batch ms", "batches", "records", "ms/boundary", "us/record", "transitions/b",
           "changed keys/b", "explicit keys/b", "scans/b", "RSS MB"],
          [[f"{n:,}", first_ms, batches, records, 1000 * elapsed / b, 1e6 * elapsed / max(records, 1),
            stats.transitions / b, stats.changed_keys / b, stats.explicit_keys / b, stats.scans / b, rss_mb()]])


def main() -> None:
    parser = cli.parser(__doc__, "python -m benchmarks.shard")
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--mix-only", action="store_true", help="only the issue-16 mix at 10,000 subscriptions")
    parser.add_argument("--baselines-only", action="store_true", help="only the baselines at 10,000 subscriptions")
    parser.add_argument("--ranks-only", action="store_true", help="only the rank subscriptions")
    parser.add_argument("--pipeline-mix-only", action="store_true",
                        help="only the pipeline benchmark's drain mix (10,000 subscriptions) in one shard")
    add_markdown_option(parser)
    args = parser.parse_args()
    if args.pipeline_mix_only:
        pipeline_mix(10_000, batches=9, per_second=20_000)
        return
    if args.mix_only:
        issue16_mix(10_000, warm_s=300, measured=10, per_second=5_000)
        return
    if args.baselines_only:
        baselines(10_000, warm_s=300, measured=10, per_second=5_000)
        return
    if args.ranks_only:
        ranks([100, 1_000], warm_s=300, measured=10, per_second=5_000)
        return
    if args.quick:
        high_selectivity([100, 1_000], warm_s=30, measured=5, naive_upto=100, per_second=1_000)
        catch_up(100, warm_s=30, batches=5, per_second=1_000)
        key_churn(seconds=50, band=500, slide=100, per_second=1_000, subscriptions=100)
        issue16_mix(200, warm_s=30, measured=3, per_second=1_000)
        baselines(200, warm_s=30, measured=3, per_second=1_000)
        ranks([20], warm_s=30, measured=3, per_second=1_000)
        pipeline_mix(200, batches=2, per_second=1_000, batch_s=3, keys=200)
    else:
        high_selectivity([1_000, 10_000, 100_000], warm_s=300, measured=10, naive_upto=10_000, per_second=5_000)
        catch_up(10_000, warm_s=300, batches=10, per_second=10_000)
        key_churn(seconds=1_000, band=1_000, slide=1_000, per_second=5_000, subscriptions=1_000)
        issue16_mix(10_000, warm_s=300, measured=10, per_second=5_000)
        baselines(10_000, warm_s=300, measured=10, per_second=5_000)
        ranks([100, 1_000], warm_s=300, measured=10, per_second=5_000)
        pipeline_mix(10_000, batches=9, per_second=20_000)


if __name__ == "__main__":
    with markdown_run():
        main()
