"""Reproduce the experiments of Arasu & Widom (VLDB 2004) on this machine.

    python benchmarks/evaluator.py            # full run (a few minutes)
    python benchmarks/evaluator.py --quick    # smoke run (seconds)

Fig. 9   1000 SUM operators with windows 1..1000, varying update:lookup ratio:
         R-INT, B-INT, L-INT vs an aggregate tree (PSoup-style), materialise-all, materialise-none.
Fig. 10  update rate vs N_max for R-INT, B-INT, B-INT-QNT (plus R-INT's batched extend).
Fig. 11  lookup rate vs window W for R-INT, B-INT, B-INT-QNT.
Fig. 12  CI-COUNT + exact verification vs the naive per-key approach: ~5000 substreams,
         windows 15 min - 3 h, selectivity 0.03-0.05, equal lookups and updates, varying p.

Every cell runs for a fixed time budget and reports a rate; ratios compare structures
measured in the same process. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
import tracemalloc
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.report import add_markdown_option, markdown_run, percentiles, table
from evaluator.asw.base import WindowStructure
from evaluator.asw.baselines import AggregateTree, MaterializeAll, MaterializeNone
from evaluator.asw.bint import BaseIntervals
from evaluator.asw.lint import LandmarkIntervals
from evaluator.asw.quantile import QuantileIntervals
from evaluator.asw.rint import RunningIntervals
from evaluator.spec import Aggregate, Condition
from evaluator.ssf.ci_sum import CollectiveSum
from evaluator.ssf.naive import NaiveSubstreams

MINUTE = 60_000
T = TypeVar("T")


class KeyIndex(Protocol):
    """What Fig. 12 feeds: one event of one key."""

    def add(self, key: str, ts: int, value: float) -> None: ...


def _append_nth(s: WindowStructure, values: list[float], i: int) -> None:
    s.append(values[i & 0xFFFF])


def _lookup(s: WindowStructure, w: int, _i: int) -> float:
    return s.lookup(w)


def _median(s: QuantileIntervals, w: int, _i: int) -> float | None:
    return s.quantile(w, 0.5)


def rate(step: Callable[[int], object], budget_s: float, batch: int = 256) -> float:
    """Operations per second of ``step(i)`` over roughly ``budget_s`` seconds."""
    done, started = 0, time.perf_counter()
    while True:
        for i in range(done, done + batch):
            step(i)
        done += batch
        elapsed = time.perf_counter() - started
        if elapsed >= budget_s:
            return done / elapsed


def memory_of(build: Callable[[], T]) -> tuple[T, int]:
    gc.collect()
    tracemalloc.start()
    obj = build()
    current, _peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return obj, current


# --- Fig. 9 ---------------------------------------------------------------------------------


def fig9(budget_s: float, operators: int) -> None:
    widths = list(range(1, operators + 1))
    capacity = operators
    makers: dict[str, Callable[[], WindowStructure]] = {
        "R-INT": lambda: RunningIntervals("SUM", capacity),
        "B-INT": lambda: BaseIntervals("SUM", capacity),
        "L-INT (γ=2)": lambda: LandmarkIntervals("SUM", capacity, widths=widths, gamma=2.0),
        "tree (PSoup)": lambda: AggregateTree("SUM", capacity),
        "materialise-all": lambda: MaterializeAll("SUM", capacity, widths=widths),
        "materialise-none": lambda: MaterializeNone("SUM", capacity),
    }
    ratios = [(1, 100), (1, 10), (1, 1), (10, 1), (100, 1)]
    rng = random.Random(9)
    values = [rng.uniform(0, 100) for _ in range(4096)]
    lookups = [rng.choice(widths) for _ in range(4096)]
    rows = []
    for name, make in tqdm(makers.items(), desc="fig 9", file=sys.stderr, leave=False):
        structure, memory = memory_of(make)
        structure.extend(values[:capacity])  # full windows from the start
        row: list[Any] = [name]  # a table row: the name, then numbers
        for updates, lookup_count in ratios:
            period = updates + lookup_count

            def step(i: int, s=structure, u=updates, p=period) -> None:
                if i % p < u:
                    s.append(values[i & 4095])
                else:
                    s.lookup(lookups[i & 4095])

            row.append(rate(step, budget_s))
        row.append(memory / 1024)
        rows.append(row)
    header = ["structure"] + [f"{u}:{lk} ops/s" for u, lk in ratios] + ["memory KiB"]
    table(f"Fig. 9 — {operators} SUM operators, windows 1..{operators}; operations/s by update:lookup ratio",
          header, rows)
    base = {r[0]: r for r in rows}
    ratio_rows = [[name] + [r[i] / base["materialise-none"][i] for i in range(1, len(ratios) + 1)]
                  for name, r in base.items()]
    table("Fig. 9 — speed-up over materialise-none", ["structure"] + [f"{u}:{lk}" for u, lk in ratios], ratio_rows)


# --- Figs. 10 and 11 --------------------------------------------------------------------------


def fig10_11(budget_s: float, sizes: list[int], windows: list[int]) -> None:
    rng = np.random.default_rng(10)
    values = rng.uniform(0, 100, size=1 << 16).tolist()
    kinds: dict[str, Callable[[int], WindowStructure]] = {
        "R-INT": lambda n: RunningIntervals("SUM", n),
        "B-INT": lambda n: BaseIntervals("SUM", n),
        "B-INT-QNT": lambda n: QuantileIntervals("MIN", n),
    }
    update_rows, lookup_rows = [], []
    for name, make in tqdm(kinds.items(), desc="figs 10-11", file=sys.stderr, leave=False):
        urow: list[object] = [name]
        lrow: list[object] = [name]
        for n_max in sizes:
            def full(m=make, n=n_max):  # memory is measured with N_max elements held
                s = m(n)
                for start in range(0, n, len(values)):
                    s.extend(values[: min(len(values), n - start)])
                return s

            structure, memory = memory_of(full)
            urow += [rate(partial(_append_nth, structure, values), budget_s), memory / 1024]
        for w in windows:
            structure = make(max(sizes))
            structure.extend(values[: min(max(sizes), 1 << 14)])
            if isinstance(structure, QuantileIntervals):  # B-INT-QNT
                lrow.append(rate(partial(_median, structure, w), budget_s, batch=16))
            else:
                lrow.append(rate(partial(_lookup, structure, w), budget_s))
        update_rows.append(urow)
        lookup_rows.append(lrow)
    batched = RunningIntervals("SUM", max(sizes))
    chunk = np.asarray(values[:4096])
    urow = ["R-INT extend (4096/batch)"]
    for n_max in sizes:
        r = RunningIntervals("SUM", n_max)
        started = time.perf_counter()
        count = 0
        while time.perf_counter() - started < budget_s:
            r.extend(chunk)
            count += len(chunk)
        urow += [count / (time.perf_counter() - started), float("nan")]
    del batched
    update_rows.append(urow)
    header = ["structure"]
    for n_max in sizes:
        header += [f"N={n_max} upd/s", f"N={n_max} KiB"]
    table("Fig. 10 — update rate (one core) and memory vs N_max", header, update_rows)
    table(f"Fig. 11 — lookup rate vs window W (N_max = {max(sizes)}; B-INT-QNT: median)",
          ["structure"] + [f"W={w} lookups/s" for w in windows], lookup_rows)


# --- Fig. 12 ----------------------------------------------------------------------------------


def fig12(ops: int, keys: int, ps: list[int], rate_per_s: float) -> None:
    """CI-COUNT + verification vs naive per key, equal lookups and updates."""
    rng = np.random.default_rng(12)
    weights = 1.0 / np.arange(1, keys + 1) ** 0.8
    weights /= weights.sum()
    names = [f"K{i:05d}" for i in range(keys)]
    horizon = 3 * 60 * MINUTE
    warm = int(rate_per_s * horizon / 1000)  # three hours of history before measuring
    total = warm + ops
    which = rng.choice(keys, size=total, p=weights)
    gaps = rng.exponential(1000.0 / rate_per_s, size=total)
    stamps = (1_000_000 + np.cumsum(gaps)).astype(np.int64).tolist()
    stream = [(names[k], t) for k, t in zip(which.tolist(), stamps, strict=True)]

    # thresholds giving 3-5 % selectivity, taken from the warm state (as a user would tune them)
    oracle = NaiveSubstreams("COUNT")
    for key, t in stream[:warm]:
        oracle.add(key, t, 1.0)
    now = stream[warm - 1][1]
    windows = [15 * MINUTE, 30 * MINUTE, 60 * MINUTE, 120 * MINUTE, 180 * MINUTE]
    bucket_ms = MINUTE  # about a sixteenth of the shortest window
    queries = []
    for w in windows:
        counts = np.array([oracle.value(k, w, now) for k in names])
        for q in (95, 96, 97):
            queries.append(Condition(Aggregate.COUNT, None, w, low=float(np.percentile(counts, q))))
    lookups = [queries[i % len(queries)] for i in rng.permutation(ops).tolist()]

    def run(index_factory: Callable[[], KeyIndex], lookup: Callable) -> tuple[float, list[float], float, int]:
        index = index_factory()
        for key, t in stream[:warm]:
            index.add(key, t, 1.0)
        latencies = []
        selectivity = 0.0
        started = time.perf_counter()
        for i in range(ops):
            key, t = stream[warm + i]
            index.add(key, t, 1.0)
            before = time.perf_counter()
            found = lookup(index, lookups[i], t)
            latencies.append(time.perf_counter() - before)
            selectivity += len(found) / keys
        elapsed = time.perf_counter() - started
        _, memory = memory_of(lambda: None)
        return elapsed, latencies, selectivity / ops, memory

    rows = []
    naive_time, naive_lat, naive_sel, _ = run(lambda: NaiveSubstreams("COUNT"), NaiveSubstreams.query)
    rows.append(["naive per key", "-", 2 * ops / naive_time, naive_sel, *percentiles(naive_lat), "-", 1.0])
    for p in tqdm(ps, desc="fig 12", file=sys.stderr, leave=False):
        elapsed, latencies, sel, _ = run(partial(CollectiveSum, p=p, bucket_ms=bucket_ms), CollectiveSum.matching_keys)
        probe = CollectiveSum(p=p, bucket_ms=bucket_ms)
        for key, t in stream[: warm + ops]:
            probe.add(key, t, 1.0)
        last = stream[warm + ops - 1][1]
        cand = np.mean([len(probe.candidates(q, last).keys) / max(len(probe.query(q, last)), 1) for q in queries])
        rows.append([f"CI-COUNT p={p}", f"{probe.epsilon:.2f}", 2 * ops / elapsed, sel, *percentiles(latencies),
                     float(cand), naive_time / elapsed])
    table(
        f"Fig. 12 — {keys} substreams, windows 15 min-3 h, {ops} lookups + {ops} updates "
        f"(after {warm:,} warm-up events; stamp buckets of {bucket_ms // 1000} s)",
        ["approach", "ε", "ops/s", "selectivity", "lookup p50 µs", "lookup p99 µs", "candidates/answer",
         "speed-up vs naive"],
        rows,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes and budgets (a smoke run)")
    parser.add_argument("--figs", default="9,10,12", help="which experiments: any of 9, 10 (with 11), 12")
    add_markdown_option(parser)
    args = parser.parse_args()
    figs = set(args.figs.split(","))
    if "9" in figs:
        fig9(0.05, 200) if args.quick else fig9(0.5, 1000)
    if "10" in figs or "11" in figs:
        if args.quick:
            fig10_11(0.05, [1 << 10, 1 << 12], [10, 100, 1000])
        else:
            fig10_11(0.5, [1 << 10, 1 << 14, 1 << 18], [10, 100, 1_000, 10_000])
    if "12" in figs:
        if args.quick:
            fig12(ops=200, keys=500, ps=[1, 4], rate_per_s=2.0)
        else:
            fig12(ops=2_000, keys=5_000, ps=[1, 2, 4, 8], rate_per_s=20.0)


if __name__ == "__main__":
    with markdown_run():
        main()
