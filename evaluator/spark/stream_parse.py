"""The first stage of a declared stream's query in Spark: :class:`evaluator.stream_records.StreamRecordPanes`
(the stream's schema as the judge) with what :class:`evaluator.spark.parse.PaneParser` does around it."""

from __future__ import annotations

from evaluator.spark.parse import PaneParser
from evaluator.stream_records import StreamRecordPanes


class StreamPaneParser(StreamRecordPanes, PaneParser):
    """mapInArrow for a declared stream: the stream's judge, the live query's dead letters and counters."""
