"""The evaluator's Spark Structured Streaming query, composed from its stages.

    Kafka (Python data source, ``evaluator.spark.source``)
      -> parse + validate + pre-aggregate per (key, pane)        [mapInArrow, per Kafka partition]
         + each Kafka partition's progress, sent to every shard   (``evaluator.spark.parse``)
      -> stateful evaluation keyed by shard                      [transformWithStateInPandas, RocksDB]
         (collective indexes, see evaluator/shard.py)             (``evaluator.spark.operator``)
      -> transitions to Redis                                    [foreachBatch, idempotent]
                                                                  (``evaluator.spark.sink``)
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import structlog
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from core.redis_schema import RedisKeys
from core.settings import Settings
from core.stream_names import TRADES
from core.streams import StreamSchema, topic_name
from evaluator.spark.checkpoint_fs import CheckpointFiles
from evaluator.spark.operator import ShardProcessor
from evaluator.spark.parse import PANES_SCHEMA, PaneParser, panes_schema
from evaluator.spark.registry import (
    checkpoint_identity,
    checkpoint_partitions,
    query_attributes,
    shape_of,
    stream_checkpoint,
)
from evaluator.spark.sink import TRANSITIONS_SCHEMA, RedisAlertSink
from evaluator.spark.source import SOURCE_NAME, stop_file
from evaluator.spark.stream_parse import StreamPaneParser
from ingest.kafka import new_consumer, partitions_of

log = structlog.get_logger("evaluator")


def shard_ids_for(spark: SparkSession, shards: int, partitions: int) -> tuple[int, ...]:
    """One shard id per partition of the stateful stage: ids that Spark's hash partitioning spreads one to a
    partition."""
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
    that just read and parsed, and find their shard's cached copy more often (docs/evaluator.md: batch size).
    """
    environment = spark.sparkContext.environment
    if name is not None:
        environment[POOL_VARIABLE] = name
    try:
        yield
    finally:
        environment.pop(POOL_VARIABLE, None)


def source_options(settings: Settings, topic: str | None = None, stream: str = TRADES) -> dict[str, str]:
    """The Kafka source's options (of ``topic``, default the events topic; ``stream``: whose stop file it obeys
    beside the job's): each micro-batch takes what arrived, up to the admission cap.

    The cap (``TOCSIN_SOURCE_MAX_RECORDS_PER_TRIGGER``) matters only with a backlog (a restart, a
    burst): it drains in batches that large, each amortising Spark's fixed cost per batch, instead of
    one batch holding everything. Live, a batch holds what arrived during the previous one.
    """
    options = {
        "bootstrap": settings.kafka_bootstrap,
        "topic": topic or settings.events_topic,
        "requestTimeoutMs": str(settings.kafka_request_timeout_ms),
        "maxRecordBytes": str(settings.max_record_bytes),
        "keepBytes": str(settings.dead_letter_raw_bytes),
        "stopFile": str(stop_file(settings).resolve()),
        "queryStopFile": str(stop_file(settings, stream).resolve()),
        "statsUrl": settings.redis_url,
        "statsKey": RedisKeys(settings).evaluator_stats,
        "statsCluster": str(settings.redis_cluster).lower(),
        "gcFullIntervalSeconds": str(settings.python_gc_full_interval_s),
        "queryRun": uuid.uuid4().hex,  # this query start's own slice readers in the workers (source._ConsumerPool)
    }
    if settings.source_max_records_per_trigger:
        options["maxRecordsPerTrigger"] = str(settings.source_max_records_per_trigger)
    return options


def query_shards(spark: SparkSession, settings: Settings, checkpoint: CheckpointFiles) -> tuple[int, int]:
    """(shards, shuffle partitions) of a stream's query. A checkpoint keeps the partitions it was started with:
    Spark runs its stateful stage with them whatever the session says, so the parser must route keys to the same
    shards, or keys would move to shards without their windows (alerts silenced until the windows refill, state
    of the old shards orphaned). A changed ``TOCSIN_SPARK_SHUFFLE_PARTITIONS`` applies to new checkpoints only."""
    session = int(spark.conf.get("spark.sql.shuffle.partitions") or 200)  # 200: Spark's own default
    partitions = checkpoint_partitions(checkpoint) or session
    if partitions != session:
        log.warning("shuffle_partitions_fixed_by_checkpoint", location=checkpoint.location, checkpoint=partitions,
                    setting=session,
                    detail="the checkpoint's shards are kept; start from a new checkpoint to change them")
    return settings.evaluator_shards or partitions, partitions


def query_name(stream: str) -> str:
    return "tocsin-evaluator" if stream == TRADES else f"tocsin-stream-{stream}"


def stream_of_query(name: str) -> str:
    """The stream whose query :func:`query_name` named ``name``."""
    return TRADES if name == query_name(TRADES) else name.removeprefix(query_name(""))


def build_query(spark: SparkSession, settings: Settings, schema: StreamSchema | None = None) -> StreamingQuery:
    """The query of one stream: ``trades`` (``schema`` None or trades': today's query, topic, checkpoint and parser)
    or a declared stream (its topic, its checkpoint under ``streams/<name>``, its schema's parser and attributes,
    its share of the catalog). Each stream's query has its own source, shards, watermark and checkpoint."""
    stream = schema.name if schema is not None else TRADES
    topic = topic_name(stream, settings)
    consumer = new_consumer(settings)
    try:
        partitions = len(partitions_of(consumer, topic))
    finally:
        consumer.close()
    checkpoint = stream_checkpoint(spark, settings, stream)
    shard_ids = shard_ids_for(spark, *query_shards(spark, settings, checkpoint))
    if stream == TRADES or schema is None:
        parser, rows_schema, shape, columns = PaneParser(settings, shard_ids), PANES_SCHEMA, None, None
    else:
        shape, columns = shape_of(schema), query_attributes(checkpoint, schema)
        parser, rows_schema = StreamPaneParser(settings, shard_ids, schema, columns), panes_schema(columns)
    reader = spark.readStream.format(SOURCE_NAME).options(**source_options(settings, topic, stream))
    panes = (
        reader.load()
        .select("topic", "partition", "offset", "value", "value_bytes", "value_sha256", "now")  # now: the batch's clock
        .mapInArrow(parser, rows_schema)
    )
    with _worker_pool(spark, "shard-operator" if settings.evaluator_own_python_workers else None):
        transitions = panes.groupBy("shard").transformWithStateInPandas(
            ShardProcessor(settings, partitions, shard_ids, shape, columns, checkpoint_identity(checkpoint)),
            TRANSITIONS_SCHEMA, "append", "None"
        )
    return (
        transitions.writeStream.foreachBatch(RedisAlertSink(settings, stream, shard_ids))
        .option("checkpointLocation", checkpoint.location)
        .trigger(processingTime=settings.trigger_interval)
        .queryName(query_name(stream))
        .start()
    )
