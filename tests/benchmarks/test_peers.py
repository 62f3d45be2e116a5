"""The pipeline benchmark's Spark peer ends its query between batches."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import Producer

from benchmarks.peers import Threshold, spark_window_peer
from core.settings import Settings
from ingest.kafka import ensure_topics


@pytest.mark.spark
@pytest.mark.slow  # ~1 minute: CI runs it, a developer's default run not
def test_the_spark_peer_is_stopped_between_batches(spark, settings: Settings, tmp_path: Path) -> None:
    """Stopped inside a batch (its budget spent while batches ran back to back), the peer's stream thread died of a
    StackOverflowError: Spark matched a regex over the interrupted batch's message, which held the plan's 10,000
    thresholds (every full pipeline benchmark printed it, 2026-12-07). Its source now obeys a stop file, so the
    query is stopped between batches, as Tocsin's rows are: every batch its checkpoint planned (offsets/<id>) was
    committed (commits/<id>)."""
    ensure_topics(settings)
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, "linger.ms": 20})
    total = 60_000
    for i in range(total):
        key = f"K{i % 50}"
        producer.produce(settings.events_topic, key=key.encode(),
                         value=f'{{"key":"{key}","ts":{1_800_000_000_000 + i * 5},"price":1.0,"volume":1.0}}'.encode())
        if i % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    rows = [Threshold(n, "count", 1e9, None, None) for n in range(10_000)]  # never crossed: the plan's size only
    throughput, alerts, progress = spark_window_peer(
        spark, bootstrap=settings.kafka_bootstrap, topic=settings.events_topic, rows=rows, window_ms=60_000,
        delay_ms=1_000, rows_per_batch=2_000, checkpoint=tmp_path / "peer", total_rows=total, warm_up_rows=2_000,
        budget_s=1.0)
    assert progress and alerts == 0 and throughput.rows < total, "the budget ends the drain while batches run"
    planned, committed = ({int(f.name) for f in (tmp_path / "peer" / log).iterdir() if f.name.isdigit()}
                          for log in ("offsets", "commits"))
    assert planned == committed, f"batches {sorted(planned - committed)} were stopped inside"
