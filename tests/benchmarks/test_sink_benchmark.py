"""The sink micro-benchmark still runs, and a replayed batch stores nothing twice."""

from __future__ import annotations

from tests.benchmarks.quick import run_quick


def test_quick_run_prints_the_table() -> None:
    stdout = run_quick("sink.py")
    [row] = [line.split() for line in stdout.splitlines() if line.strip().startswith("50 ")]
    transitions, _, batches, new_us, cpu_us, replay_us, _, stored = (cell.replace(",", "") for cell in row)
    assert float(new_us) > 0 and float(cpu_us) > 0 and float(replay_us) > 0  # a slow run prints 1,602
    assert int(stored) == int(transitions) * int(batches)  # each batch written twice, stored once
