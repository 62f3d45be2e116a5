"""A topic's history read back by time: the records a backtest replays, in chunks as live micro-batches read them.

Where a time range starts in a partition is found by a binary search over the records'
timestamps (the first record at or after the time), not by Kafka's ListOffsets by timestamp:
Tansu, the broker we embed, answers every such lookup with offset 0. A search costs one small
fetch per step, ~25 steps for a partition of 30 million records. Timestamps are the records'
own (the producer's send time, or the broker's append time on a topic configured so), which
is when the live query could first have read them.

Records come out in chunks of ``chunk_ms`` of record time across every partition, each
partition's in offset order, as :data:`ingest.raw_records.RAW_ARROW_SCHEMA`'s columns plus
``now``, the chunk's processing clock (its end: the time a live batch reading it was planned,
at the earliest). A chunk is cut only when every partition has been read past its end (or to
the range's end), so one partition read ahead of another waits in memory, paused once it holds
``BUFFER_RECORDS``.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import pandas as pd
import pyarrow as pa

from core.settings import Settings
from ingest.kafka import new_reader, topic_end_offsets
from ingest.raw_records import RawColumns

#: Records one partition may hold ahead of the others before it is paused.
BUFFER_RECORDS = 200_000


class HistoryUnavailable(RuntimeError):
    """The broker did not answer, or a partition stopped short of the range's end."""


@dataclass(frozen=True)
class HistorySpan:
    """The offsets ``[first, end)`` of each partition of ``topic`` whose records fall in a time range."""

    topic: str
    start_ms: int
    end_ms: int
    offsets: dict[int, tuple[int, int]]

    @property
    def records(self) -> int:
        return sum(end - first for first, end in self.offsets.values())


def _first_timestamp(consumer: Any, topic: str, partition: int, offset: int, end: int,
                     timeout_s: float) -> tuple[int, int] | None:
    """The first record at or after ``offset`` (before ``end``): its offset and timestamp (None: none there)."""
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    consumer.assign([TopicPartition(topic, partition, offset)])
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for message in consumer.consume(num_messages=1, timeout=0.2):
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    return None
                raise KafkaException(error)
            if message.offset() >= end:
                return None
            kind, ms = message.timestamp()
            return message.offset(), ms if kind else 0
        [position] = consumer.position([TopicPartition(topic, partition)])
        if position.offset >= end:
            return None
    raise HistoryUnavailable(f"{topic}[{partition}]: no record at or after offset {offset} within {timeout_s:g} s")


def first_at(consumer: Any, topic: str, partition: int, ms: int, low: int, end: int, timeout_s: float) -> int:
    """The offset of the first record of ``[low, end)`` whose timestamp is ``ms`` or later (``end`` if none): a
    binary search, exact when the partition's timestamps do not decrease."""
    lo, hi = low, end
    while lo < hi:
        mid = (lo + hi) // 2
        found = _first_timestamp(consumer, topic, partition, mid, hi, timeout_s)
        if found is None:  # no record in [mid, hi): a gap (compaction, transactions)
            hi = mid
        elif found[1] >= ms:
            hi = found[0]
        else:
            lo = found[0] + 1
    return lo


def history_span(settings: Settings, topic: str, start_ms: int, end_ms: int, timeout_s: float = 10.0) -> HistorySpan:
    """Each partition's offsets of the records stamped in ``[start_ms, end_ms)`` (retention may have removed the
    oldest: the span then starts at the log's start)."""
    from confluent_kafka import KafkaException, TopicPartition

    ends = topic_end_offsets(settings, topic, timeout_s)
    consumer = new_reader(settings.kafka_bootstrap, settings.kafka_request_timeout_ms)
    try:
        offsets = {}
        for partition, end in sorted(ends.items()):
            low, _ = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout_s, cached=False)
            first = first_at(consumer, topic, partition, start_ms, max(low, 0), end, timeout_s)
            offsets[partition] = (first, first_at(consumer, topic, partition, end_ms, first, end, timeout_s))
        return HistorySpan(topic, start_ms, end_ms, offsets)
    except KafkaException as error:
        raise HistoryUnavailable(f"{topic}: {error}") from error
    finally:
        consumer.close()


@dataclass
class _Partition:
    end: int
    held: list[Any]  # messages read, not yet in a chunk (offset order)
    newest_ms: int | None = None  # the newest record time read
    done: bool = False  # read to its end
    paused: bool = False


def read_history(settings: Settings, span: HistorySpan, chunk_ms: int) -> Generator[pd.DataFrame, None, None]:
    """The span's records in chunks of ``chunk_ms`` of record time (see the module doc); closing the generator
    closes its consumer."""
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    parts = {p: _Partition(end, []) for p, (first, end) in span.offsets.items()}
    for p, (first, end) in span.offsets.items():
        parts[p].done = first >= end
    consumer = new_reader(settings.kafka_bootstrap, settings.kafka_request_timeout_ms)
    timeout_s = settings.kafka_request_timeout_ms / 1000 * 6
    try:
        consumer.assign([TopicPartition(span.topic, p, first) for p, (first, end) in span.offsets.items() if first < end])
        cut: int | None = None
        deadline = time.monotonic() + timeout_s
        while True:
            pending = [part for part in parts.values() if not part.done]
            if cut is None and all(part.held for part in pending):
                cut = _first_cut(parts, chunk_ms)
            while cut is not None and pending and all(part.newest_ms is not None and part.newest_ms >= cut
                                                      for part in pending):
                chunk = _take(parts, span.topic, cut, settings)
                cut += chunk_ms
                if chunk is not None:
                    yield chunk
                _resume(consumer, span.topic, parts)
                pending = [part for part in parts.values() if not part.done]
            if not pending:
                break
            messages = consumer.consume(num_messages=5_000, timeout=0.2)
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(error)
                part = parts[message.partition()]
                if part.done or message.offset() >= part.end:
                    continue
                part.held.append(message)
                kind, ms = message.timestamp()
                part.newest_ms = max(part.newest_ms or 0, ms if kind else 0)
                if message.offset() + 1 >= part.end:
                    part.done = True
                elif len(part.held) >= BUFFER_RECORDS and not part.paused:
                    consumer.pause([TopicPartition(span.topic, message.partition())])
                    part.paused = True
            if messages:
                deadline = time.monotonic() + timeout_s
            elif time.monotonic() > deadline:
                stuck = sorted(p for p, part in parts.items() if not part.done)
                raise HistoryUnavailable(f"{span.topic}: partitions {stuck} stopped short of the range's end")
        if cut is None:  # read whole in one fetch
            cut = _first_cut(parts, chunk_ms)
        while cut is not None and any(part.held for part in parts.values()):  # read whole: the rest, cut alike
            newest = max(part.newest_ms or 0 for part in parts.values())
            chunk = _take(parts, span.topic, cut if cut <= newest else None, settings)
            cut += chunk_ms
            if chunk is not None:
                yield chunk
    finally:
        consumer.close()


def _first_cut(parts: dict[int, _Partition], chunk_ms: int) -> int | None:
    """The end of the first chunk: the first whole ``chunk_ms`` after the oldest record held (None: none held)."""
    starts = [part.held[0].timestamp()[1] for part in parts.values() if part.held]
    return (min(starts) // chunk_ms + 1) * chunk_ms if starts else None


def _resume(consumer: Any, topic: str, parts: dict[int, _Partition]) -> None:
    from confluent_kafka import TopicPartition

    for p, part in parts.items():
        if part.paused and len(part.held) < BUFFER_RECORDS:
            consumer.resume([TopicPartition(topic, p)])
            part.paused = False


def _take(parts: dict[int, _Partition], topic: str, cut: int | None, settings: Settings) -> pd.DataFrame | None:
    """Each partition's held records before ``cut`` (None: all), as one raw chunk whose clock is ``cut`` (or its
    newest record time)."""
    batches, newest = [], 0
    for p, part in sorted(parts.items()):
        n = 0
        for message in part.held:
            kind, ms = message.timestamp()
            if cut is not None and kind and ms >= cut:
                break
            n += 1
        if not n:
            continue
        rows = RawColumns()
        for message in part.held[:n]:
            rows.add(message.offset(), message.timestamp(), message.key(), message.value(), settings.max_record_bytes,
                     settings.dead_letter_raw_bytes)
            newest = max(newest, message.timestamp()[1])
        del part.held[:n]
        batches.append(rows.take(topic, p))
    if not batches:
        return None
    frame = pa.Table.from_batches(batches).to_pandas()
    frame["now"] = cut if cut is not None else newest
    return frame
