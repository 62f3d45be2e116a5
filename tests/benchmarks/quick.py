"""Running a benchmark script's smoke run in a subprocess, as a user would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: How long an interrupted benchmark may take to run its ``finally`` blocks (stop its Spark cluster, its stack).
INTERRUPT_GRACE_S = 60


def run_quick(script: str, timeout_s: float = 600, folder: Path = ROOT / "benchmarks", cwd: Path | None = None,
              unset: tuple[str, ...] = ()) -> str:
    """stdout of ``benchmarks/<script> --quick`` (run from ``cwd``, default this process's; without the environment
    variables ``unset``, as a user's shell would lack them), which must exit 0.

    Past ``timeout_s`` (or when the test's own timeout fires) the benchmark gets SIGINT, as from Ctrl-C, so it
    stops what it started: a standalone cluster's JVMs run in sessions of their own and would outlive a SIGKILL
    of the benchmark, loading the machine for every test after."""
    process = subprocess.Popen(
        [sys.executable, str(folder / script), "--quick"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
        env={name: value for name, value in os.environ.items() if name not in unset},
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except BaseException:  # TimeoutExpired, or pytest-timeout's Failed raised in this frame
        process.send_signal(signal.SIGINT)
        try:
            process.communicate(timeout=INTERRUPT_GRACE_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
        raise
    assert process.returncode == 0, stderr[-5_000:]
    return stdout
