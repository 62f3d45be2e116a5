"""Printing benchmark results: aligned tables and latency percentiles."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np


def cell(c: object) -> str:
    return f"{c:,.0f}" if isinstance(c, float) and abs(c) >= 100 else f"{c:.3g}" if isinstance(c, float) else str(c)


def table(title: str, header: list[str], rows: list[list[object]]) -> None:
    cells = [header] + [[cell(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    print(f"\n{title}")
    print("  ".join(h.ljust(w) for h, w in zip(cells[0], widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in cells[1:]:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
    sys.stdout.flush()


def markdown_table(title: str, header: list[str], rows: list[list[object]]) -> None:
    """The same table as markdown, to paste into the README."""
    print(f"\n{title}\n")
    print("| " + " | ".join(header) + " |")
    print("|:---|" + "|".join("---:" for _ in header[1:]) + "|")
    for row in rows:
        print("| " + " | ".join(cell(c) for c in row) + " |")
    sys.stdout.flush()


Table = tuple[str, list[str], list[list[object]]]


def print_tables(tables: Sequence[Table], *, markdown: bool, source: str) -> None:
    """Every table aligned, then (with ``markdown``) again as markdown under a comment naming ``source``."""
    for title, header, rows in tables:
        table(title, header, rows)
    if markdown:
        print(f"\n<!-- {source} -->")
        for title, header, rows in tables:
            markdown_table(title, header, rows)


def percentiles(seconds: Sequence[float], qs: Sequence[float] = (50, 99), scale: float = 1e6) -> list[float]:
    """Percentiles ``qs`` of durations given in seconds, in units of 1/``scale`` s (default µs)."""
    array = np.asarray(seconds) * scale
    return [float(np.percentile(array, q)) for q in qs]
