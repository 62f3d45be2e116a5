"""The shard benchmark still runs and prints every table (its numbers are read, never asserted)."""

from __future__ import annotations

from tests.benchmarks.quick import run_quick


def test_quick_run_prints_every_table() -> None:
    stdout = run_quick("shard.py")
    for title in ("High selectivity", "Ratios", "Key churn", "ms/boundary", "RSS MB",
                  "Realistic mix with issue-16 constructs", "naive / incremental"):
        assert title in stdout
    for plan in ("incremental", "index", "naive"):
        assert plan in stdout
