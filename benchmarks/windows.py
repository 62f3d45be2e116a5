"""Moving the running windows at steady state: ms per boundary, with and without the MIN/MAX block summaries.

    python benchmarks/windows.py           # 2,500 keys, windows of 1 min to 1 h, 1 s panes
    python benchmarks/windows.py --quick   # a smoke run

One shard's ``RunningWindows`` (no Spark, no evaluation): every key has a pane each second with random extremes on
two attributes (integers, so ties are common), the windows are filled for the longest one first, then boundaries
are timed. A window whose MIN or MAX left it is recomputed from every pane it holds, or from the block summaries of
the whole blocks inside it and the panes at its ends (``evaluator.panestore.BlockExtremes``). Nothing here asserts
a time; numbers are read.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.report import add_markdown_option, markdown_run, print_tables
from core import cli
from evaluator.panestore import Panes, RunningWindows
from evaluator.shard import ShardConfig

PANE_MS = 1_000
WINDOWS_MS = (60_000, 300_000, 900_000, 3_600_000)


def boundary_ms(keys: int, timed: int, block_ms: int | None, seed: int = 1) -> tuple[float, float]:
    """(ms per boundary, of which recomputing MIN/MAX) over ``timed`` boundaries once the longest window is full."""
    rng = np.random.default_rng(seed)
    running = RunningWindows(2, WINDOWS_MS[-1], block_ms)
    running.use(WINDOWS_MS)
    ids = running.ids_of(np.array([f"k{i}" for i in range(keys)], dtype=object))
    recompute = [0.0]
    plain = running._recompute

    def timed_recompute(*args, **kwargs) -> None:
        started = time.perf_counter()
        plain(*args, **kwargs)
        recompute[0] += time.perf_counter() - started

    running._recompute = timed_recompute  # type: ignore[method-assign]
    warm = WINDOWS_MS[-1] // PANE_MS
    total = 0.0
    for second in range(warm + timed):
        if second == warm:
            recompute[0] = 0.0
        start = second * PANE_MS
        rows = Panes(ids.copy(), np.full(keys, start, dtype=np.int64), np.full(keys, 4, dtype=np.int64),
                     np.zeros((2, keys)), rng.integers(1, 100, (2, keys)).astype(np.float64),
                     rng.integers(100, 200, (2, keys)).astype(np.float64))
        started = time.perf_counter()
        running.advance(rows, start + PANE_MS)
        running.take_dirty(WINDOWS_MS)
        running.clear_dirty()
        if second >= warm:
            total += time.perf_counter() - started
    return 1000 * total / timed, 1000 * recompute[0] / timed


def main() -> None:
    parser = cli.parser(__doc__, "python -m benchmarks.windows", summary=True)
    parser.add_argument("--keys", type=int, default=2_500, help="keys in the shard")
    parser.add_argument("--boundaries", type=int, default=300, help="boundaries timed after the windows are full")
    add_markdown_option(parser)
    parser.add_argument("--quick", action="store_true", help="smoke run: few keys and boundaries")
    args = parser.parse_args()
    if args.quick:
        args.keys, args.boundaries = 200, 20
    block_ms = ShardConfig((), PANE_MS, WINDOWS_MS[-1], 0, 1).block_ms
    assert block_ms is not None
    rows = []
    for name, blocks in (("every pane", None), (f"block summaries ({block_ms // PANE_MS} panes)", block_ms)):
        print(f"{name} ...", file=sys.stderr, flush=True)
        per_boundary, recompute = boundary_ms(args.keys, args.boundaries, blocks)
        rows.append([name, args.keys, per_boundary, recompute])
    rows = [[*row, rows[0][2] / row[2]] for row in rows]
    print_tables([(
        f"Running windows at steady state: {args.keys:,} keys, a pane each per second (1 s panes), windows of 1, 5, "
        f"15 and 60 min, two attributes; {args.boundaries} boundaries after an hour's warm-up",
        ["MIN/MAX recomputed from", "keys", "ms per boundary", "of which recompute ms", "x every pane"], rows)])


if __name__ == "__main__":
    with markdown_run():
        main()
