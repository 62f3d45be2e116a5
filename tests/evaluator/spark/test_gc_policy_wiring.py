"""Each of the query's stages runs under the configured garbage-collector policy (``core.gc_policy``) in the process
it runs in: the parser and the shard operator in Spark's Python workers, the sink in the driver; and each task of a
Python worker (the source's read, the parser, the operator) ends with the heap frozen, so PySpark's full collection
after the task walks only new objects."""

from __future__ import annotations

import gc

from core.settings import Settings
from evaluator.spark.operator import ShardProcessor
from evaluator.spark.parse import PaneParser
from evaluator.spark.sink import RedisAlertSink
from ingest.model import Event
from tests.evaluator.test_pane_parser import NOW, frame, run
from tests.evaluator.test_stream_operator import Handle


def test_the_parser_applies_the_policy_in_its_worker(settings: Settings, cpython_gc: None) -> None:
    settings = settings.model_copy(update={"python_gc_threshold": 12_345})
    out = run(PaneParser(settings, (0,)), frame([Event(key="A", ts=NOW - 5_000, price=1, volume=2).to_json()]))
    assert gc.get_threshold() == (12_345, 10, 10)
    assert out["key"].tolist().count("A") == 1


def test_the_operator_applies_the_policy_in_its_worker(settings: Settings, cpython_gc: None) -> None:
    ShardProcessor(settings.model_copy(update={"python_gc_threshold": 23_456}), 1, (0,)).init(Handle())
    assert gc.get_threshold() == (23_456, 10, 10)


def test_the_sink_applies_the_policy_in_the_driver(settings: Settings, cpython_gc: None) -> None:
    RedisAlertSink(settings.model_copy(update={"python_gc_threshold": 34_567}))
    assert gc.get_threshold() == (34_567, 10, 10)


def test_zero_keeps_cpython_s_default(settings: Settings, cpython_gc: None) -> None:
    ShardProcessor(settings.model_copy(update={"python_gc_threshold": 0}), 1, (0,)).init(Handle())
    assert gc.get_threshold() == (700, 10, 10)


def test_the_parser_s_task_ends_with_the_heap_frozen(settings: Settings, cpython_gc: None) -> None:
    assert gc.get_freeze_count() == 0
    run(PaneParser(settings, (0,)), frame([Event(key="A", ts=NOW - 5_000, price=1, volume=2).to_json()]))
    assert gc.get_freeze_count() > 0


def test_the_operator_s_task_ends_with_the_heap_frozen(settings: Settings, cpython_gc: None, tmp_path) -> None:
    settings = settings.model_copy(update={"checkpoint_dir": str(tmp_path / "cp")})
    rows = run(PaneParser(settings, (0,)), frame([Event(key="A", ts=NOW - 5_000, price=1, volume=2).to_json()]))
    gc.unfreeze()
    processor = ShardProcessor(settings, 1, (0,))
    processor.init(Handle())
    out = list(processor.handleInputRows((0,), iter([rows]), None))
    assert out and gc.get_freeze_count() > 0
