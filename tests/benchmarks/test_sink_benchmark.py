"""The sink micro-benchmark still runs, and a replayed batch stores nothing twice."""

from __future__ import annotations

from tests.benchmarks.quick import run_quick


def test_quick_run_prints_the_table() -> None:
    stdout = run_quick("sink.py")
    [row] = [line.split() for line in stdout.splitlines() if line.strip().startswith("50 ")]
    (transitions, _, batches, new_us, cpu_us, redis_us, writes_us, ceiling, kept_bytes, replay_us, _,
     stored) = (cell.replace(",", "") for cell in row)
    assert float(new_us) > 0 and float(cpu_us) > 0 and float(replay_us) > 0  # a slow run prints 1,602
    # Redis's share is part of the CPU, its writes part of Redis's, and its ceiling the inverse of its share
    assert 0 < float(writes_us) < float(redis_us) < float(cpu_us)
    assert abs(float(ceiling) * float(redis_us) / 1e6 - 1) < 0.05
    assert float(kept_bytes) > 0  # every stored alert costs the node memory until it expires or is trimmed
    assert int(stored) == int(transitions) * int(batches)  # each batch written twice, stored once
