"""Kafka as a Spark Structured Streaming source, through PySpark's Python Data Source API.

Spark's own Kafka connector is a Maven artefact we cannot install, so the
source is written against ``pyspark.sql.datasource``:

- an offset is ``{"<partition>": next offset to read}`` for every partition, and ``"clock"``: the
  batch's processing clock (epoch ms), chosen with the batch's end offsets and so kept in Spark's offset
  log: every row carries it (``now``), and a replayed batch reads the same. (Selecting
  ``current_timestamp()`` instead puts a new literal in the query's generated code every batch: Spark
  compiles a new class a batch, which the JIT compiles again, half a core on a small-batch drain);
- ``latestOffset`` takes each partition's log end from Fetch high watermarks
  (:class:`ingest.kafka.LogEndProbe`, one client for the query's life, closed by ``stop``), which is right
  even on brokers whose ListOffsets stops at the last batch's base offset;
- ``partitions(start, end)`` makes one input partition per Kafka partition with
  new data, and ``read`` (librdkafka) assigns at the start and yields exactly the offsets in
  ``[start, end)`` as Arrow record batches, so a micro-batch is a deterministic function of its offset
  range and replays after a failure read the same records;
- a record larger than ``maxRecordBytes`` does not enter Spark whole: ``read``
  yields only its first ``keepBytes`` with its length and sha256 (``value_bytes``,
  ``value_sha256``), which is all its dead letter needs;
- ``maxRecordsPerTrigger`` is the admission cap: a micro-batch takes what is
  available up to it (fairly across partitions), so a backlog drains in several
  batches of the cap, under ``Trigger.AvailableNow`` too;
- with ``statsUrl`` and ``statsKey`` (a Redis hash), each slice adds its reading
  time and records to ``read_ms_total`` and ``read_rows`` (the per-stage profile);
- ``gcFullIntervalSeconds``: a read ends by freezing what its worker holds
  (``core.gc_policy.settle_after_task``), so PySpark's full collection after the task is cheap.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType
from typing_extensions import override  # typing.override is Python 3.12+

from core.gc_policy import settle_after_task
from ingest.kafka import LogEndProbe, new_reader
from ingest.raw_records import RawColumns

if TYPE_CHECKING:
    from core.settings import Settings

SOURCE_NAME = "tocsin_kafka"

RAW_SCHEMA = StructType(
    [
        StructField("topic", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("offset", LongType(), False),
        StructField("timestamp", LongType(), True),  # broker/producer time, epoch ms
        StructField("key", BinaryType(), True),
        StructField("value", BinaryType(), True),  # only the start of a record over the size limit
        StructField("value_bytes", LongType(), True),  # the record's whole length
        StructField("value_sha256", StringType(), True),  # set only for a record cut to its start
        StructField("now", LongType(), False),  # the batch's processing clock, epoch ms (the same on replay)
    ]
)

Offsets = dict[str, int]
#: The offsets' entry that is no partition: the batch's processing clock.
CLOCK = "clock"


def partition_offsets(offsets: Offsets) -> Offsets:
    """``offsets`` without the clock: ``{"<partition>": offset}``."""
    return {p: o for p, o in offsets.items() if p != CLOCK}


@dataclass(frozen=True)
class KafkaSlice(InputPartition):
    """Offsets ``[start, end)`` of one Kafka partition, read in the batch whose processing clock is ``clock``."""

    topic: str
    partition: int
    start: int
    end: int
    clock: int


def split_limit(start: Offsets, end: Offsets, max_rows: int) -> Offsets:
    """Cap the total records between ``start`` and ``end`` at ``max_rows``, fairly across partitions.

    Each round gives every partition with a backlog an equal share of what is
    left, so a hot partition cannot starve the others.
    """
    capped = dict(start)
    budget = max_rows
    backlog = {p: end[p] - start.get(p, 0) for p in end if end[p] > start.get(p, 0)}
    for p in end:
        capped.setdefault(p, start.get(p, 0))
    while budget > 0 and backlog:
        share = max(budget // len(backlog), 1)
        for p in sorted(backlog):
            take = min(share, backlog[p], budget)
            capped[p] += take
            backlog[p] -= take
            budget -= take
            if budget == 0:
                break
        backlog = {p: n for p, n in backlog.items() if n > 0}
    return capped


def stop_file(settings: Settings, stream: str | None = None) -> Path:
    """While this file exists the source offers no new records, so the query can stop between batches
    (``evaluator.spark.graceful``): the job's (every query stops), or one stream's (the supervisor stops its query)."""
    return settings.data_dir / ("evaluator.stopping" if stream is None else f"evaluator.stopping.{stream}")


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, str]) -> None:
        options = {k.lower(): v for k, v in options.items()}  # Spark may hand option names lower-cased
        self.bootstrap = options["bootstrap"]
        self.topic = options["topic"]
        self.starting = options.get("startingoffsets", "earliest")
        self.max_records = int(options["maxrecordspertrigger"]) if options.get("maxrecordspertrigger") else None
        self.request_timeout_ms = int(options.get("requesttimeoutms", "10000"))
        self.read_timeout_s = float(options.get("readtimeoutseconds", "60"))
        self.max_record_bytes = int(options["maxrecordbytes"]) if options.get("maxrecordbytes") else None
        self.keep_bytes = int(options.get("keepbytes", "4096"))
        self.stop_files = [path for path in (options.get("stopfile"), options.get("querystopfile")) if path]
        self.gc_full_interval_s = float(options.get("gcfullintervalseconds", "60"))
        self.query_run = options.get("queryrun", "")  # this query start's own slice readers (_ConsumerPool)
        self.stats = ((options["statsurl"], options["statskey"], options.get("statscluster") == "true")
                      if options.get("statsurl") else None)
        self._target: Offsets | None = None
        self._latest: Offsets | None = None
        self._probe: LogEndProbe | None = None  # the driver side's, made at its first question

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_probe": None}  # a client is no state: a pickled reader makes its own

    # -- driver side ------------------------------------------------------------

    def _log_ends(self) -> Offsets:
        if self._probe is None:
            self._probe = LogEndProbe(self.bootstrap, self.topic, self.request_timeout_ms / 1000, wait_for_topic=True,
                                      keep_client=True)
        return {str(partition): end for partition, end in self._probe.ends().items()}

    @override  # PySpark's data source API spells its methods in camelCase
    def stop(self) -> None:
        if self._probe is not None:
            self._probe.close()
            self._probe = None

    @override  # PySpark's data source API spells its methods in camelCase
    def initialOffset(self) -> Offsets:
        if self.starting == "latest":
            return self._log_ends()
        return dict.fromkeys(self._log_ends(), 0)

    @override  # PySpark's data source API spells its methods in camelCase
    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_records) if self.max_records else ReadAllAvailable()

    @override  # PySpark's data source API spells its methods in camelCase
    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._log_ends()

    @override  # PySpark's data source API spells its methods in camelCase
    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        if any(os.path.exists(path) for path in self.stop_files):  # the job or this query is stopping: no new batch
            return start
        end = self._target if self._target is not None else self._log_ends()
        planned = time.time()  # the batch's processing clock, if there is a batch: after every record it will read
        self._latest = end
        at = partition_offsets(start)
        behind = {p: (at[p], end[p]) for p in at if p in end and end[p] < at[p]}
        if behind:
            raise RuntimeError(
                f"{self.topic}: log ends {behind} (checkpointed, now) are before the checkpoint; the topic was "
                "recreated or truncated, so the checkpoint no longer describes it. Delete the checkpoint to restart."
            )
        end = {p: max(end.get(p, 0), at.get(p, 0)) for p in {*end, *at}}
        if isinstance(limit, ReadMaxRows):
            end = split_limit(at, end, limit.max_rows)
        if end == at:  # nothing new: no batch, so no new clock either (a new one alone would make a batch)
            return start
        return {**end, CLOCK: int(planned * 1000)}

    @override  # PySpark's data source API spells its methods in camelCase
    def reportLatestOffset(self) -> Offsets | None:
        return self._latest

    def partitions(self, start: Offsets, end: Offsets) -> list[KafkaSlice]:
        # Offsets checkpointed before the clock was kept with them have none: that one batch takes the time now
        clock = end.get(CLOCK) or int(time.time() * 1000)
        ends = partition_offsets(end)
        return [
            KafkaSlice(self.topic, int(p), start.get(p, 0), ends[p], clock)
            for p in sorted(ends, key=int)
            if ends[p] > start.get(p, 0)
        ]

    def commit(self, end: Offsets) -> None:
        """Nothing to do: progress lives in Spark's checkpoint, not in consumer groups."""

    # -- executor side ------------------------------------------------------------

    def read(self, partition: KafkaSlice) -> Generator[pa.RecordBatch, None, None]:  # type: ignore[override]  # Arrow, not tuples
        """Yield ``[start, end)`` of one partition as Arrow record batches (no per-row conversion in Spark).

        Records are fetched and decoded by librdkafka (``confluent_kafka``: ~2 µs of CPU a record where
        kafka-python took ~12, docs/benchmarks.md: *floor*). The consumer comes from this worker
        process's pool; it is assigned at the slice's start afresh for every slice, and returned to the pool
        only when the slice was read to its end, so a consumer an error or an abandoned read left in an
        unknown state is closed, never reused. Only records of this slice's partition within ``[start, end)``,
        each once and in order, are taken: a prefetched record of an earlier slice can never come back.
        """
        from confluent_kafka import KafkaError, KafkaException, TopicPartition

        consumer = _CONSUMERS.take(self._consumer_options())
        try:
            consumer.assign([TopicPartition(partition.topic, partition.partition, partition.start)])
            rows = RawColumns(RECORD_ARROW_SCHEMA)
            expected = partition.start  # the next offset due
            deadline = time.monotonic() + self.read_timeout_s
            busy, resumed = 0.0, time.perf_counter()  # reading time, not the time Spark holds us at a yield
            while expected < partition.end:
                taken = 0
                # consume() waits until it has num_messages or the timeout: ask for no more than the slice holds
                wanted = min(5_000, partition.end - expected)
                for message in consumer.consume(num_messages=wanted, timeout=0.2):
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            continue
                        raise KafkaException(error)
                    offset = message.offset()
                    if (message.partition() == partition.partition and message.topic() == partition.topic
                            and expected <= offset < partition.end):
                        rows.add(offset, message.timestamp(), message.key(), message.value(), self.max_record_bytes,
                                 self.keep_bytes)
                        expected = offset + 1
                        taken += 1
                        if len(rows) >= ARROW_BATCH_ROWS or rows.held_bytes >= ARROW_BATCH_BYTES:
                            batch = _clocked(rows.take(partition.topic, partition.partition), partition.clock)
                            busy += time.perf_counter() - resumed
                            yield batch
                            resumed = time.perf_counter()
                if taken:
                    deadline = time.monotonic() + self.read_timeout_s
                else:
                    [position] = consumer.position([TopicPartition(partition.topic, partition.partition)])
                    if position.offset >= partition.end:  # the slice ends in offsets with no record (a gap)
                        break
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{partition.topic}[{partition.partition}]: stuck at offset {expected} "
                                           f"before {partition.end}")
            if len(rows):
                batch = _clocked(rows.take(partition.topic, partition.partition), partition.clock)
                busy += time.perf_counter() - resumed
                yield batch
        except BaseException:  # includes GeneratorExit: a read abandoned half-way leaves the consumer mid-fetch
            consumer.close()
            raise
        try:
            consumer.unassign()  # idle in the pool: no fetching (and prefetching) in the background
        except KafkaException:  # the slice was read whole: a consumer in doubt is closed, not failed on
            consumer.close()
        else:
            _CONSUMERS.give(self._consumer_options(), consumer)
        if self.stats is not None:
            _add_read_stats(*self.stats, busy, partition.end - partition.start)
        settle_after_task(self.gc_full_interval_s)  # before PySpark's collection after the task (core/gc_policy.py)

    def _consumer_options(self) -> PoolKey:
        return (self.bootstrap, self.request_timeout_ms, self.query_run)


#: Rows per Arrow batch a read yields: large enough that per-batch costs vanish, small enough to stream.
ARROW_BATCH_ROWS = 50_000
#: Record bytes per Arrow batch, whichever limit comes first: 50,000 records of the largest size admitted
#: (``maxRecordBytes``, 64 KiB by default) would be 3.2 GB in one batch, a publisher's way to exhaust a worker.
ARROW_BATCH_BYTES = 64 << 20

RAW_ARROW_SCHEMA = to_arrow_schema(RAW_SCHEMA, timezone="UTC")  # what Spark checks yielded batches against
RECORD_ARROW_SCHEMA = pa.schema(list(RAW_ARROW_SCHEMA)[:-1])  # the records' own columns, without the clock


def _clocked(records: pa.RecordBatch, clock: int) -> pa.RecordBatch:
    """The records with the batch's processing clock on every row."""
    now = pa.array(np.full(records.num_rows, clock, dtype=np.int64))
    return pa.RecordBatch.from_arrays([*records.columns, now], schema=RAW_ARROW_SCHEMA)


def _add_read_stats(url: str, key: str, cluster: bool, seconds: float, records: int) -> None:
    """Add one slice's reading time to the stats hash; the profile never fails a read."""
    import redis

    try:
        pipe = _stats_client(url, cluster).pipeline(transaction=False)
        pipe.hincrbyfloat(key, "read_ms_total", round(seconds * 1000, 3))
        pipe.hincrby(key, "read_rows", records)
        pipe.execute()
    except redis.RedisError:
        pass


@functools.cache
def _stats_client(url: str, cluster: bool) -> Any:  # one client per worker process
    from core.redis_client import connect

    return connect(url, cluster, socket_timeout=2)


#: A slice reader's pool key: bootstrap, request timeout (ms), and the query start it reads for.
PoolKey = tuple[str, int, str]


class _ConsumerPool:
    """Idle slice readers (:func:`new_reader`) of this worker process, by connection options and query start.

    A consumer is taken out while a slice is read, so two reads never share one, and
    given back only after a clean read. One that sat idle longer than ``max_idle_s`` is
    closed rather than reused: its connections may have been dropped by the broker.
    Python workers outlive queries, and librdkafka 2.16 crashed the process (SIGSEGV) when a consumer that had
    read a topic was assigned it again after the topic was deleted and created anew (a stream deleted and declared
    again, its query started again): so a query start (``queryRun``, made by the job) never takes an earlier one's.
    """

    def __init__(self, max_idle_s: float = 300.0) -> None:
        self.max_idle_s = max_idle_s
        self._idle: dict[PoolKey, list[tuple[float, Any]]] = {}
        self._lock = threading.Lock()

    def take(self, options: PoolKey) -> Any:  # confluent_kafka's Consumer
        with self._lock:
            now = time.monotonic()
            for key in list(self._idle):  # what sat idle too long, an ended query's readers among them
                for since, consumer in [c for c in self._idle[key] if now - c[0] > self.max_idle_s]:
                    self._idle[key].remove((since, consumer))
                    consumer.close()
                if not self._idle[key]:
                    del self._idle[key]
            idle = self._idle.get(options)
            if idle:
                return idle.pop()[1]
        bootstrap, request_timeout_ms, _ = options
        return new_reader(bootstrap, request_timeout_ms)

    def give(self, options: PoolKey, consumer: Any) -> None:
        with self._lock:
            self._idle.setdefault(options, []).append((time.monotonic(), consumer))

    def close(self) -> None:
        """Close every idle consumer: before its broker goes away (a benchmark's, a test's), so librdkafka does not
        log failed reconnects until the process exits."""
        with self._lock:
            idle, self._idle = self._idle, {}
        for consumers in idle.values():
            for _, consumer in consumers:
                consumer.close()


_CONSUMERS = _ConsumerPool()


class KafkaDataSource(DataSource):
    """``spark.readStream.format("tocsin_kafka").option("bootstrap", ...).option("topic", ...)``."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        return RAW_SCHEMA

    @override  # PySpark's data source API spells its methods in camelCase
    def streamReader(self, schema: StructType) -> KafkaStreamReader:
        return KafkaStreamReader(dict(self.options))
