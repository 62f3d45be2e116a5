"""The query's stateful stage: one shard per key of the stage (``evaluator.substreams.SubstreamShard``: a
``ShardEvaluator`` and one more per view its subscriptions use), kept in Spark's state store.

State per shard, in the RocksDB state store: a change log (``log``: batch number
-> what the batch changed) on top of a periodic snapshot (``base``), and a
``clock`` with the latest batch number. The evaluator structures themselves live
between batches in the shard's host (``evaluator.spark.shard_host``; or, with
``TOCSIN_EVALUATOR_SHARD_HOSTS=false`` or a host that cannot be reached, in the
Python worker that runs the task); a copy that is behind replays the log entries it
missed, one with no usable copy rebuilds from the snapshot
(``evaluator.spark.shard_runner``), so a batch writes only what it changed and state
never depends on which worker runs it.

Catching up is cheap: the shard's hot-path state is arrays (the pane store, the running
window aggregates, per-group values), so replaying a delta is array appends and scatter
updates plus the firing sets; the collective indexes are not replayed at all (they are
built from the store only when the index or naive plan needs them), and the snapshot is the store's
raw columns. A copy that replayed brings its groups' values to the last evaluated
boundary once, for the keys the replayed batches changed, before its next rows
(``ShardEvaluator._sync``), so its next batch costs what it costs a cached copy.

Each batch the shard also answers the condition previews it has not answered yet
(see ``evaluator.preview``; a preview that fails is answered with its error and never
fails the batch), and the operator emits its transitions followed by its clock for the
sink (see ``evaluator.spark.sink``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pandas as pd
import structlog
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import BinaryType, LongType, StructField, StructType

from core.gc_policy import apply_gc_policy, settle_after_task
from core.redis_schema import admission_waiting_field, catalog_read_field
from core.settings import Settings
from core.stream_names import TRADES
from evaluator.shard import ShardConfig
from evaluator.spark.catalog_source import shared_catalog_source
from evaluator.spark.counters import add_totals
from evaluator.spark.parse import NO_PARTITION, pane_rows
from evaluator.spark.registry import checkpoint_of
from evaluator.spark.shard_host import run_on_host
from evaluator.spark.shard_runner import BatchResult, ShardJob, ShardRunner
from evaluator.streams import StreamShape
from ingest.model import ATTRIBUTES

log = structlog.get_logger("evaluator")


@dataclass
class _SparkState:
    """The shard's snapshot and change log, as Spark's state store holds them (read only to rebuild or catch up)."""

    base: Any
    log: Any

    def snapshot(self) -> bytes | None:
        return self.base.get()[0] if self.base.exists() else None

    def log_entry(self, epoch: int) -> bytes | None:
        entry = self.log.getValue((epoch,))
        return None if entry is None else entry[0]


class ShardProcessor(StatefulProcessor):
    """transformWithStateInPandas keyed by shard: one :class:`SubstreamShard` per shard (a declared stream's keeps
    its pane rows per cell, so dimension filters, key prefixes and optional attributes are views of it)."""

    def __init__(self, settings: Settings, partitions: int, shard_ids: tuple[int, ...] = (),
                 stream: StreamShape | None = None, columns: tuple[str, ...] | None = None,
                 checkpoint: str | None = None) -> None:
        """``stream``: a declared stream's shape (None: ``trades``, today's query, its checkpoint
        ``settings.checkpoint_location``); its shards evaluate the subscriptions on that stream only. ``columns``:
        the pane rows' attributes (default the stream's). ``checkpoint``: what executors key their copies of the
        shards by (``registry.checkpoint_identity``; default the checkpoint's location)."""
        self.settings = settings
        # What the query evaluates: trades' attributes are fixed (a condition naming another is left out, logged)
        shape = stream if stream is not None else StreamShape(TRADES, ATTRIBUTES)
        config = ShardConfig.live(settings, columns or (stream.attributes if stream is not None else ATTRIBUTES),
                                  partitions)
        self.job = ShardJob(
            settings, config, checkpoint or checkpoint_of(settings, shape.name), shape.name, shape,
            optional=stream.optional if stream is not None else frozenset(),
            cells=stream is not None,  # a declared stream's parser writes cell rows (evaluator.views)
            shard_ids=shard_ids,  # the parser's hash partitioning: which keys each shard owns (NO DATA)
        )
        self.config = config

    def init(self, handle: StatefulProcessorHandle) -> None:
        apply_gc_policy(self.settings.python_gc_threshold)  # without hosts, this worker holds shards
        self.clock = handle.getValueState(
            "clock", StructType([StructField("epoch", LongType()), StructField("base_epoch", LongType())]))
        self.base = handle.getValueState("base", StructType([StructField("snapshot", BinaryType())]))
        self.log = handle.getMapState("log", StructType([StructField("epoch", LongType())]),
                                      StructType([StructField("delta", BinaryType())]))

    def _run(self, shard: int, epoch: int, base_epoch: int, frame: pd.DataFrame) -> tuple[BatchResult, int]:
        """The batch's result, from the shard's host or, without one, from this worker; and host failures (0/1)."""
        is_progress = frame["partition"].to_numpy() != NO_PARTITION
        newest = frame[is_progress].groupby("partition")["progress"].max()
        progress = {int(p): int(t) for p, t in newest.items()}
        rows = pane_rows(frame[~is_progress], self.config.attributes)
        state = _SparkState(self.base, self.log)
        if self.settings.evaluator_shard_hosts:
            try:
                return run_on_host(self.job, self.settings.evaluator_shard_host_idle_s, shard, epoch, base_epoch,
                                   rows, progress, state), 0
            except (OSError, EOFError) as error:  # no host, or it died (not ShardHostError: the batch's own failure)
                log.warning("shard_host_unavailable", shard=shard, error=repr(error))
                return ShardRunner(self.job).run(shard, epoch, base_epoch, rows, progress, state), 1
        return ShardRunner(self.job).run(shard, epoch, base_epoch, rows, progress, state), 0

    def handleInputRows(self, key: tuple, rows: Iterator[pd.DataFrame], timerValues) -> Iterator[pd.DataFrame]:  # noqa: ANN001, ARG002, N802, N803 - Spark's API
        started = time.perf_counter()
        (shard,) = key
        shard = int(shard)
        clock = self.clock.get() if self.clock.exists() else None
        opened = time.perf_counter()  # the first state access loads the partition's state store version
        epoch, base_epoch = clock if clock else (0, 0)
        result, host_failures = self._run(shard, epoch, base_epoch, pd.concat(list(rows), ignore_index=True))
        ran = time.perf_counter()

        if result.snapshot is not None:
            self.base.update((result.snapshot,))
            for old in range(base_epoch + 1, result.epoch):
                self.log.removeKey((old,))
        else:
            self.log.updateValue((result.epoch,), (result.delta,))
        self.clock.update((result.epoch, result.base_epoch))
        persisted = time.perf_counter()

        stats, how = result.stats, result.how
        restore_s = opened - started + result.restore_s
        source = shared_catalog_source(self.settings)
        keys = source.keys
        pipe = source.redis.pipeline(transaction=False)
        add_totals(pipe, keys, {
            "late_events_applied": stats.late_events, "late_events_dropped": stats.dropped_events,
            "invalid_events_dropped": stats.invalid_events, "boundaries": stats.boundaries,
            "candidates": stats.candidates, "matches": stats.matches, f"shard_restore_{how}": 1,
            "changed_keys": stats.changed_keys, "explicit_keys": stats.explicit_keys,
            "shard_host_failures": host_failures, "subscriptions_admitted": stats.admitted,
        })
        pipe.hset(keys.evaluator_stats, mapping={admission_waiting_field(self.job.stream_name, shard): stats.waiting,
                                                 catalog_read_field(self.job.stream_name, shard): result.catalog_version})
        # evaluate: the step and the previews, and the rest of the task's wait on its host (starting it when it was
        # not running, and the rows' transfer)
        for stage, seconds in (("restore", restore_s), ("evaluate", ran - opened - result.restore_s),
                               ("persist", persisted - ran)):
            pipe.hincrbyfloat(keys.evaluator_stats, f"{stage}_ms_total", round(seconds * 1000, 3))
        # Restore time by how, so start-up rebuilds can be told apart from steady-state catch-up, and the
        # part of it that is Spark opening the state store (reading the clock), which every batch pays.
        pipe.hincrbyfloat(keys.evaluator_stats, f"restore_{how}_ms_total", round(restore_s * 1000, 3))
        pipe.hincrbyfloat(keys.evaluator_stats, "restore_state_ms_total", round((opened - started) * 1000, 3))
        pipe.hincrbyfloat(keys.evaluator_stats, "restore_log_read_ms_total", round(result.log_read_s * 1000, 3))
        pipe.hincrbyfloat(keys.evaluator_stats, "shard_host_start_ms_total", round(result.connect_s * 1000, 3))
        pipe.hincrbyfloat(keys.evaluator_stats, "shard_host_transfer_ms_total",
                          round(max(ran - opened - result.restore_s - result.evaluate_s - result.connect_s, 0.0) * 1000, 3))
        pipe.hincrby(keys.evaluator_stats, "shard_batches", 1)
        source.outage.execute(pipe)
        yield result.output
        settle_after_task(self.settings.python_gc_full_interval_s)  # before PySpark's collection after the task

    def close(self) -> None:
        pass
