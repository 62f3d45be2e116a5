"""The query's first stage in Spark: raw Kafka records -> pane rows per shard (``mapInArrow``).

The judging and pre-aggregation are :class:`evaluator.records.RecordPanes` (pure, shared with
backtests); this adapter adds what only the live query does around them: dead letters to their
topic, the counters, the per-stream series limit and the clock marks of partitions ahead of time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

import pandas as pd
import pyarrow as pa
import redis

from core.clock_ahead import ClockAhead, mark, partition_source
from core.gc_policy import apply_gc_policy, settle_after_task
from core.redis_schema import RedisKeys
from core.series_limit import SeriesLimit
from evaluator.clock import bounded_progress
from evaluator.records import (  # re-exported: the Spark query's names for the pane layout
    NO_PARTITION,
    PANES_SCHEMA,
    ParsedRecords,
    RecordPanes,
    batch_clock,
    pane_rows,
    panes_schema,
    shard_of,
)
from evaluator.spark.catalog_source import shared_catalog_source
from evaluator.spark.counters import add_totals
from evaluator.views import split_cell
from ingest.model import DeadLetter, RecordLimits

__all__ = ["NO_PARTITION", "PANES_SCHEMA", "PaneParser", "ParsedRecords", "batch_clock", "pane_rows", "panes_schema",
           "shard_of"]


@lru_cache(maxsize=4)
def _dead_letter_producer(bootstrap: str) -> Any:  # one producer per worker process (kafka-python is untyped)
    from kafka import KafkaProducer

    return KafkaProducer(bootstrap_servers=bootstrap, acks="all")


class PaneParser(RecordPanes):
    """mapInArrow: :class:`RecordPanes` over each Arrow batch, its rejects sent to the dead-letter topic, at least
    once (a retried task may send one twice, never zero times, and counts it twice)."""

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        apply_gc_policy(self.settings.python_gc_threshold)  # the worker may hold shards too (one pool)
        for batch in batches:
            started = time.perf_counter()
            raw = batch.to_pandas()
            stats = shared_catalog_source(self.settings)  # its Redis client, key names and series registry
            parsed = self.parse(raw)
            parsed = stats.outage.ride_out(lambda: self.admit(parsed, raw, stats.series))  # noqa: B023 - called now
            pipe = stats.redis.pipeline(transaction=False)
            if parsed.dead:
                producer = _dead_letter_producer(self.settings.kafka_bootstrap)
                for letter in parsed.dead:
                    producer.send(self.settings.dead_letter_topic, value=letter.to_json())
                producer.flush()
                add_totals(pipe, stats.keys, {"dead_lettered": len(parsed.dead), **parsed.refused})
            progress = self._bounded(parsed, batch_clock(raw), pipe, stats.keys)
            rows = self._frame(parsed.events(), progress)
            pipe.hincrbyfloat(stats.keys.evaluator_stats, "parse_ms_total",  # the per-stage profile
                              round((time.perf_counter() - started) * 1000, 3))
            stats.outage.execute(pipe)
            yield rows
        settle_after_task(self.settings.python_gc_full_interval_s)  # before PySpark's collection after the task

    def admit(self, parsed: ParsedRecords, raw: pd.DataFrame, limit: SeriesLimit) -> ParsedRecords:
        """``parsed`` without the events of new series beyond the stream's limit (``core.series_limit``): those
        are dead letters, counted as ``series_refused``. One registry round trip per batch."""
        out = limit.refused_events(self.stream, parsed.keys, parsed.ts)
        if not out.any():
            return parsed
        letters = RecordLimits.of(self.settings)
        values, topics, partitions, offsets = (raw[c].to_numpy() for c in ("value", "topic", "partition", "offset"))
        dead = [DeadLetter.of(limit.reason(self.stream, *split_cell(cell)), values[row],
                              self._source(topics[row], partitions[row], offsets[row]), letters)
                for row, cell in zip(parsed.rows[out].tolist(), parsed.keys[out].tolist(), strict=True)]
        keep = ~out
        return ParsedRecords(parsed.rows[keep], parsed.keys[keep], parsed.ts[keep],
                             {a: v[keep] for a, v in parsed.values.items()}, parsed.progress,
                             parsed.dead + dead, {**parsed.refused, "series_refused": len(dead)})

    def _bounded(self, parsed: ParsedRecords, now: int, pipe: redis.client.Pipeline, keys: RedisKeys) -> dict[int, int]:
        """The batch's progress held to the processing clock (``evaluator.clock``); partitions whose records ran
        ahead of it are marked for the dead man's switch, and their events counted."""
        tolerance = self.settings.clock_tolerance_ms
        progress, ahead = bounded_progress(parsed.progress, now, tolerance)
        if ahead:
            seen = time.time()
            mark(pipe, keys, (ClockAhead(self.stream, partition_source(p), ms, seen) for p, ms in ahead.items()))
            add_totals(pipe, keys, {"events_ahead_of_clock": int((parsed.ts > now + tolerance).sum())})
        return progress
