"""The evaluator's Spark Structured Streaming query.

    Kafka (Python data source)
      -> parse + validate + pre-aggregate per (key, pane)        [mapInPandas, per Kafka partition]
         + each Kafka partition's progress, sent to every shard
      -> stateful evaluation keyed by shard                      [transformWithStateInPandas, RocksDB]
         (collective indexes, see evaluator/shard.py)
      -> transitions to Redis                                    [foreachBatch, idempotent]

Because Kafka partitions by key, one input partition holds all of a key's events
in a micro-batch, so the per-partition pre-aggregation is complete and the
shuffle carries one row per (key, pane) instead of one per event.

State per shard, in the RocksDB state store: a change log (``log``: batch number
-> what the batch changed) on top of a periodic snapshot (``base``), and a
``clock`` with the latest batch number. The evaluator structures themselves live
in the Python worker between batches; a worker whose copy is behind replays the
log entries it missed, one with no usable copy rebuilds from the snapshot, so a
batch writes only what it changed and state never depends on which worker runs it.
"""

from __future__ import annotations

import json
import time
import zlib
from collections.abc import Iterator
from functools import lru_cache

import numpy as np
import pandas as pd
import redis
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle, StreamingQuery
from pyspark.sql.types import BinaryType, LongType, StructField, StructType

from evaluator.panerows import PaneRows
from evaluator.shard import BatchStats, Delta, ShardConfig, ShardEvaluator
from evaluator.spark.catalog_source import CatalogSource
from evaluator.spark.source import stop_file
from core.redis_schema import HISTORY_LENGTH, PREVIEW_SHOWN, RedisKeys, shard_clock_field, shard_clocks
from core.settings import Settings
from ingest.kafka import new_consumer, partitions_of
from ingest.model import ATTRIBUTES, DeadLetter, Event, Heartbeat, RecordLimits, parse_record

STAT_FIELDS = ("count", *(f"{stat}_{a}" for a in ATTRIBUTES for stat in ("sum", "min", "max")))
EVENT_FIELDS = ("event_ts", *(f"event_{a}" for a in ATTRIBUTES))  # the pane's events, for QUANTILE and LAST

PANES_SCHEMA = (
    "shard long, key string, pane_start long, count long, "
    + ", ".join(f"{f} double" for f in STAT_FIELDS[1:])
    + ", event_ts array<long>, "
    + ", ".join(f"event_{a} array<double>" for a in ATTRIBUTES)
    + ", partition int, progress long"
)
PREVIEW_ANSWER_TTL_S = 60
TRANSITIONS_SCHEMA = (
    "alert_id string, subscription_id long, key string, state string, value double, "
    "window_start long, window_end long, evaluated_at long"
)
NO_PARTITION = -1  # the ``partition`` of a pane row; progress rows carry their Kafka partition
CLOCK_STATE = "clock"  # an output row carrying a shard's last evaluated boundary, not a transition


@lru_cache(maxsize=4)
def _dead_letter_producer(bootstrap: str):  # noqa: ANN202 - one producer per worker process
    from kafka import KafkaProducer

    return KafkaProducer(bootstrap_servers=bootstrap, acks="all")


def shard_of(key: str, shard_ids: tuple[int, ...]) -> int:
    return shard_ids[zlib.crc32(key.encode()) % len(shard_ids)]


def shard_ids_for(spark: SparkSession, shards: int) -> tuple[int, ...]:
    """One shard id per shuffle partition: ids that Spark's hash partitioning spreads one to a partition."""
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
    if shards > partitions:
        raise ValueError(f"{shards} shards need at least as many shuffle partitions (have {partitions})")
    rows = spark.range(0, 64 * partitions).selectExpr("id", f"pmod(hash(id), {partitions}) as p").collect()
    first: dict[int, int] = {}
    for row in rows:
        first.setdefault(row.p, row.id)
    return tuple(first[p] for p in sorted(first)[:shards])


def _add_totals(pipe: redis.client.Pipeline, keys: RedisKeys, counts: dict[str, int]) -> None:
    """Add each non-zero count to its total in ``stats:evaluator`` (the parser's and the shards' counters)."""
    for name, n in counts.items():
        if n:
            pipe.hincrby(keys.evaluator_stats, name, n)


class PaneParser:
    """mapInPandas: raw Kafka rows -> pane aggregates per shard, each partition's progress to every shard.

    Every record becomes an event, a heartbeat or a dead letter: :func:`ingest.model.parse_record`
    never raises, and anything unexpected in the per-record work here becomes a dead letter with
    an ``internal: ...`` reason, so a poison record costs that record only and a retried or
    restarted batch cannot crash on it again. Rejects go to the dead-letter topic, at least
    once: a retried task may send one twice, never zero times (and counts it twice).

    Time the outside cannot hijack. An event whose time is more than ``max_future_skew_ms``
    ahead of the processing clock is dead-lettered, and such a heartbeat refused (and
    dead-lettered); neither counts as progress, so a partition's progress, hence the
    watermark, never passes processing time + skew. The processing clock is the
    micro-batch's timestamp (``current_timestamp()``, which Structured Streaming fixes when
    it plans a batch and records in the offset log), not the wall clock: a batch re-run
    after a failure or a restart sees the same clock, refuses the same records and so
    yields the same pane rows, progress and transitions, with the same alert ids. (With the
    wall clock, an event refused by the first attempt could be accepted by the replay, and
    the replay's alerts would differ from those already written.) A backlog read late is
    judged against the time it is read, never refused for being old.
    """

    def __init__(self, settings: Settings, shard_ids: tuple[int, ...]) -> None:
        self.settings = settings
        self.shard_ids = shard_ids

    def __call__(self, frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        limits = RecordLimits.of(self.settings)
        skew = self.settings.max_future_skew_ms
        for raw in frames:
            events: list[tuple] = []
            progress: dict[int, int] = {}
            dead: list[DeadLetter] = []
            refused = {"future_events_refused": 0, "future_heartbeats_refused": 0}
            now = int(raw["now"].iat[0]) if len(raw) else 0  # one batch timestamp for every row
            for topic, partition, offset, value, size, digest in zip(
                raw["topic"], raw["partition"], raw["offset"], raw["value"], raw["value_bytes"], raw["value_sha256"]
            ):
                source = f"{topic}[{partition}]@{offset}"
                try:
                    if digest is not None:  # the source kept only the start of an oversized record
                        dead.append(DeadLetter.of(
                            f"record: {int(size)} bytes, more than the {limits.max_record_bytes} allowed",
                            value, source, limits, size=int(size), digest=digest))
                        continue
                    parsed = parse_record(value, source, limits)
                    if isinstance(parsed, DeadLetter):
                        dead.append(parsed)
                        continue
                    if parsed.ts - now > skew:
                        what = "heartbeat" if isinstance(parsed, Heartbeat) else "event"
                        refused[f"future_{what}s_refused"] += 1
                        dead.append(DeadLetter.of(
                            f"ts: {what} time {parsed.ts} is {parsed.ts - now} ms ahead of the processing clock "
                            f"({now}); at most {skew} allowed (TOCSIN_MAX_FUTURE_SKEW_MS)", value, source, limits))
                        continue
                    if isinstance(parsed, Event):
                        events.append((parsed.key, parsed.ts, *(getattr(parsed, a) for a in ATTRIBUTES)))
                    p = int(partition)
                    progress[p] = max(progress.get(p, parsed.ts), parsed.ts)
                except Exception as exc:  # noqa: BLE001 - a record must never fail the batch
                    dead.append(DeadLetter.of(f"internal: {type(exc).__name__}: {exc}", value, source, limits))
            if dead:
                producer = _dead_letter_producer(self.settings.kafka_bootstrap)
                for letter in dead:
                    producer.send(self.settings.dead_letter_topic, value=letter.to_json())
                producer.flush()
                stats = _catalog_source(self.settings)  # its Redis client and key names
                pipe = stats.redis.pipeline(transaction=False)
                _add_totals(pipe, stats.keys, {"dead_lettered": len(dead), **refused})
                pipe.execute()
            yield self._frame(events, progress)

    def _frame(self, events: list[tuple], progress: dict[int, int]) -> pd.DataFrame:
        columns = ["shard", "key", "pane_start", *STAT_FIELDS, *EVENT_FIELDS, "partition", "progress"]
        parts: list[pd.DataFrame] = []
        if events:
            pane_ms = self.settings.pane_ms
            df = pd.DataFrame.from_records(events, columns=["key", "ts", *ATTRIBUTES])
            df["pane_start"] = (df["ts"] // pane_ms) * pane_ms
            # by time within each (key, pane); among equal times in arrival order, so the last row is LAST's
            df = df.sort_values(["key", "pane_start", "ts"], kind="stable", ignore_index=True)
            spec: dict[str, tuple[str, str]] = {"count": ("ts", "size")}
            for a in ATTRIBUTES:
                spec.update({f"sum_{a}": (a, "sum"), f"min_{a}": (a, "min"), f"max_{a}": (a, "max")})
            panes = df.groupby(["key", "pane_start"], sort=False).agg(**spec).reset_index()
            ends = np.cumsum(panes["count"].to_numpy())
            if self.settings.quantile_max_window_ms:  # every event, for quantiles
                cuts = ends[:-1]
                for field, column in zip(EVENT_FIELDS, ("ts", *ATTRIBUTES), strict=True):
                    panes[field] = np.split(df[column].to_numpy(), cuts)
            else:  # only the newest event of each pane, for LAST
                newest = df.iloc[ends - 1]
                for field, column in zip(EVENT_FIELDS, ("ts", *ATTRIBUTES), strict=True):
                    panes[field] = [np.array([v]) for v in newest[column].to_numpy()]
            panes["shard"] = [shard_of(k, self.shard_ids) for k in panes["key"]]
            panes["partition"] = NO_PARTITION
            panes["progress"] = 0
            parts.append(panes)
        if progress:
            partitions, newest = zip(*progress.items())
            n = len(self.shard_ids)
            parts.append(pd.DataFrame({
                "shard": np.repeat(self.shard_ids, len(partitions)),
                "key": "",
                "pane_start": 0,
                "count": 0,
                **{f: 0.0 for f in STAT_FIELDS[1:]},
                **{f: [np.empty(0)] * (n * len(partitions)) for f in EVENT_FIELDS},
                "partition": np.tile(partitions, n),
                "progress": np.tile(newest, n),
            }))
        if not parts:
            return pd.DataFrame({c: pd.Series(dtype=object) for c in columns})
        frame = pd.concat(parts, ignore_index=True)[columns]
        frame["count"] = frame["count"].astype("int64")
        frame["partition"] = frame["partition"].astype("int32")
        return frame


def _flat(lists: pd.Series, dtype: type) -> np.ndarray:
    return np.concatenate(lists.to_list()).astype(dtype) if len(lists) else np.empty(0, dtype=dtype)


def pane_rows(frame: pd.DataFrame) -> PaneRows:
    lengths = np.fromiter((len(v) for v in frame["event_ts"]), dtype=np.int64, count=len(frame))
    return PaneRows(
        frame["key"].to_numpy(dtype=object),
        frame["pane_start"].to_numpy(dtype=np.int64),
        frame["count"].to_numpy(dtype=np.int64),
        np.vstack([frame[f"sum_{a}"].to_numpy(dtype=np.float64) for a in ATTRIBUTES]),
        np.vstack([frame[f"min_{a}"].to_numpy(dtype=np.float64) for a in ATTRIBUTES]),
        np.vstack([frame[f"max_{a}"].to_numpy(dtype=np.float64) for a in ATTRIBUTES]),
        np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        _flat(frame["event_ts"], np.int64),
        np.vstack([_flat(frame[f"event_{a}"], np.float64) for a in ATTRIBUTES]).reshape(len(ATTRIBUTES), -1),
    )


#: Each worker process's copies of the shards it has run, by (checkpoint, shard id), least recently used first.
_SHARDS: dict[tuple[str, int], ShardEvaluator] = {}
_SHARDS_KEPT = 16


_CATALOGS: dict[tuple[str, str], CatalogSource] = {}


def _catalog_source(settings: Settings) -> CatalogSource:
    """One catalog reader (and Redis client) per worker process and deployment."""
    key = (settings.redis_url, settings.redis_prefix)
    if key not in _CATALOGS:
        _CATALOGS[key] = CatalogSource(settings)
    return _CATALOGS[key]


class ShardProcessor(StatefulProcessor):
    """transformWithStateInPandas keyed by shard: one :class:`ShardEvaluator` per shard."""

    def __init__(self, settings: Settings, partitions: int) -> None:
        self.settings = settings
        self.config = ShardConfig(
            attributes=ATTRIBUTES,
            pane_ms=settings.pane_ms,
            horizon_ms=settings.max_window_ms,
            delay_ms=settings.watermark_delay_ms,
            partitions=partitions,
            p=settings.evaluator_p,
            collective=settings.evaluator_mode == "collective",
            value_retention_ms=settings.quantile_max_window_ms,
        )

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.clock = handle.getValueState(
            "clock", StructType([StructField("epoch", LongType()), StructField("base_epoch", LongType())]))
        self.base = handle.getValueState("base", StructType([StructField("snapshot", BinaryType())]))
        self.log = handle.getMapState("log", StructType([StructField("epoch", LongType())]),
                                      StructType([StructField("delta", BinaryType())]))

    def _restore(self, shard: int, epoch: int, base_epoch: int) -> tuple[ShardEvaluator, str]:
        """The shard as of ``epoch``: this worker's copy caught up, or rebuilt from the snapshot."""
        cached = _SHARDS.pop((str(self.settings.checkpoint_path), shard), None)
        if cached is not None and base_epoch <= cached.epoch <= epoch:
            evaluator, how = cached, "cached" if cached.epoch == epoch else "caught_up"
        else:
            evaluator = (ShardEvaluator.from_snapshot(self.config, self.base.get()[0]) if self.base.exists()
                         else ShardEvaluator(self.config))
            evaluator.epoch, how = base_epoch, "rebuilt"
        for missed in range(evaluator.epoch + 1, epoch + 1):
            evaluator.replay(Delta.from_bytes(self.log.getValue((missed,))[0]))
        evaluator.epoch = epoch
        return evaluator, how

    def handleInputRows(self, key: tuple, rows: Iterator[pd.DataFrame], timerValues) -> Iterator[pd.DataFrame]:  # noqa: ANN001, N802, N803
        started = time.perf_counter()
        (shard,) = key
        shard = int(shard)
        epoch, base_epoch = self.clock.get() if self.clock.exists() else (0, 0)
        evaluator, how = self._restore(shard, epoch, base_epoch)
        restored = time.perf_counter()

        frame = pd.concat(list(rows), ignore_index=True)
        is_progress = frame["partition"].to_numpy() != NO_PARTITION
        newest = frame[is_progress].groupby("partition")["progress"].max()
        progress = {int(p): int(t) for p, t in newest.items()}
        stats = BatchStats()
        source = _catalog_source(self.settings)
        transitions, delta = evaluator.step(pane_rows(frame[~is_progress]), progress, source.current(), stats)
        evaluated = time.perf_counter()

        epoch += 1
        if epoch - base_epoch >= self.settings.evaluator_snapshot_every:
            self.base.update((evaluator.snapshot(),))
            for old in range(base_epoch + 1, epoch):
                self.log.removeKey((old,))
            base_epoch = epoch
        else:
            self.log.updateValue((epoch,), (delta.to_bytes(),))
        self.clock.update((epoch, base_epoch))
        evaluator.epoch = epoch
        _SHARDS[(str(self.settings.checkpoint_path), shard)] = evaluator
        while len(_SHARDS) > _SHARDS_KEPT:  # copies of queries that stopped would otherwise stay forever
            del _SHARDS[next(iter(_SHARDS))]
        persisted = time.perf_counter()

        keys = source.keys
        pipe = source.redis.pipeline(transaction=False)
        _add_totals(pipe, keys, {
            "late_events_applied": stats.late_events, "late_events_dropped": stats.dropped_events,
            "invalid_events_dropped": stats.invalid_events, "boundaries": stats.boundaries,
            "candidates": stats.candidates, "matches": stats.matches, f"shard_restore_{how}": 1,
        })
        for stage, seconds in (("restore", restored - started), ("evaluate", evaluated - restored),
                               ("persist", persisted - evaluated)):
            pipe.hincrbyfloat(keys.evaluator_stats, f"{stage}_ms_total", round(seconds * 1000, 3))
        pipe.hincrby(keys.evaluator_stats, "shard_batches", 1)
        pipe.execute()
        self._answer_previews(source, shard, evaluator)
        records = [t.to_dict() for t in transitions]
        # The shard's clock travels with its output, so the sink reports it once the alerts are stored.
        records.append({"alert_id": "", "subscription_id": shard, "key": "", "state": CLOCK_STATE, "value": None,
                        "window_start": 0, "window_end": 0, "evaluated_at": evaluator.evaluated_at or 0})
        yield pd.DataFrame.from_records(records)

    def _answer_previews(self, source: CatalogSource, shard: int, evaluator: ShardEvaluator) -> None:
        """Answer the web app's condition previews this shard has not answered yet (see ``web.conditions``)."""
        keys = source.keys
        for request_id, condition, watch in source.previews(shard):
            at, matched, watched = evaluator.preview(condition, watch)
            shown = sorted(matched.items(), key=lambda kv: (-abs(kv[1]), kv[0]))[:PREVIEW_SHOWN]
            answer = {"shard": shard, "evaluated_at": at, "matches": shown, "total": len(matched),
                      "watched": watched}
            pipe = source.redis.pipeline()
            pipe.rpush(keys.preview_answers(request_id), json.dumps(answer))
            pipe.expire(keys.preview_answers(request_id), PREVIEW_ANSWER_TTL_S)
            pipe.execute()

    def close(self) -> None:
        pass


def evaluated_through(stats: dict[str, str], shards: int) -> int | None:
    """The last boundary every shard has evaluated and stored, from the clocks the sink writes."""
    clocks = shard_clocks(stats)
    return min(clocks) if len(clocks) == shards else None


_RECORD_TRANSITIONS = """
-- KEYS: the alert stream, then per transition its dedupe mark, firing hash, counters hash and history stream
-- ARGV: dedupe TTL, stream max length, history length, then per transition its payload, state and key
local written = 0
for i = 0, (#ARGV - 3) / 3 - 1 do
  local mark, firing, counters, history = KEYS[2 + 4 * i], KEYS[3 + 4 * i], KEYS[4 + 4 * i], KEYS[5 + 4 * i]
  local payload, state, key = ARGV[4 + 3 * i], ARGV[5 + 3 * i], ARGV[6 + 3 * i]
  if redis.call('SET', mark, '1', 'NX', 'EX', ARGV[1]) then
    redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', 'alert', payload)
    redis.call('XADD', history, 'MAXLEN', '~', ARGV[3], '*', 'alert', payload)
    if state == 'firing' then
      redis.call('HSET', firing, key, payload)
    else
      redis.call('HDEL', firing, key)
    end
    redis.call('HINCRBY', counters, state, 1)
    written = written + 1
  end
end
return written
"""


class RedisAlertSink:
    """foreachBatch: record transitions in Redis exactly once per alert id.

    A Lua script makes "seen?" and "record" atomic per transition, so a replayed
    micro-batch (after a crash between Redis and Spark's commit) adds nothing; it
    takes transitions in chunks, one round trip per chunk. (Its keys span hash
    slots: this needs a single Redis, not Redis Cluster.)
    """

    DEDUPE_TTL_S = 7 * 24 * 3600
    STREAM_MAXLEN = 1_000_000
    CHUNK = 2_000

    def __init__(self, settings: Settings) -> None:
        self.keys = RedisKeys(settings)
        self.redis = redis.Redis.from_url(settings.redis_url)
        self.script = self.redis.register_script(_RECORD_TRANSITIONS)

    def write(self, transitions: list[dict]) -> int:
        written = 0
        for first in range(0, len(transitions), self.CHUNK):
            keys, args = [self.keys.alerts_stream], [self.DEDUPE_TTL_S, self.STREAM_MAXLEN, HISTORY_LENGTH]
            for t in transitions[first : first + self.CHUNK]:
                sid = t["subscription_id"]
                keys += [self.keys.alert_mark(t["alert_id"]), self.keys.firing(sid), self.keys.counters(sid),
                         self.keys.history(sid)]
                args += [json.dumps(t, separators=(",", ":")), t["state"], t["key"]]
            written += int(self.script(keys=keys, args=args))
        return written

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        started = time.perf_counter()
        frame = batch.toPandas()
        is_clock = frame["state"] == CLOCK_STATE
        clocks = {shard_clock_field(sid): int(at) for sid, at in
                  zip(frame.loc[is_clock, "subscription_id"], frame.loc[is_clock, "evaluated_at"])}
        rows = frame[~is_clock].astype(object).where(frame[~is_clock].notna(), None).to_dict("records")
        for row in rows:
            for column in ("subscription_id", "window_start", "window_end", "evaluated_at"):
                row[column] = int(row[column])
            row["value"] = None if row["value"] is None else float(row["value"])
        written = self.write(rows) if rows else 0
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(self.keys.evaluator_stats, mapping={"last_batch_id": batch_id, "last_batch_at": time.time(), **clocks})
        pipe.hincrby(self.keys.evaluator_stats, "transitions", written)
        pipe.hincrbyfloat(self.keys.evaluator_stats, "sink_ms_total", (time.perf_counter() - started) * 1000)
        pipe.execute()


def build_query(spark: SparkSession, settings: Settings) -> StreamingQuery:
    consumer = new_consumer(settings)
    try:
        partitions = len(partitions_of(consumer, settings.events_topic))
    finally:
        consumer.close()
    shard_ids = shard_ids_for(spark, settings.evaluator_shards or settings.spark_shuffle_partitions)
    reader = (
        spark.readStream.format("tocsin_kafka")
        .option("bootstrap", settings.kafka_bootstrap)
        .option("topic", settings.events_topic)
        .option("requestTimeoutMs", str(settings.kafka_request_timeout_ms))
        .option("maxRecordBytes", str(settings.max_record_bytes))
        .option("keepBytes", str(settings.dead_letter_raw_bytes))
        .option("stopFile", str(stop_file(settings).resolve()))
    )
    if settings.source_max_records_per_trigger:
        reader = reader.option("maxRecordsPerTrigger", str(settings.source_max_records_per_trigger))
    panes = (
        reader.load()
        .select("topic", "partition", "offset", "value", "value_bytes", "value_sha256",
                F.unix_millis(F.current_timestamp()).alias("now"))  # the batch's clock: the same on replay
        .mapInPandas(PaneParser(settings, shard_ids), PANES_SCHEMA)
    )
    transitions = panes.groupBy("shard").transformWithStateInPandas(
        ShardProcessor(settings, partitions), TRANSITIONS_SCHEMA, "append", "None"
    )
    return (
        transitions.writeStream.foreachBatch(RedisAlertSink(settings))
        .option("checkpointLocation", str(settings.checkpoint_path))
        .trigger(processingTime=settings.trigger_interval)
        .queryName("tocsin-evaluator")
        .start()
    )
