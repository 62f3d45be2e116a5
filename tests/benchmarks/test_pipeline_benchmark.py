"""The pipeline benchmark still runs end to end and prints its tables (numbers are read, never asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.spark
def test_quick_run_prints_every_table() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "pipeline.py"), "--quick"],
        capture_output=True, text=True, timeout=900, check=False,
    )
    assert result.returncode == 0, result.stderr[-5_000:]
    for title in ("Sustained throughput", "Alert latency", "vs naive", "evaluate ms", "p99 s"):
        assert title in result.stdout
    assert "  naive  " in result.stdout and "  collective  " in result.stdout
