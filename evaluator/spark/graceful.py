"""Stopping a streaming query between batches, never inside one.

``StreamingQuery.stop()`` interrupts the batch under way: its tasks are killed while the shard operator's Python
worker may still be writing its state through the transformWithState state server, whose RocksDB store the
task's end closes under it (a JVM crash in ``RocksDB.put`` was seen so: the driver, and every query with it). So a
query is stopped in two steps: its source is told to offer nothing new (a stop file, which the Kafka source reads
in ``latestOffset``: the job's own, or the stream's), then, once no trigger is active, ``stop()`` ends a query that
is between batches. Our queries run no batch without new data (no watermark, no timers), so a look that finds no
trigger active after the file was made means no batch runs now or will.
"""

from __future__ import annotations

import time
from pathlib import Path

from pyspark.sql.streaming import StreamingQuery

#: Consecutive looks (0.2 s apart) finding no trigger active before a waiting stop ends the query: one suffices by
#: the reasoning above; the others cover a status read racing a trigger's start.
IDLE_LOOKS = 3
LOOK_INTERVAL_S = 0.2


def hold(stop_file: Path) -> None:
    """Make a stop file: the sources that obey it offer no new records from their next ``latestOffset`` on."""
    stop_file.parent.mkdir(parents=True, exist_ok=True)
    stop_file.touch()


def between_batches(query: StreamingQuery) -> bool:
    """Whether the query has ended or runs no trigger now (the status Spark updates at each trigger's start and end)."""
    return not query.isActive or not query.status.get("isTriggerActive")


def wait_between_batches(query: StreamingQuery, deadline: float) -> bool:
    """Wait (the query's source offers nothing new now) until no batch runs; False if the deadline came first."""
    idle = 0
    while time.monotonic() < deadline:
        if not query.isActive:
            return True
        idle = idle + 1 if between_batches(query) else 0
        if idle >= IDLE_LOOKS:
            return True
        time.sleep(LOOK_INTERVAL_S)
    return False


def stop_between_batches(query: StreamingQuery, stop_file: Path, wait_s: float) -> bool:
    """Make ``stop_file`` (the query's source's), wait at most ``wait_s`` for the batch under way, stop the query and
    remove the file; False if the batch was interrupted."""
    hold(stop_file)
    try:
        between = wait_between_batches(query, time.monotonic() + wait_s)
        query.stop()
    finally:
        stop_file.unlink(missing_ok=True)
    return between
