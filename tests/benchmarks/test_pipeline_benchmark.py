"""The pipeline benchmark still runs end to end and prints its tables (numbers are read, never asserted)."""

from __future__ import annotations

import pytest

from tests.benchmarks.quick import run_quick


@pytest.mark.spark
def test_quick_run_prints_every_table() -> None:
    stdout = run_quick("pipeline.py", timeout_s=900)
    for title in ("Sustained throughput", "Alert latency", "vs naive", "evaluate ms", "p99 s"):
        assert title in stdout
    assert "  naive  " in stdout and "  collective  " in stdout
