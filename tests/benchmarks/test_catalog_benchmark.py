"""The catalog benchmark still runs, and a change sends Redis less than the whole catalog did."""

from __future__ import annotations

from tests.benchmarks.quick import run_quick


def test_quick_run_prints_the_three_tables() -> None:
    stdout = run_quick("catalog.py")
    for title in ("Publishing one change", "A reader catching up", "Shard:"):
        assert title in stdout
    rows = {line.strip().split("  ")[0]: line.split() for line in stdout.splitlines()
            if line.strip().startswith(("before: whole snapshot", "after: diff"))}
    assert float(rows["after: diff"][-1]) < float(rows["before: whole snapshot"][-1]) / 10  # KB to Redis per change
