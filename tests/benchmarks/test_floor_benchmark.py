"""The floor benchmark still runs end to end: each pipeline of the evaluator's shape, live and draining, measured."""

from __future__ import annotations

import pytest

from tests.benchmarks.quick import run_quick
from tests.benchmarks.test_pipeline_benchmark import number, table_rows

PIPELINES = ["JVM only", "+ Python stage", "+ shuffle and Python state", "evaluator's shape"]


@pytest.mark.spark
@pytest.mark.slow  # about 2 minutes idle (Spark's start, eight phases of ~10 s): CI runs it, a developer's default run not
def test_quick_run_measures_every_pipeline_live_and_draining() -> None:
    stdout = run_quick("floor.py", timeout_s=600)
    live = {cells[0]: cells[1:] for cells in table_rows(stdout, "Live: rate source")}
    drain = {cells[0]: cells[1:] for cells in table_rows(stdout, "Drain:")}
    assert list(live) == PIPELINES and list(drain) == PIPELINES
    for name in PIPELINES:
        batches, rows, p50, *_ = live[name]
        assert number(batches) > 0 and number(rows) > 0 and number(p50) > 0, (name, live[name])
        size, batches, rows, _, per_wall_s, cpu_per_row, *_ = drain[name]
        assert number(size) == number(rows) == 10_000, (name, drain[name])  # --quick: rows per batch exactly as asked
        assert number(per_wall_s) > 0 and number(cpu_per_row) > 0, (name, drain[name])
