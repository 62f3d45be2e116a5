"""The shard benchmark still runs and prints every table (its numbers are read, never asserted)."""

from __future__ import annotations

from tests.benchmarks.quick import run_quick


def test_quick_run_prints_every_table() -> None:
    stdout = run_quick("shard.py")
    for title in ("High selectivity", "Ratios", "Key churn", "ms/boundary", "RSS MB",
                  "Realistic mix with issue-16 constructs", "naive / incremental",
                  "Baselines, a key against its own longer window", "Ranks: IN TOP/BOTTOM k", "scratch / books",
                  "The pipeline benchmark's drain mix in one shard", "scans/b"):
        assert title in stdout
    assert "60 s, 300 s" in stdout  # the baselines' two window lengths, each kept once whatever the subscriptions
    for plan in ("incremental", "index", "naive"):
        assert plan in stdout
