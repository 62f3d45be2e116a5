"""The paper benchmark still runs and prints every table (its numbers are read, never asserted)."""

from __future__ import annotations

from tests.benchmarks.quick import run_quick


def test_quick_run_prints_every_figure() -> None:
    stdout = run_quick("evaluator.py")
    for title in ("Fig. 9", "Fig. 10", "Fig. 11", "Fig. 12"):
        assert title in stdout
    assert "speed-up vs naive" in stdout
