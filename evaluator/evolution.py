"""A shard's state widened to attributes added to its stream while it ran.

A stream may gain optional attributes (``core.streams.check_compatible``). Its query is restarted
on the same checkpoint with the new attribute columns appended (``evaluator.spark.registry.
query_attributes``); the shard state it restores was written with fewer. Widening appends, for
each new attribute, what the state would hold had the column been there from the start with
every earlier event lacking the value: zero sums, minima, maxima and event values (the parser's
convention for a missing optional value, see ``evaluator.streams``), and a fresh exact-sum unit.
So a widened shard equals one that had the column all along (tests/evaluator/test_evolution.py),
and the stream's windows and firing state survive the change.

Pure: bytes in, bytes out.
"""

from __future__ import annotations

import dataclasses
import struct

import numpy as np

from evaluator.panerows import PaneRows
from evaluator.shard import Delta, join_parts, split_parts

_RUNNING_PARTS = 8  # evaluator.panestore.RunningWindows.to_parts: meta, keys, ids, starts, counts, sums, mins, maxs


def _pad(matrix: np.ndarray, n: int) -> np.ndarray:
    a = matrix.shape[0]
    if a > n:
        raise ValueError(f"state has {a} attributes, more than the {n} of the query: attributes are never removed")
    return np.vstack([matrix, np.zeros((n - a, matrix.shape[1]), dtype=matrix.dtype)]) if a < n else matrix


def widened_rows(rows: PaneRows, n: int) -> PaneRows:
    """``rows`` with zero columns appended up to ``n`` attributes."""
    if rows.sums.shape[0] == n:
        return rows
    return dataclasses.replace(rows, sums=_pad(rows.sums, n), mins=_pad(rows.mins, n), maxs=_pad(rows.maxs, n),
                               event_values=_pad(rows.event_values, n))


def widened_delta(delta: Delta, n: int) -> Delta:
    return dataclasses.replace(delta, rows=widened_rows(delta.rows, n))


def snapshot_attributes(blob: bytes) -> int:
    """How many attributes a shard snapshot (``ShardEvaluator.snapshot``) was written with (read without copying)."""
    (_, first) = struct.unpack_from("<IQ", blob)
    return (first - 16) // 8


def _widened_running(parts: list[bytes], n: int) -> list[bytes]:
    a = (len(parts[0]) - 16) // 8
    at, rows, *shifts = struct.unpack_from(f"<qQ{a}Q", parts[0])
    meta = struct.pack(f"<qQ{n}Q", at, rows, *shifts, *([0] * (n - a)))
    matrices = [np.frombuffer(p, dtype=np.float64).reshape(a, rows) for p in parts[5:8]]
    return [meta, *parts[1:5], *(np.ascontiguousarray(_pad(m, n)).tobytes() for m in matrices)]


def _widened_values(blob: bytes, n: int) -> bytes:
    keys, a, name_bytes = struct.unpack_from("<III", blob)
    head = 12 + name_bytes + 8 * keys
    total = int(np.frombuffer(blob, dtype=np.int64, count=keys, offset=12 + name_bytes).sum())
    values_at = head + 8 * total
    values = np.frombuffer(blob, dtype=np.float64, count=a * total, offset=values_at).reshape(a, total)
    return (struct.pack("<III", keys, n, name_bytes) + blob[12:values_at]
            + np.ascontiguousarray(_pad(values, n)).tobytes())


def widened_snapshot(blob: bytes, n: int) -> bytes:
    """A shard snapshot with zero columns appended up to ``n`` attributes (the same bytes when it has ``n``)."""
    if snapshot_attributes(blob) == n:
        return blob
    parts = split_parts(blob)
    running, (values, pending, meta) = parts[:-3], parts[-3:]
    if len(running) != _RUNNING_PARTS:
        raise ValueError(f"unexpected snapshot layout: {len(running)} parts of running windows")
    return join_parts([*_widened_running(running, n), _widened_values(values, n),
                  widened_rows(PaneRows.from_bytes(pending), n).to_bytes(), meta])
