"""Stopping the in-process queries of the tests as the job stops its own."""

from __future__ import annotations

from pyspark.sql.streaming import StreamingQuery

from core.settings import Settings
from evaluator.spark.graceful import stop_between_batches
from evaluator.spark.job import stream_of_query
from evaluator.spark.source import stop_file

STOP_WAIT_S = 120.0  # a batch under way is awaited this long, then interrupted


def stop_query(query: StreamingQuery, settings: Settings) -> None:
    """Stop a query ``evaluator.spark.job.build_query`` made with ``settings`` between batches: stopped inside one,
    the shard operator's state store can crash the JVM every test of the session shares."""
    stop_between_batches(query, stop_file(settings, stream_of_query(query.name)), STOP_WAIT_S)
