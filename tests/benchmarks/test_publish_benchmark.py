"""The publishing benchmark still runs, and every event it had accepted is on the topic."""

from __future__ import annotations

import pytest

from tests.benchmarks.quick import run_quick


@pytest.mark.slow  # about 11 s (a web process and 100k records): CI runs it, a developer's default run not (kept under 15 minutes)
def test_quick_run_prints_the_tables_and_loses_nothing() -> None:
    stdout = run_quick("publish.py")
    rows = [line.split() for line in stdout.splitlines() if line.strip()[:1].isdigit()]
    http = [row for row in rows if len(row) == 8]
    assert [(int(row[0]), int(row[1])) for row in http] == [(1_000, 4), (5_000, 4), (10_000, 4), (10_000, 1)]
    for _batch, _clients, requests, events, per_second, p50, p99, _kib in http:
        assert int(requests) > 0 and int(events) >= 20_000
        assert float(per_second.replace(",", "")) > 0 and 0 < float(p50.replace(",", "")) <= float(p99.replace(",", ""))
    assert "(all there)" in stdout
    assert "confluent_kafka (librdkafka)" in stdout and "kafka-python" in stdout
