"""The running-windows benchmark still runs and prints its table (its numbers are read, never asserted)."""

from __future__ import annotations

from tests.benchmarks.quick import run_quick


def test_quick_run_prints_the_table() -> None:
    stdout = run_quick("windows.py")
    table = stdout.split("MIN/MAX recomputed from")[1].strip().splitlines()[2:]
    assert [line.split()[0] for line in table] == ["every", "block"], stdout
