"""A benchmark's smoke run that outlives its deadline is interrupted, not killed: what it started, it stops."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.benchmarks.quick import run_quick

SCRIPT = """
import sys, time
from pathlib import Path
print("started", flush=True)
try:
    time.sleep(60)
finally:
    Path(sys.argv[0]).with_suffix(".stopped").write_text("cleaned up")
"""


def test_a_benchmark_past_its_deadline_runs_its_finally_blocks(tmp_path: Path) -> None:
    (tmp_path / "hangs.py").write_text(SCRIPT)
    with pytest.raises(subprocess.TimeoutExpired):
        run_quick("hangs.py", timeout_s=2, folder=tmp_path)
    assert (tmp_path / "hangs.stopped").read_text() == "cleaned up"  # a SIGKILL would have left none
