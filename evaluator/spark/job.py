"""The evaluator's Spark Structured Streaming query, composed from its stages.

    Kafka (Python data source, ``evaluator.spark.source``)
      -> parse + validate + pre-aggregate per (key, pane)        [mapInPandas, per Kafka partition]
         + each Kafka partition's progress, sent to every shard   (``evaluator.spark.parse``)
      -> stateful evaluation keyed by shard                      [transformWithStateInPandas, RocksDB]
         (collective indexes, see evaluator/shard.py)             (``evaluator.spark.operator``)
      -> transitions to Redis                                    [foreachBatch, idempotent]
                                                                  (``evaluator.spark.sink``)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.sql import SparkSession
from pyspark.sql import functions as F  # noqa: N812 - pyspark's customary alias
from pyspark.sql.streaming import StreamingQuery

from core.redis_schema import RedisKeys
from core.settings import Settings
from evaluator.spark.operator import ShardProcessor
from evaluator.spark.parse import PANES_SCHEMA, PaneParser
from evaluator.spark.sink import TRANSITIONS_SCHEMA, RedisAlertSink
from evaluator.spark.source import SOURCE_NAME, stop_file
from ingest.kafka import new_consumer, partitions_of


def shard_ids_for(spark: SparkSession, shards: int) -> tuple[int, ...]:
    """One shard id per shuffle partition: ids that Spark's hash partitioning spreads one to a partition."""
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions") or 200)  # 200: Spark's own default
    if shards > partitions:
        raise ValueError(f"{shards} shards need at least as many shuffle partitions (have {partitions})")
    rows = spark.range(0, 64 * partitions).selectExpr("id", f"pmod(hash(id), {partitions}) as p").collect()
    first: dict[int, int] = {}
    for row in rows:
        first.setdefault(row.p, row.id)
    return tuple(first[p] for p in sorted(first)[:shards])


POOL_VARIABLE = "TOCSIN_PYTHON_WORKER_POOL"


@contextmanager
def _worker_pool(spark: SparkSession, name: str | None) -> Iterator[None]:
    """Python functions defined inside draw their workers from a pool of their own (``name``; None: shared).

    Spark keeps one pool of idle Python workers per (interpreter, environment) and hands a task the
    oldest idle one; a function whose environment differs (``POOL_VARIABLE``, copied into the function
    when it is defined) gets its own pool, so the shard operator's tasks are not handed the workers
    that just read and parsed, and find their shard's cached copy more often (README: batching).
    """
    environment = spark.sparkContext.environment
    if name is not None:
        environment[POOL_VARIABLE] = name
    try:
        yield
    finally:
        environment.pop(POOL_VARIABLE, None)


def source_options(settings: Settings) -> dict[str, str]:
    """The Kafka source's options: each micro-batch takes what arrived, up to the admission cap.

    The cap (``TOCSIN_SOURCE_MAX_RECORDS_PER_TRIGGER``) matters only with a backlog (a restart, a
    burst): it drains in batches that large, each amortising Spark's fixed cost per batch, instead of
    one batch holding everything. Live, a batch holds what arrived during the previous one.
    """
    options = {
        "bootstrap": settings.kafka_bootstrap,
        "topic": settings.events_topic,
        "requestTimeoutMs": str(settings.kafka_request_timeout_ms),
        "maxRecordBytes": str(settings.max_record_bytes),
        "keepBytes": str(settings.dead_letter_raw_bytes),
        "stopFile": str(stop_file(settings).resolve()),
        "statsUrl": settings.redis_url,
        "statsKey": RedisKeys(settings).evaluator_stats,
        "statsCluster": str(settings.redis_cluster).lower(),
    }
    if settings.source_max_records_per_trigger:
        options["maxRecordsPerTrigger"] = str(settings.source_max_records_per_trigger)
    return options


def build_query(spark: SparkSession, settings: Settings) -> StreamingQuery:
    consumer = new_consumer(settings)
    try:
        partitions = len(partitions_of(consumer, settings.events_topic))
    finally:
        consumer.close()
    shard_ids = shard_ids_for(spark, settings.evaluator_shards or settings.spark_shuffle_partitions)
    reader = spark.readStream.format(SOURCE_NAME).options(**source_options(settings))
    panes = (
        reader.load()
        .select("topic", "partition", "offset", "value", "value_bytes", "value_sha256",
                F.unix_millis(F.current_timestamp()).alias("now"))  # the batch's clock: the same on replay
        .mapInPandas(PaneParser(settings, shard_ids), PANES_SCHEMA)
    )
    with _worker_pool(spark, "shard-operator" if settings.evaluator_own_python_workers else None):
        transitions = panes.groupBy("shard").transformWithStateInPandas(
            ShardProcessor(settings, partitions, shard_ids), TRANSITIONS_SCHEMA, "append", "None"
        )
    return (
        transitions.writeStream.foreachBatch(RedisAlertSink(settings))
        .option("checkpointLocation", str(settings.checkpoint_path))
        .trigger(processingTime=settings.trigger_interval)
        .queryName("tocsin-evaluator")
        .start()
    )
