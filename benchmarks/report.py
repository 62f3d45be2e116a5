"""Printing benchmark results: aligned tables, latency percentiles, and the run's section of docs/benchmarks.md.

Every table a benchmark prints is also recorded, so ``--markdown PAGE`` (``add_markdown_option``) can write the run
as markdown into its own section of the benchmarks page (``markdown_run``), headed by what makes a number mean
something: the command, the date, the machine and its load. ``--markdown`` alone prints that section instead.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

Table = tuple[str, list[str], list[list[object]]]

PAGE = "docs/benchmarks.md"
recorded: list[Table] = []  # every table printed by this process, in order
_target: list[str] = []  # where --markdown asked the run to go ("-": stdout)


def cell(c: object) -> str:
    return f"{c:,.0f}" if isinstance(c, float) and abs(c) >= 100 else f"{c:.3g}" if isinstance(c, float) else str(c)


def table(title: str, header: list[str], rows: list[list[object]]) -> None:
    recorded.append((title, header, rows))
    cells = [header] + [[cell(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    print(f"\n{title}")
    print("  ".join(h.ljust(w) for h, w in zip(cells[0], widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in cells[1:]:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
    sys.stdout.flush()


def markdown_table(title: str, header: list[str], rows: list[list[object]]) -> str:
    """One table as markdown, under its title."""
    lines = [title, "", "| " + " | ".join(header) + " |", "|:---|" + "|".join("---:" for _ in header[1:]) + "|"]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def print_tables(tables: Sequence[Table]) -> None:
    """Every table aligned (and recorded for ``--markdown``)."""
    for title, header, rows in tables:
        table(title, header, rows)


def percentiles(seconds: Sequence[float], qs: Sequence[float] = (50, 99), scale: float = 1e6) -> list[float]:
    """Percentiles ``qs`` of durations given in seconds, in units of 1/``scale`` s (default µs)."""
    array = np.asarray(seconds) * scale
    return [float(np.percentile(array, q)) for q in qs]


@dataclass(frozen=True)
class RunInfo:
    """What a reader needs to weigh a run's numbers: how it was started, when, where, beside how much else."""

    command: str
    started: str  # "2026-11-27 11:46 UTC"
    machine: str  # "AMD EPYC 7B13, 2 cores"
    load: str  # "load average 1.4 at the start, 4.1 at the end"

    def header(self, *, note: str = "") -> str:
        return (f"**Latest run**{note}: `{self.command}`, {self.started}, on {self.machine}; {self.load}.")


def machine() -> str:
    """The CPU model and the cores this process sees (the model from /proc/cpuinfo where there is one)."""
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{model}, {os.cpu_count()} cores"


def section(name: str, info: RunInfo, tables: Sequence[Table], *, note: str = "") -> str:
    """A benchmark's section of the benchmarks page: the run's header, then every table (pure)."""
    del name  # the markers carry it
    return "\n\n".join([info.header(note=note), *(markdown_table(*t) for t in tables)])


def replace_section(page: str, name: str, text: str) -> str:
    """``page`` with benchmark ``name``'s section (between its two markers) replaced by ``text`` (pure).

    A page without the section gets it appended under a heading of its own, so a new benchmark needs no hand edit.
    """
    begin, end = f"<!-- benchmark:{name} -->", f"<!-- /benchmark:{name} -->"
    block = f"{begin}\n{text.strip()}\n{end}"
    if page.count(begin) > 1 or page.count(end) > 1:
        raise ValueError(f"{name}: its markers appear more than once; leave one {begin} ... {end}")
    start = page.find(begin)
    if start < 0:
        if end in page:
            raise ValueError(f"{name}: {end} without {begin}")
        return page.rstrip("\n") + f"\n\n## {name}\n\n{block}\n"
    stop = page.find(end, start)
    if stop < 0:
        raise ValueError(f"{name}: {begin} without {end} after it")
    return page[:start] + block + page[stop + len(end):]


class _MarkdownTarget(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,  # noqa: ARG002
                 option_string: str | None = None) -> None:  # noqa: ARG002 (argparse's signature)
        _target[:] = [str(values)]
        setattr(namespace, self.dest, values)


def add_markdown_option(parser: argparse.ArgumentParser) -> None:
    """``--markdown [PAGE]``: write this run into its section of PAGE (docs/benchmarks.md), or alone print it."""
    parser.add_argument("--markdown", nargs="?", const="-", metavar="PAGE", action=_MarkdownTarget,
                        help=f"write this run's tables into its section of PAGE (e.g. {PAGE}, replacing the "
                             "previous run there), or with no PAGE print that section")


@contextmanager
def markdown_run(name: str | None = None) -> Iterator[None]:
    """Run a benchmark's ``main`` and, if ``--markdown`` was given, publish the tables it printed once it succeeds."""
    first = len(recorded)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = os.getloadavg()[0]
    yield
    if not _target or len(recorded) == first:  # no --markdown, or a run that printed nothing (a --json child)
        return
    name = name or Path(sys.argv[0]).stem
    info = RunInfo(command=shlex.join(["python", f"benchmarks/{name}.py", *sys.argv[1:]]), started=started,
                   machine=machine(),
                   load=f"load average {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
    text = section(name, info, recorded[first:])
    if _target[0] == "-":
        print(f"\n<!-- benchmark:{name} -->\n{text}\n<!-- /benchmark:{name} -->")
        return
    page = Path(_target[0])
    page.write_text(replace_section(page.read_text() if page.exists() else "# Benchmarks\n", name, text))
    print(f"\nwrote the {name} section of {page}")
