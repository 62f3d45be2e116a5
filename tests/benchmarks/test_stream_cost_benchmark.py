"""The stream-cost benchmark still runs end to end: the trades query alone, beside an idle stream's query started and
stopped by the stream supervisor, alone again; CPU and batches measured in each phase."""

from __future__ import annotations

import pytest

from tests.benchmarks.quick import run_quick
from tests.benchmarks.test_pipeline_benchmark import number, table_rows


@pytest.mark.spark
@pytest.mark.slow  # about 2 minutes idle (Spark's start, three phases of 15 s): CI runs it, a developer's default run not
def test_quick_run_measures_each_phase_and_the_cost_of_a_query() -> None:
    stdout = run_quick("stream_cost.py", timeout_s=600)
    phases = {cells[0]: cells[1:] for cells in table_rows(stdout, "CPU of the process tree per wall second")}
    assert list(phases) == ["trades alone", "with 1 idle streams", "trades alone again"]
    for name, (streams, cpu, *_, trades_batches, _, _, idle_batches, _, per_batch) in phases.items():
        assert int(streams) == (1 if name.startswith("with") else 0), (name, streams)
        assert number(cpu) > 0 and number(trades_batches) > 0 and number(per_batch) > 0, (name, phases[name])
        # the idle query ran only while its stream was declared: the supervisor stopped it once it was not
        assert (number(idle_batches) > 0) == name.startswith("with"), (name, idle_batches)
    [cost] = table_rows(stdout, "Cost of one idle stream query")
    assert cost[:2] == ["1 idle streams", "1"], cost
    assert number(cost[4]) > 0, cost  # the idle query's batches per second
