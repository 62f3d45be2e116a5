"""``python -m evaluator.spark``: run the evaluator's streaming query until stopped."""

from __future__ import annotations

import json
import signal
import threading

import redis
import structlog
from prometheus_client import Gauge

from evaluator.spark.job import build_query
from evaluator.spark.session import spark_session
from infra.logs import configure_logging
from infra.metrics import serve_metrics
from infra.redis_schema import RedisKeys
from infra.settings import get_settings
from ingest.kafka import ensure_topics

log = structlog.get_logger("evaluator")

INPUT_RATE = Gauge("tocsin_evaluator_input_rows_per_second", "Kafka records per second into the evaluator")
BATCH_SECONDS = Gauge("tocsin_evaluator_batch_seconds", "Duration of the last micro-batch")
BATCH_ID = Gauge("tocsin_evaluator_batch_id", "Id of the last micro-batch")
#: Totals the shard operator and the sink keep in Redis (they run in Spark's Python workers).
TOTALS = {
    name: Gauge(f"tocsin_evaluator_{name}", help_text)
    for name, help_text in {
        "late_events_applied": "Events that arrived after their pane was evaluated and were applied by correction",
        "late_events_dropped": "Events older than every window still to be evaluated, dropped",
        "boundaries": "Pane boundaries evaluated, summed over shards",
        "candidates": "Values computed to answer subscriptions (index candidates, or (key, subscription) pairs)",
        "matches": "(subscription, key) pairs in their condition, summed over evaluations",
        "transitions": "Transitions written to Redis",
        "restore_ms_total": "Milliseconds spent restoring shards (cache catch-up or rebuild)",
        "evaluate_ms_total": "Milliseconds spent ingesting panes and evaluating",
        "persist_ms_total": "Milliseconds spent writing shard change logs and snapshots",
    }.items()
}


def _json_text(value: object) -> str:
    """Spark reports a source's offsets as JSON text or as the parsed object, by version."""
    return value if isinstance(value, str) else json.dumps(value)


def main() -> None:
    configure_logging()
    settings = get_settings()
    log.info("deployment", id=settings.deployment)  # read once here: Spark's workers get it with their settings
    serve_metrics(settings.metrics_port_evaluator)
    ensure_topics(settings)
    spark = spark_session(settings)
    query = build_query(spark, settings)
    stats = redis.Redis.from_url(settings.redis_url)
    keys = RedisKeys(settings)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    log.info("evaluator_started", topic=settings.events_topic, checkpoint=str(settings.checkpoint_path))
    last_batch = -1
    try:
        while not stop.wait(1.0) and query.isActive:
            totals = stats.hgetall(keys.evaluator_stats)
            for name, gauge in TOTALS.items():
                gauge.set(float(totals.get(name.encode(), 0)))
            progress = query.lastProgress
            if not progress or progress["batchId"] == last_batch:
                continue
            last_batch = progress["batchId"]
            seconds = progress["durationMs"].get("triggerExecution", 0) / 1000
            INPUT_RATE.set(progress.get("processedRowsPerSecond") or 0)
            BATCH_SECONDS.set(seconds)
            BATCH_ID.set(last_batch)
            source = (progress.get("sources") or [{}])[0]
            stats.hset(
                keys.evaluator_stats,
                mapping={
                    "batch_seconds": seconds,
                    "input_rows": progress.get("numInputRows", 0),
                    "rows_per_second": progress.get("processedRowsPerSecond") or 0,
                    # {partition: next offset} read through: with the log ends, the dashboards' Kafka lag
                    "source_offsets": _json_text(source.get("endOffset") or {}),
                },
            )
            if progress.get("numInputRows"):
                log.info("batch", id=last_batch, rows=progress["numInputRows"], seconds=seconds)
        if query.exception():
            raise RuntimeError(f"streaming query failed: {query.exception()}")
    finally:
        if query.isActive:
            query.stop()
        spark.stop()
        log.info("evaluator_stopped")


if __name__ == "__main__":
    main()
