"""Running a benchmark script's smoke run in a subprocess, as a user would."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_quick(script: str, timeout_s: float = 600) -> str:
    """stdout of ``benchmarks/<script> --quick``, which must exit 0."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--quick"],
        capture_output=True, text=True, timeout=timeout_s, check=False,
    )
    assert result.returncode == 0, result.stderr[-5_000:]
    return result.stdout
