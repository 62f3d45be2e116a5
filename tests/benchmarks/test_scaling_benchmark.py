"""The scaling benchmark still runs end to end: 1 and 2 workers drain the stream, each beside the model's prediction."""

from __future__ import annotations

import pytest

from tests.benchmarks.quick import run_quick
from tests.benchmarks.test_pipeline_benchmark import number, table_rows


@pytest.mark.spark
@pytest.mark.slow  # two standalone clusters (master, workers, executors: separate JVMs), one after the other
@pytest.mark.timeout(900)  # the subprocess's own deadline, not the suite's 300 s (two clusters start on a slow machine)
def test_quick_run_measures_one_and_two_workers_beside_the_model() -> None:
    stdout = run_quick("scaling.py", timeout_s=900)
    assert "Per-core costs" in stdout and "Capacity model" in stdout  # the costs the prediction used
    rows = {cells[0]: cells[1:] for cells in table_rows(stdout, "Scaling on a standalone cluster")}
    assert set(rows) == {"1 x 1 core", "2 x 1 core"}
    for name, (alive, measured, model, ratio, _, _, batches, *_, finished) in rows.items():
        assert int(alive) == int(name[0]), (name, alive)  # every worker stayed up
        assert number(measured) > 0 and number(model) > 0 and number(ratio) > 0, (name, measured, model)
        assert int(batches) >= 2, rows[name]
        assert finished == "yes", (name, finished)  # the small stream is drained within the budget
    assert number(rows["1 x 1 core"][4]) == 1 and number(rows["1 x 1 core"][5]) == 1  # against itself
    assert 1 < number(rows["2 x 1 core"][5]) < 2  # the model: more cores help, never more than linearly

    where = {cells[0]: cells[1:] for cells in table_rows(stdout, "Where the time goes on the cluster")}
    assert set(where) == set(rows)
    for name, (model_us, read, parse, _, evaluate, _, stages, _, cpu, restores, rss) in where.items():
        assert all(number(c) > 0 for c in (model_us, read, parse, evaluate, stages, cpu, rss)), where[name]
        assert len(restores.split("/")) == 3, restores
