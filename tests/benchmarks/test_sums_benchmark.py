"""The exact-sum micro-benchmark still runs, and only the float prefix loses the issue's windows."""

from __future__ import annotations

from tests.benchmarks.quick import run_quick


def test_quick_run_prints_the_table_and_errors() -> None:
    stdout = run_quick("sums.py")
    rows = {line.strip().split("  ")[0]: line.split()[-1] for line in stdout.splitlines() if "prefix" in line
            or "fsum of" in line}
    assert float(rows["float prefix (before)"]) > 1e-3  # the defect the micro-benchmark shows
    assert float(rows["exact fixed-point prefix"]) == 0.0
    assert float(rows["fsum of the window"]) == 0.0
