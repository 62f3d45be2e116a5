"""``python -m evaluator.spark``: run the evaluator's streaming query until stopped.

SIGTERM or SIGINT stops it gracefully: the source stops offering records (a
stop file, see ``evaluator.spark.source.stop_file``), the batch under way
finishes and is committed, then the streaming query is stopped between batches
and the SparkContext after it, so the JVM (a child of this process) exits by
itself and the log ends with one ``evaluator_stopped`` line. Only a batch still
running after ``evaluator_stop_timeout_s`` (less a margin) is interrupted. From its start the driver records its
start (``evaluator:starts``, for the dead man's switch's restart rule) and beats a
heartbeat into ``stats:evaluator`` every second, so that "down" and "starting"
can be told apart (``core.evaluator_status``).

Streams: the query started here is ``trades``' (today's query; its failure fails the job). Every other
declared stream gets a query of its own from the stream supervisor
(``evaluator.spark.supervisor``), which reads the stream registry every ``TOCSIN_STREAM_REFRESH_S``;
a stopping job stops them all between batches too (docs/evaluator-streams.md).
"""

from __future__ import annotations

import json
import signal
import threading
import time

import redis
import structlog
from prometheus_client import Gauge
from pyspark.sql.streaming import StreamingQuery

from core import cli
from core.logs import configure_logging
from core.metrics import serve_metrics
from core.redis_client import make_redis
from core.redis_outage import Outage, is_transient
from core.redis_schema import RedisKeys, admission_waiting
from core.settings import get_settings
from core.stream_names import TRADES
from evaluator.spark.graceful import hold, wait_between_batches
from evaluator.spark.job import build_query
from evaluator.spark.registry import RegistryReader
from evaluator.spark.session import spark_session, stop_session
from evaluator.spark.source import stop_file
from evaluator.spark.supervisor import DeletedCheckpoints, StreamSupervisor
from ingest.kafka import ensure_topics

log = structlog.get_logger("evaluator")

INPUT_RATE = Gauge("tocsin_evaluator_input_rows_per_second", "Kafka records per second into the evaluator")
BATCH_SECONDS = Gauge("tocsin_evaluator_batch_seconds", "Duration of the last micro-batch")
BATCH_ID = Gauge("tocsin_evaluator_batch_id", "Id of the last micro-batch")
ADMISSION_WAITING = Gauge("tocsin_evaluator_admission_waiting", "New subscriptions not admitted yet, summed over the "
                          "stream's shards after their last batch (TOCSIN_EVALUATOR_ADMISSION_TRANSITIONS)", ["stream"])
#: Totals the shard operator and the sink keep in Redis (they run in Spark's Python workers).
TOTALS = {
    name: Gauge(f"tocsin_evaluator_{name}", help_text)
    for name, help_text in {
        "late_events_applied": "Events that arrived after their pane was evaluated and were applied by correction",
        "late_events_dropped": "Events older than every window still to be evaluated, dropped",
        "future_events_refused": "Events dated beyond the processing clock + TOCSIN_MAX_FUTURE_SKEW_MS, dead-lettered",
        "future_heartbeats_refused": "Heartbeats dated beyond the processing clock + TOCSIN_MAX_FUTURE_SKEW_MS, refused",
        "events_ahead_of_clock": "Events dated beyond the processing clock + TOCSIN_CLOCK_TOLERANCE_MS: kept, counted "
                                 "when the clock reaches them (a producer's clock runs fast; see docs/clock.md)",
        "series_refused": "Events of new series beyond a stream's TOCSIN_STREAM_MAX_SERIES, dead-lettered",
        "dead_lettered": "Records the evaluator sent to the dead-letter topic",
        "invalid_events_dropped": "Events with a non-finite value that reached a shard, dropped (should stay 0)",
        "boundaries": "Pane boundaries evaluated, summed over shards",
        "candidates": "Values computed to answer subscriptions (index candidates, or (key, subscription) pairs)",
        "matches": "(subscription, key) pairs in their condition, summed over evaluations",
        "changed_keys": "(group, key) values that changed at evaluated boundaries (the incremental plan's work)",
        "explicit_keys": "Changed values checked against the firing sets (after a replay or a key appearing)",
        "transitions": "Transitions written to Redis",
        "handed_over": "Transitions a batch handed over to be stored after it ends (a burst beyond "
                       "TOCSIN_SINK_BATCH_TRANSITIONS, and the later ones of its subscriptions)",
        "restore_ms_total": "Milliseconds spent restoring shards (cache catch-up or rebuild)",
        "evaluate_ms_total": "Milliseconds spent ingesting panes and evaluating",
        "persist_ms_total": "Milliseconds spent writing shard change logs and snapshots",
        "shard_host_failures": "Shard batches their shard host could not run (none could start, or it died): run "
                               "in the Python worker instead, from the state store",
        "subscriptions_admitted": "New subscriptions admitted by the shards (each shard admits for its own keys)",
    }.items()
}


def _json_text(value: object) -> str:
    """Spark reports a source's offsets as JSON text or as the parsed object, by version."""
    return value if isinstance(value, str) else json.dumps(value)


STARTS_KEPT = 50  # job starts remembered for the restart rule
STOP_MARGIN_S = 15.0  # left of the runner's stop timeout for stopping Spark itself


def _heartbeat(stats: redis.Redis, key: str, stop: threading.Event, outage: Outage) -> None:
    """Beat every second until stopped; a Redis outage costs beats, not the job."""
    while not stop.wait(1.0):
        try:
            stats.hset(key, "driver_heartbeat_at", time.time())
        except Exception as exc:
            if is_transient(exc):
                outage.failed(exc)
            elif isinstance(exc, redis.RedisError):
                log.warning("heartbeat_failed", error=f"{type(exc).__name__}: {str(exc)[:200]}")
            else:
                raise
        else:
            outage.recovered()


def _record_start(stats: redis.Redis, keys: RedisKeys) -> None:
    now = time.time()
    pipe = stats.pipeline()
    pipe.hset(keys.evaluator_stats, mapping={"driver_started_at": now, "driver_heartbeat_at": now})
    pipe.lpush(keys.evaluator_starts, now)
    pipe.ltrim(keys.evaluator_starts, 0, STARTS_KEPT - 1)
    pipe.execute()


def main(argv: list[str] | None = None) -> None:
    cli.no_arguments(__doc__, "python -m evaluator.spark", argv)
    configure_logging()
    settings = get_settings()
    log.info("deployment", id=settings.deployment)  # read once here: Spark's workers get it with their settings
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    stats = make_redis(settings)
    keys = RedisKeys(settings)
    outage = Outage("evaluator", settings, stats)
    stopping = stop_file(settings)
    for left in (stopping, stop_file(settings, TRADES)):  # left by a run that was killed: it would hold trades' query
        left.unlink(missing_ok=True)
    try:
        outage.ride_out(lambda: _record_start(stats, keys), stop)
    except Exception:
        if not stop.is_set():
            raise
        return
    beating = threading.Thread(target=_heartbeat, args=(stats, keys.evaluator_stats, stop, outage), daemon=True)
    beating.start()
    spark = query = supervisor = None
    try:
        serve_metrics(settings.metrics_port_evaluator, settings.metrics_bind_address)
        ensure_topics(settings)
        if stop.is_set():
            return
        spark = spark_session(settings)
        log.info("spark_session_ready")  # a restart's breakdown (benchmarks/driver_restart.py) times the phases by these
        if stop.is_set():
            return
        query = build_query(spark, settings)
        log.info("evaluator_started", topic=settings.events_topic, checkpoint=settings.checkpoint_location,
                 trigger=settings.trigger_interval, max_records_per_batch=settings.source_max_records_per_trigger)
        supervisor = StreamSupervisor(spark, settings, RegistryReader(stats, keys, settings), build_query,
                                      deleted=DeletedCheckpoints(spark, settings))
        _follow(query, stats, keys, stop, supervisor, settings.stream_refresh_s, outage)
    finally:
        stop.set()
        # Spark's own stop could hang (a JVM under memory pressure, a stuck task): it runs on a thread we
        # wait for only until shortly before the runner's timeout, so the log always says how the stop ended.
        stopper = threading.Thread(target=_shut_down_logged, daemon=True, args=(
            spark, query, stopping, settings.evaluator_stop_timeout_s - STOP_MARGIN_S, supervisor))
        stopper.start()
        stopper.join(max(settings.evaluator_stop_timeout_s - STOP_MARGIN_S / 3, 1.0))
        if stopper.is_alive():
            log.warning("evaluator_stop_incomplete", reason="Spark did not stop in time; the runner ends its JVM")
        stopping.unlink(missing_ok=True)
        log.info("evaluator_stopped")


def _shut_down_logged(spark, query, stopping, wait_s: float, supervisor=None) -> None:  # noqa: ANN001 - py4j-backed objects
    try:
        _shut_down(spark, query, stopping, wait_s, supervisor)
    except Exception as exc:  # noqa: BLE001 - e.g. the JVM was killed with us: nothing left to stop
        log.warning("evaluator_stop_failed", error=f"{type(exc).__name__}: {str(exc)[:200]}")


def _shut_down(spark, query, stopping, wait_s: float, supervisor=None) -> None:  # noqa: ANN001 - py4j-backed objects
    """Stop the queries between batches (or interrupt them after ``wait_s``), then the SparkContext."""
    queries = [q for q in [query, *(supervisor.queries().values() if supervisor else ())] if q is not None]
    if any(q.isActive for q in queries):
        hold(stopping)  # every query's source offers nothing more
        deadline = time.monotonic() + max(wait_s, 1.0)
        for each in queries:
            if not wait_between_batches(each, deadline):
                log.warning("evaluator_batch_interrupted", query=each.name,
                            reason="the batch under way outlived the stop timeout; it is evaluated again on restart")
            each.stop()
    if spark is not None:
        stop_session(spark)


def _follow(query: StreamingQuery, stats: redis.Redis, keys: RedisKeys, stop: threading.Event,
            supervisor: StreamSupervisor | None = None, refresh_s: float = 2.0, outage: Outage | None = None) -> None:
    """Publish each micro-batch's progress until stopped, and let the supervisor follow the stream registry every
    ``refresh_s``; raise if the (trades) query ended before ``stop``, with an error or without. Redis away (a node
    lost, a failover) costs published progress, not the job: the outage is logged once and the loop goes on."""
    last_batch = -1
    polled = float("-inf")
    while not stop.wait(min(1.0, refresh_s)) and query.isActive:
        if supervisor is not None and time.monotonic() - polled >= refresh_s:
            polled = time.monotonic()
            try:
                supervisor.poll()
            except Exception as exc:  # noqa: BLE001 - the other streams' trouble must not stop trades'
                log.warning("stream_supervisor_failed", error=f"{type(exc).__name__}: {str(exc)[:300]}")
        try:
            last_batch = _publish_progress(query, stats, keys, last_batch)
        except Exception as exc:
            if outage is None or not is_transient(exc):
                raise
            outage.failed(exc)
            outage.refresh()
            continue
        if outage is not None:
            outage.recovered()
    if stop.is_set():
        return
    # The query ended without being asked to: a failure even when Spark recorded no error (its stream thread
    # can die of an Error its own handler raised, e.g. a StackOverflowError matching a long message), so the
    # job exits non-zero and is restarted rather than going quiet.
    error = query.exception()
    raise RuntimeError(f"streaming query failed: {error}" if error else
                       f"streaming query {query.name} ended by itself, without an error recorded")


def _publish_progress(query: StreamingQuery, stats: redis.Redis, keys: RedisKeys, last_batch: int) -> int:
    """The evaluator's totals into its gauges, and the query's last progress into Redis if it is new; returns the
    last batch published (raises Redis's errors)."""
    totals = stats.hgetall(keys.evaluator_stats)
    for name, gauge in TOTALS.items():
        gauge.set(float(totals.get(name.encode(), 0)))
    for stream, waiting in admission_waiting(totals).items():
        ADMISSION_WAITING.labels(stream=stream).set(waiting)
    progress = query.lastProgress
    if not progress or progress["batchId"] == last_batch:
        return last_batch
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
        log.debug("batch", id=last_batch, rows=progress["numInputRows"], seconds=seconds)
    return last_batch


if __name__ == "__main__":
    main()
