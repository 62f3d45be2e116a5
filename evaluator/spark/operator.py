"""The query's stateful stage: one shard per key of the stage (``evaluator.substreams.SubstreamShard``: a
``ShardEvaluator`` and one more per view its subscriptions use), kept in Spark's state store.

State per shard, in the RocksDB state store: a change log (``log``: batch number
-> what the batch changed) on top of a periodic snapshot (``base``), and a
``clock`` with the latest batch number. The evaluator structures themselves live
in the Python worker between batches; a worker whose copy is behind replays the
log entries it missed, one with no usable copy rebuilds from the snapshot, so a
batch writes only what it changed and state never depends on which worker runs it.

Catching up is cheap: the shard's hot-path state is arrays (the pane store, the running
window aggregates, per-group values), so replaying a delta is array appends and scatter
updates plus the firing sets; the collective indexes are not replayed at all (they are
built from the store only when a preview needs them), and the snapshot is the store's
raw columns. A copy that replayed brings its groups' values to the last evaluated
boundary once, for the keys the replayed batches changed, before its next rows
(``ShardEvaluator._sync``), so its next batch costs what it costs a cached copy.

Each batch the operator also answers the condition previews its shard has not
answered yet (see ``evaluator.preview``), and emits its transitions followed by
its clock for the sink (see ``evaluator.spark.sink``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from functools import partial

import pandas as pd
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import BinaryType, LongType, StructField, StructType

from core.gc_policy import apply_gc_policy
from core.settings import Settings
from core.stream_names import TRADES
from evaluator.preview import PreviewAnswer
from evaluator.shard import BatchStats, ShardConfig
from evaluator.spark.catalog_source import CatalogSource, shared_catalog_source
from evaluator.spark.counters import add_totals
from evaluator.spark.parse import NO_PARTITION, pane_rows, shard_of
from evaluator.spark.registry import checkpoint_of
from evaluator.spark.sink import clock_record
from evaluator.streams import StreamShape
from evaluator.substreams import SubstreamDelta, SubstreamShard
from ingest.model import ATTRIBUTES

PREVIEW_ANSWER_TTL_S = 60

#: Each worker process's copies of the shards it has run, by (checkpoint, shard id, attributes), least recently
#: used first (a stream whose attributes changed restarts its query on the same checkpoint: its old copies are
#: not reused).
_SHARDS: dict[tuple[str, int, tuple[str, ...]], SubstreamShard] = {}
_SHARDS_KEPT = 16


def _owned(shard: int, shard_ids: tuple[int, ...], key: str) -> bool:
    return shard_of(key, shard_ids) == shard


class ShardProcessor(StatefulProcessor):
    """transformWithStateInPandas keyed by shard: one :class:`SubstreamShard` per shard (a declared stream's keeps
    its pane rows per cell, so dimension filters, key prefixes and optional attributes are views of it)."""

    def __init__(self, settings: Settings, partitions: int, shard_ids: tuple[int, ...] = (),
                 stream: StreamShape | None = None, columns: tuple[str, ...] | None = None) -> None:
        """``stream``: a declared stream's shape (None: ``trades``, today's query, its checkpoint
        ``settings.checkpoint_path``); its shards evaluate the subscriptions on that stream only. ``columns``: the
        pane rows' attributes (default the stream's)."""
        self.settings = settings
        self.shard_ids = shard_ids  # the parser's hash partitioning: which keys each shard owns (NO DATA)
        self.stream = stream
        # What the query evaluates: trades' attributes are fixed (a condition naming another is left out, logged)
        self.shape = stream if stream is not None else StreamShape(TRADES, ATTRIBUTES)
        self.stream_name = stream.name if stream is not None else TRADES
        self.checkpoint = str(checkpoint_of(settings, self.stream_name))
        self.config = ShardConfig(
            attributes=columns or (stream.attributes if stream is not None else ATTRIBUTES),
            pane_ms=settings.pane_ms,
            horizon_ms=settings.max_window_ms,
            delay_ms=settings.watermark_delay_ms,
            partitions=partitions,
            p=settings.evaluator_p,
            collective=settings.evaluator_mode == "collective",
            value_retention_ms=settings.quantile_max_window_ms,
            tuple_max_events=settings.tuple_max_events,
        )
        self.optional = stream.optional if stream is not None else frozenset()
        self.cells = stream is not None  # a declared stream's parser writes cell rows (evaluator.views)

    def init(self, handle: StatefulProcessorHandle) -> None:
        apply_gc_policy(self.settings.python_gc_threshold)  # this worker holds shards: many long-lived objects
        self.clock = handle.getValueState(
            "clock", StructType([StructField("epoch", LongType()), StructField("base_epoch", LongType())]))
        self.base = handle.getValueState("base", StructType([StructField("snapshot", BinaryType())]))
        self.log = handle.getMapState("log", StructType([StructField("epoch", LongType())]),
                                      StructType([StructField("delta", BinaryType())]))

    def _restore(self, shard: int, epoch: int, base_epoch: int) -> tuple[SubstreamShard, str, float]:
        """The shard as of ``epoch``: this worker's copy caught up, or rebuilt from the snapshot; and the seconds
        spent reading the change log from Spark's state (the rest of a catch-up is replaying it)."""
        cached = _SHARDS.pop((self.checkpoint, shard, self.config.attributes), None)
        if cached is not None and base_epoch <= cached.epoch <= epoch:
            evaluator, how = cached, "cached" if cached.epoch == epoch else "caught_up"
        else:
            base = self.base.get() if self.base.exists() else None
            # state written before the stream gained attributes is widened as it is read
            evaluator = (SubstreamShard.from_snapshot(self.config, base[0], self.optional, self.cells) if base
                         else SubstreamShard(self.config, self.optional, self.cells))
            evaluator.epoch, how = base_epoch, "rebuilt"
        reading = 0.0
        for missed in range(evaluator.epoch + 1, epoch + 1):
            asked = time.perf_counter()
            entry = self.log.getValue((missed,))
            reading += time.perf_counter() - asked
            assert entry is not None, f"shard {shard}: batch {missed} is missing from the change log"
            evaluator.replay(SubstreamDelta.from_bytes(entry[0], len(self.config.attributes)))
        evaluator.epoch = epoch
        return evaluator, how, reading

    def handleInputRows(self, key: tuple, rows: Iterator[pd.DataFrame], timerValues) -> Iterator[pd.DataFrame]:  # noqa: ANN001, ARG002, N802, N803 - Spark's API
        started = time.perf_counter()
        (shard,) = key
        shard = int(shard)
        clock = self.clock.get() if self.clock.exists() else None
        opened = time.perf_counter()  # the first state access loads the partition's state store version
        epoch, base_epoch = clock if clock else (0, 0)
        evaluator, how, log_read = self._restore(shard, epoch, base_epoch)
        if self.shard_ids:
            evaluator.owns = partial(_owned, shard, self.shard_ids)
        restored = time.perf_counter()

        frame = pd.concat(list(rows), ignore_index=True)
        is_progress = frame["partition"].to_numpy() != NO_PARTITION
        newest = frame[is_progress].groupby("partition")["progress"].max()
        progress = {int(p): int(t) for p, t in newest.items()}
        stats = BatchStats()
        source = shared_catalog_source(self.settings)
        catalog = source.share(self.stream_name, self.shape)
        transitions, delta = evaluator.step(pane_rows(frame[~is_progress], self.config.attributes), progress, catalog,
                                            stats)
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
        _SHARDS[(self.checkpoint, shard, self.config.attributes)] = evaluator
        while len(_SHARDS) > _SHARDS_KEPT:  # copies of queries that stopped would otherwise stay forever
            del _SHARDS[next(iter(_SHARDS))]
        persisted = time.perf_counter()

        keys = source.keys
        pipe = source.redis.pipeline(transaction=False)
        add_totals(pipe, keys, {
            "late_events_applied": stats.late_events, "late_events_dropped": stats.dropped_events,
            "invalid_events_dropped": stats.invalid_events, "boundaries": stats.boundaries,
            "candidates": stats.candidates, "matches": stats.matches, f"shard_restore_{how}": 1,
            "changed_keys": stats.changed_keys, "explicit_keys": stats.explicit_keys,
        })
        for stage, seconds in (("restore", restored - started), ("evaluate", evaluated - restored),
                               ("persist", persisted - evaluated)):
            pipe.hincrbyfloat(keys.evaluator_stats, f"{stage}_ms_total", round(seconds * 1000, 3))
        # Restore time by how, so start-up rebuilds can be told apart from steady-state catch-up, and the
        # part of it that is Spark opening the state store (reading the clock), which every batch pays.
        pipe.hincrbyfloat(keys.evaluator_stats, f"restore_{how}_ms_total", round((restored - started) * 1000, 3))
        pipe.hincrbyfloat(keys.evaluator_stats, "restore_state_ms_total", round((opened - started) * 1000, 3))
        pipe.hincrbyfloat(keys.evaluator_stats, "restore_log_read_ms_total", round(log_read * 1000, 3))
        pipe.hincrby(keys.evaluator_stats, "shard_batches", 1)
        pipe.execute()
        self._answer_previews(source, shard, evaluator, self.stream_name)
        records = [t.to_dict() | {"kind": t.kind} for t in transitions]  # every row has the sink's kind column
        # The shard's clock travels with its output, so the sink reports it once the alerts are stored.
        records.append(clock_record(shard, evaluator.evaluated_at or 0))
        yield pd.DataFrame.from_records(records)

    def _answer_previews(self, source: CatalogSource, shard: int, evaluator: SubstreamShard,
                         stream: str = TRADES) -> None:
        """Answer the web app's condition previews on ``stream`` (this query's) this shard has not answered yet
        (see ``web.conditions``)."""
        keys = source.keys
        for request_id, request in source.previews(shard, stream):
            answer = PreviewAnswer.of(shard, *evaluator.preview(request.condition, request.keys))
            pipe = source.redis.pipeline()
            pipe.rpush(keys.preview_answers(request_id), answer.to_json())
            pipe.expire(keys.preview_answers(request_id), PREVIEW_ANSWER_TTL_S)
            pipe.execute()

    def close(self) -> None:
        pass


