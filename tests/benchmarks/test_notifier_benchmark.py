"""The notifier benchmark still runs end to end and prints its tables (numbers are read, never asserted)."""

from __future__ import annotations

import pytest

from tests.benchmarks.quick import run_quick


@pytest.mark.slow  # about 20 s (Celery workers and receivers): CI runs it, a developer's default run not (kept under 15 minutes)
def test_quick_run_prints_every_table() -> None:
    stdout = run_quick("notifier.py")
    for title in ("Webhook deliveries", "E-mail deliveries", "Workers", "ratio vs naive", "p99 ms"):
        assert title in stdout
    assert "naive loop, receiver taking 50 ms" in stdout
