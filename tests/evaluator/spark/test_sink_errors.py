"""A micro-batch whose job fails ends the query with that failure recorded, never with none."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pyarrow as pa
import pytest

from core.settings import Settings
from core.stream_names import TRADES
from evaluator.spark.sink import TRANSITIONS_SCHEMA, RedisAlertSink

pytestmark = pytest.mark.spark


def _poisoned(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """No transitions; a task that gets rows fails."""
    for batch in batches:
        if batch.num_rows:
            raise ValueError("a poisoned task")
    yield from ()


def test_a_failed_batch_is_the_query_s_recorded_error(spark, settings: Settings, tmp_path) -> None:
    """The sink collects the batch (running its job) through Py4J. A task's failure comes back converted
    (``PythonException``, its message short) and ends the query with it recorded, so the supervisor and the logs
    say why. (An unconverted Py4J error with a long Java trace is different: Spark's stream thread reads it with a
    regex that overflows its stack, ``StreamExecution.PROXY_ERROR``; seen only when a stop interrupts the sink's
    collect, where the job is ending anyway, and a query ending with no error fails the job, see test_follow.)"""
    query = (spark.readStream.format("rate").option("rowsPerSecond", 5).load()
             .mapInArrow(_poisoned, TRANSITIONS_SCHEMA)
             .writeStream.foreachBatch(RedisAlertSink(settings, TRADES))
             .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
    with contextlib.suppress(Exception):  # the failure itself: what the query recorded is checked below
        query.awaitTermination(120)
    query.stop()
    assert not query.isActive
    error = query.exception()
    assert error is not None, "the query ended without its failure recorded"
    assert "a poisoned task" in str(error)
