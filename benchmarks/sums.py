"""How to sum a window of a key's substream exactly, and what each way costs.

    python benchmarks/sums.py            # a few seconds
    python benchmarks/sums.py --quick    # smoke run

Each candidate keeps one key's elements (pane sums, log-uniform in 1e-3..1e15 after a
long history of large values) and answers "SUM of the last W elements". Reported: appends/s,
window sums/s for a few W, and the worst relative error against ``math.fsum`` of the window
on the issue's cases. Nothing here asserts a time.

- float prefix:    running prefix sums, a difference per window (the defect: error tied to history)
- Neumaier prefix: compensated prefix sums (hi, lo): error ~ 2^-106 of the history, still unbounded
- exact prefix:    prefix sums as integers in units of 2^-shift (shift = the finest bit seen): exact
- fsum of window:  ``math.fsum`` over the window's elements: exact, O(W) per window
"""

from __future__ import annotations

import argparse
import bisect
import math
import random
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Protocol

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.report import add_markdown_option, markdown_run, table
from evaluator.exactsum import FixedPoint


class FloatPrefix:
    def __init__(self) -> None:
        self.ends: list[float] = []

    def append(self, v: float) -> None:
        self.ends.append((self.ends[-1] if self.ends else 0.0) + v)

    def window(self, w: int) -> float:
        i = len(self.ends) - w
        return self.ends[-1] - (self.ends[i - 1] if i else 0.0)


class NeumaierPrefix:
    def __init__(self) -> None:
        self.hi: list[float] = []
        self.lo: list[float] = []

    def append(self, v: float) -> None:
        s, c = (self.hi[-1], self.lo[-1]) if self.hi else (0.0, 0.0)
        t = s + v
        c += (s - t) + v if abs(s) >= abs(v) else (v - t) + s
        self.hi.append(t)
        self.lo.append(c)

    def window(self, w: int) -> float:
        i = len(self.hi) - w
        if not i:
            return self.hi[-1] + self.lo[-1]
        return (self.hi[-1] - self.hi[i - 1]) + (self.lo[-1] - self.lo[i - 1])


class ExactPrefix:
    def __init__(self) -> None:
        self.fixed = FixedPoint()
        self.ends: list[int] = []

    def append(self, v: float) -> None:
        units, grow = self.fixed.units(v)
        if grow:
            self.ends = [e << grow for e in self.ends]
        self.ends.append((self.ends[-1] if self.ends else 0) + units)

    def window(self, w: int) -> float:
        i = len(self.ends) - w
        return self.fixed.to_float(self.ends[-1] - (self.ends[i - 1] if i else 0))


class FsumWindow:
    def __init__(self) -> None:
        self.values: list[float] = []
        self.ts: list[int] = []

    def append(self, v: float) -> None:
        self.ts.append(len(self.values))
        self.values.append(v)

    def window(self, w: int) -> float:
        i = bisect.bisect_right(self.ts, len(self.values) - w - 1)  # the lookup a time window needs too
        return math.fsum(self.values[i:])


class WindowSum(Protocol):
    """What every approach offers: append a value, sum the last ``w``."""

    def append(self, v: float) -> None: ...

    def window(self, w: int) -> float: ...


KINDS: dict[str, Callable[[], WindowSum]] = {
    "float prefix (before)": FloatPrefix, "Neumaier prefix": NeumaierPrefix,
    "exact fixed-point prefix": ExactPrefix, "fsum of the window": FsumWindow,
}


def rate(step: Callable[[int], object], budget_s: float) -> float:
    done, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < budget_s or not done:
        for i in range(done, done + 256):
            step(i)
        done += 256
    return done / elapsed


def worst_error(make: Callable[[], WindowSum]) -> float:
    cases = [([1e15] * 10, [1.0] * 3), ([99.99] * 1000, [0.1, 0.2]), ([1e15] * 200_000, [1e-3] * 5)]
    worst = 0.0
    for history, window in cases:
        s = make()
        for v in history + window:
            s.append(v)
        want = math.fsum(window)
        worst = max(worst, abs(s.window(len(window)) - want) / want)
    return worst


def _append_nth(s: WindowSum, values: list[float], i: int) -> None:
    s.append(values[i & 16383])


def _sum_last(s: WindowSum, w: int, _i: int) -> float:
    return s.window(w)


def main(budget_s: float = 0.3) -> None:
    rng = random.Random(5)
    values = [10 ** rng.uniform(-3, 15) for _ in range(1 << 14)]
    widths = [16, 256, 4096]
    rows = []
    for name, make in KINDS.items():
        s = make()
        for v in values:
            s.append(v)
        fresh = make()
        row: list[object] = [name, rate(partial(_append_nth, fresh, values), budget_s)]
        for w in widths:
            row.append(rate(partial(_sum_last, s, w), budget_s))
        row.append(f"{worst_error(make):.1e}")
        rows.append(row)
    table("Window sums of one key: appends/s, window sums/s by window length, worst relative error vs fsum",
          ["approach", "appends/s", *(f"W={w} sums/s" for w in widths), "worst rel. error"], rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short budgets (a smoke run)")
    add_markdown_option(parser)
    quick = parser.parse_args().quick
    with markdown_run():
        main(0.02 if quick else 0.3)
