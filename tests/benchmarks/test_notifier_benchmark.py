"""The notifier benchmark still runs end to end and prints its tables (numbers are read, never asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quick_run_prints_every_table() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "notifier.py"), "--quick"],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert result.returncode == 0, result.stderr
    for title in ("Webhook deliveries", "E-mail deliveries", "Workers", "ratio vs naive", "p99 ms"):
        assert title in result.stdout
    assert "naive loop, receiver taking 50 ms" in result.stdout
