"""The evaluator's shutdown is clean: no Java stack trace from Spark's state-store maintenance racing the stop."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from devstack.patience import patient
from tests.evaluator.spark.stateful_stop import STOPPING

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow  # a JVM of its own, ~15 s: run in CI (jvm, as every test under tests/evaluator/spark)
def test_stopping_the_session_after_a_stateful_query_logs_no_stack_trace(tmp_path: Path) -> None:
    # Before stop_session stopped the state stores first, maintenance firing during spark.stop() logged
    # "SparkEnv not active, cannot do maintenance on StateStores" with its trace (CI, test_runner's evaluator log).
    done = subprocess.run([sys.executable, "-m", "tests.evaluator.spark.stateful_stop", str(tmp_path)],
                          capture_output=True, text=True, timeout=patient(180), cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
    assert done.returncode == 0, done.stderr[-5000:]
    assert STOPPING in done.stderr, done.stderr[-5000:]
    stopping = done.stderr[done.stderr.index(STOPPING):]
    assert "\tat " not in stopping and "SparkEnv not active" not in stopping, stopping[-5000:]
