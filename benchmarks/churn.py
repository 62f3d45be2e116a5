"""Key churn: memory and per-boundary cost of the collective indexes when the key set turns over.

    python benchmarks/churn.py                          # 1,000,000 distinct keys, ~5,000 held at a time
    python benchmarks/churn.py --quick                  # smoke run (seconds)
    python benchmarks/churn.py --before /work/main      # also another checkout's code on the same stream

The stream is what a shard sees when keys come and go (sessions, devices, order ids):
every pane ``--arrivals`` new keys appear, each sends one pane row in ``--life``
consecutive panes and is never seen again, so about ``arrivals * (horizon + life)``
keys have data in the horizon at any time. It drives CollectiveIndexes (COUNT, and
SUM/MAX/MIN of one attribute) and KeyValues as the shard does at each boundary: add
the completed pane, expire at ``boundary - horizon - 1``, and every ``--query-every``
boundaries answer ``SUM(volume) < v`` and ``COUNT(*) < v`` (upper-only bounds).

Reported per fifth of the run (early to late): the keys seen so far, the keys each
structure holds (substreams, id table, stamps, KeyValues keys), RSS, and the mean
milliseconds per expire and per upper-bound query. ``--before PATH`` runs the same
stream against PATH's evaluator in a subprocess (time-boxed by ``--budget-s``: code
whose cost grows with every key ever seen may not finish) and prints both side by
side. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
import tracemalloc
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
ATTRIBUTES = ("volume",)


@dataclass
class Segment:
    """One stretch of the run and the state at its end."""

    keys_seen: int
    boundaries: int
    held: int  # substreams of the COUNT index
    ids: int  # its id table (names)
    stamps: int  # its stamps, every (level, j) and the newest-element index
    stairs: int  # keys held by the MAX staircase
    values_keys: int  # keys KeyValues holds
    rss_mb: float
    traced_mb: float | None
    add_ms: float  # per boundary: the pane's rows into the indexes and KeyValues
    expire_ms: float  # per boundary: CollectiveIndexes.expire
    values_expire_ms: float  # per boundary: KeyValues.expire
    sum_below_ms: float  # per SUM(volume) < v lookup
    count_below_ms: float  # per COUNT(*) < v lookup
    answer: int  # keys in the last SUM < v answer


def rss_mb() -> float:
    """Resident set size now (Linux), else the peak."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * resource.getpagesize() / 2**20
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def load(code: Path) -> tuple[ModuleType, ModuleType, ModuleType, ModuleType]:
    """The evaluator modules of the checkout at ``code`` (this one by default)."""
    sys.path.insert(0, str(code))
    import evaluator.collective as collective
    import evaluator.panerows as panerows
    import evaluator.spec as spec
    import evaluator.values as values

    assert Path(collective.__file__).resolve().is_relative_to(code.resolve()), collective.__file__
    return collective, panerows, spec, values


def pane_rows(panerows: ModuleType, keys: list[str], start: int, rng: np.random.Generator) -> Any:
    """One pane's rows, one event each."""
    n = len(keys)
    volume = rng.lognormal(3, 1, n)
    return panerows.PaneRows(np.array(keys, dtype=object), np.full(n, start, dtype=np.int64), np.ones(n, dtype=np.int64),
                             volume[None, :], volume[None, :].copy(), volume[None, :].copy(),
                             np.arange(n + 1, dtype=np.int64), np.full(n, start, dtype=np.int64), volume[None, :].copy())


def run(args: argparse.Namespace) -> tuple[list[Segment], bool]:
    """The stream against the evaluator at ``args.code``; returns the segments and whether it finished."""
    collective, panerows, spec, values_module = load(Path(args.code))
    pane, horizon = args.pane_ms, args.horizon_panes * args.pane_ms
    indexes = collective.CollectiveIndexes(ATTRIBUTES, p=4, bucket_ms=pane)
    values = values_module.KeyValues(ATTRIBUTES, horizon)
    sum_below = spec.Condition(spec.Aggregate.SUM, "volume", horizon, high=50.0)
    count_below = spec.Condition(spec.Aggregate.COUNT, None, horizon // 2, high=2.0)
    rng = np.random.default_rng(7)
    if args.tracemalloc:
        tracemalloc.start()
    birth_panes = -(-args.keys // args.arrivals)
    panes = birth_panes + args.life - 1
    segments: list[Segment] = []
    times: dict[str, list[float]] = {k: [] for k in ("add", "expire", "values", "sum", "count")}
    answer, started, finished, next_cut = 0, time.perf_counter(), True, 1
    for p in tqdm(range(panes), desc=f"churn {Path(args.code).name}", file=sys.stderr, leave=False):
        born = range(max(0, p - args.life + 1) * args.arrivals, min((p + 1) * args.arrivals, args.keys))
        keys = [f"k{i:07d}" for i in born]
        boundary = (p + 1) * pane
        t = time.perf_counter()
        rows = pane_rows(panerows, keys, p * pane, rng)
        indexes.add_panes(rows.keys.tolist(), rows.starts, rows.counts, rows.sums, rows.mins, rows.maxs)
        values.add(rows)
        t1 = time.perf_counter()
        indexes.expire(boundary - horizon - 1)
        t2 = time.perf_counter()
        values.expire(boundary, horizon)
        t3 = time.perf_counter()
        times["add"].append(t1 - t)
        times["expire"].append(t2 - t1)
        times["values"].append(t3 - t2)
        if p % args.query_every == 0:
            t = time.perf_counter()
            answer = len(indexes.matching(sum_below, boundary - 1))
            t1 = time.perf_counter()
            indexes.matching(count_below, boundary - 1)
            times["sum"].append(t1 - t)
            times["count"].append(time.perf_counter() - t1)
        over = time.perf_counter() - started > args.budget_s
        if p + 1 >= next_cut * panes / args.segments or over:
            segments.append(snapshot(indexes, values, born.stop, times, answer))
            times = {k: [] for k in times}
            next_cut = len(segments) + 1
        if over and p < panes - 1:
            finished = False
            break
    return segments, finished


def snapshot(indexes: Any, values: Any, seen: int, times: dict[str, list[float]], answer: int) -> Segment:
    count, maxi = indexes.count, indexes.maxs[ATTRIBUTES[0]]

    def ms(key: str) -> float:
        return 1e3 * float(np.mean(times[key])) if times[key] else float("nan")

    return Segment(
        keys_seen=seen, boundaries=len(times["add"]), held=len(count.substreams), ids=len(count.names),
        stamps=len(count.last) + sum(len(ix) for ix in count.indexes.values()), stairs=len(maxi.stairs),
        values_keys=len(values.keys), rss_mb=rss_mb(),
        traced_mb=tracemalloc.get_traced_memory()[0] / 2**20 if tracemalloc.is_tracing() else None,
        add_ms=ms("add"), expire_ms=ms("expire"), values_expire_ms=ms("values"), sum_below_ms=ms("sum"),
        count_below_ms=ms("count"), answer=answer,
    )


def print_run(title: str, segments: list[Segment], finished: bool) -> None:
    from benchmarks.report import table

    rows: list[list[object]] = [[f"{s.keys_seen:,}", s.held, s.ids, s.stamps, s.stairs, s.values_keys, s.rss_mb,
             "-" if s.traced_mb is None else s.traced_mb, s.add_ms, s.expire_ms, s.values_expire_ms,
             s.sum_below_ms, s.count_below_ms, s.answer] for s in segments]
    table(title + ("" if finished else f" — STOPPED by the time budget at {segments[-1].keys_seen:,} keys"),
          ["keys seen", "held", "id table", "stamps", "MAX keys", "KeyValues keys", "RSS MB", "traced MB",
           "add ms", "expire ms", "KeyValues expire ms", "SUM<v ms", "COUNT<v ms", "SUM<v answer"], rows)


def compare(before: list[Segment], after: list[Segment], finished: bool) -> None:
    from benchmarks.report import table

    rows: list[list[object]] = []
    for b, a in zip(before, after, strict=False):
        seen = f"{a.keys_seen:,}" if a.keys_seen == b.keys_seen else f"{b.keys_seen:,} / {a.keys_seen:,}"
        rows.append([seen, f"{b.held:,} -> {a.held:,}", f"{b.rss_mb:.0f} -> {a.rss_mb:.0f}",
                     f"{b.expire_ms:.2f} -> {a.expire_ms:.2f}", f"{b.sum_below_ms:.2f} -> {a.sum_below_ms:.2f}",
                     f"{b.count_below_ms:.2f} -> {a.count_below_ms:.2f}", b.expire_ms / a.expire_ms,
                     b.sum_below_ms / a.sum_below_ms])
    table("before -> after, same stream" + ("" if finished else " (before stopped by its time budget)"),
          ["keys seen (before / after)", "held", "RSS MB", "expire ms", "SUM<v ms", "COUNT<v ms", "expire x", "SUM<v x"], rows)


def main() -> None:
    sys.path.insert(0, str(ROOT))
    from benchmarks.report import add_markdown_option

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="20,000 keys, a smoke run")
    parser.add_argument("--keys", type=int, default=1_000_000, help="distinct keys over the run")
    parser.add_argument("--arrivals", type=int, default=400, help="new keys per pane")
    parser.add_argument("--life", type=int, default=2, help="panes each key sends a row in")
    parser.add_argument("--horizon-panes", type=int, default=10, help="retention horizon, in panes")
    parser.add_argument("--pane-ms", type=int, default=1_000)
    parser.add_argument("--segments", type=int, default=5, help="rows of the table, early to late")
    parser.add_argument("--query-every", type=int, default=5, help="boundaries between upper-bound lookups")
    parser.add_argument("--budget-s", type=float, default=600.0, help="stop a run after this long")
    parser.add_argument("--tracemalloc", action="store_true", help="also trace Python allocations (slower)")
    parser.add_argument("--code", default=str(ROOT), help="checkout whose evaluator runs (default: this one)")
    parser.add_argument("--before", help="also run this checkout's evaluator on the same stream and compare")
    parser.add_argument("--json", action="store_true", help="print the segments as JSON (for --before)")
    add_markdown_option(parser)
    args = parser.parse_args()
    if args.quick:
        args.keys, args.arrivals, args.query_every = min(args.keys, 20_000), min(args.arrivals, 200), 2
    if args.json:
        segments, finished = run(args)
        print(json.dumps({"finished": finished, "segments": [asdict(s) for s in segments]}))
        return
    sys.path.insert(0, str(ROOT))
    held = args.arrivals * (args.horizon_panes + args.life - 1)
    print(f"{args.keys:,} distinct keys, {args.arrivals} new per {args.pane_ms} ms pane, each for {args.life} panes; "
          f"horizon {args.horizon_panes} panes: ~{held:,} keys with data in the horizon")
    before = None
    if args.before:
        command = [sys.executable, __file__, "--json", "--code", args.before,
                   *(a for a in sys.argv[1:] if a not in ("--before", args.before))]
        result = subprocess.run(command, capture_output=True, text=True, check=True)
        before = json.loads(result.stdout.splitlines()[-1])
        print_run(f"before: {args.before}", [Segment(**s) for s in before["segments"]], before["finished"])
    segments, finished = run(args)
    print_run(f"this checkout: {args.code}", segments, finished)
    if before is not None:
        compare([Segment(**s) for s in before["segments"]], segments, before["finished"])


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    from benchmarks.report import markdown_run

    with markdown_run():
        main()
