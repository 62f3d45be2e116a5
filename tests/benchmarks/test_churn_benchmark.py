"""The key-churn benchmark still runs and prints its table (its numbers are read, never asserted)."""

from __future__ import annotations

from tests.benchmarks.quick import run_quick


def test_quick_run_prints_the_table() -> None:
    stdout = run_quick("churn.py")
    assert "this checkout" in stdout and "SUM<v ms" in stdout
    table = stdout.split("this checkout")[1].strip().splitlines()[3:]
    assert len(table) == 5, "one row per fifth of the run"
