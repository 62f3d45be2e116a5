"""Raw Kafka records as columns: what the live source hands Spark and what a backtest reads back (pure)."""

from __future__ import annotations

import hashlib

import pyarrow as pa

#: A record's raw columns (``evaluator.spark.source.RAW_SCHEMA`` in Arrow's types).
RAW_ARROW_SCHEMA = pa.schema([
    pa.field("topic", pa.string(), False),
    pa.field("partition", pa.int32(), False),
    pa.field("offset", pa.int64(), False),
    pa.field("timestamp", pa.int64()),  # broker/producer time, epoch ms
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),  # only the start of a record over the size limit
    pa.field("value_bytes", pa.int64()),  # the record's whole length
    pa.field("value_sha256", pa.string()),  # set only for a record cut to its start
])


class RawColumns:
    """One partition's records as the raw columns (:data:`RAW_ARROW_SCHEMA`), gathered record by record and handed
    out as one Arrow batch. A value over ``max_record_bytes`` is kept only by its first ``keep_bytes``, its length
    and its sha256: all its dead letter needs, and a publisher cannot make a reader hold a huge record."""

    def __init__(self, schema: pa.Schema = RAW_ARROW_SCHEMA) -> None:
        """``schema``: :data:`RAW_ARROW_SCHEMA`, or the same columns as another reader types them (Spark's)."""
        self.schema = schema
        self._clear()

    def _clear(self) -> None:
        self.offsets: list[int] = []
        self.timestamps: list[int | None] = []
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.sizes: list[int | None] = []
        self.digests: list[str | None] = []
        self.held_bytes = 0  # keys and values held (an oversized record's value only its start)

    def __len__(self) -> int:
        return len(self.offsets)

    def add(self, offset: int, timestamp: tuple[int, int], key: bytes | None, value: bytes | None,
            max_record_bytes: int | None, keep_bytes: int) -> None:
        """One record; ``timestamp`` as librdkafka gives it: (type, epoch ms), type 0 for none."""
        size, digest = None, None
        if value is not None:
            size = len(value)
            if max_record_bytes is not None and size > max_record_bytes:
                value, digest = value[:keep_bytes], hashlib.sha256(value).hexdigest()
        self.offsets.append(offset)
        self.timestamps.append(timestamp[1] if timestamp[0] else None)
        self.keys.append(key)
        self.values.append(value)
        self.held_bytes += len(value or b"") + len(key or b"")
        self.sizes.append(size)
        self.digests.append(digest)

    def take(self, topic: str, partition: int) -> pa.RecordBatch:
        n = len(self)
        columns = ([topic] * n, [partition] * n, self.offsets, self.timestamps, self.keys, self.values, self.sizes,
                   self.digests)
        batch = pa.RecordBatch.from_arrays(
            [pa.array(column, type=field.type) for column, field in zip(columns, self.schema, strict=True)],
            schema=self.schema,
        )
        self._clear()
        return batch
