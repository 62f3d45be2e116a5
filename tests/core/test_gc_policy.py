"""The garbage collector's young-generation threshold: set where asked, left where not; and the heap a Spark task
leaves frozen, so PySpark's collection after the task walks only new objects, with cyclic garbage freed in time."""

from __future__ import annotations

import gc
import time
import weakref

import pytest

from core import gc_policy
from core.gc_policy import apply_gc_policy, settle_after_task

pytestmark = pytest.mark.usefixtures("cpython_gc")


def test_the_young_threshold_is_raised_and_the_older_ones_kept() -> None:
    apply_gc_policy(50_000)
    assert gc.get_threshold() == (50_000, 10, 10)
    apply_gc_policy(50_000)  # idempotent: every task of a worker calls it
    assert gc.get_threshold() == (50_000, 10, 10)


def test_zero_leaves_cpython_as_it_is() -> None:
    apply_gc_policy(0)
    assert gc.get_threshold() == (700, 10, 10)


class _Node:
    """A weak-referenceable object to make a reference cycle of."""

    peer: _Node


def _cycle() -> weakref.ref[_Node]:
    node = _Node()
    node.peer = node  # freed only by the cyclic collector
    return weakref.ref(node)


def test_what_a_task_leaves_alive_is_out_of_the_next_full_collections_walk() -> None:
    held = [[i] for i in range(100_000)]  # a worker's long-lived objects: imports, caches
    assert any(obj is held for obj in gc.get_objects())
    settle_after_task(3600)
    assert gc.get_freeze_count() >= len(held)
    assert not any(obj is held for obj in gc.get_objects())  # what gc.collect() walks
    fresh = [0]
    assert any(obj is fresh for obj in gc.get_objects())  # the next task's objects are collected as always


def test_cyclic_garbage_frozen_with_the_survivors_is_freed_once_the_interval_has_passed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    settle_after_task(3600)  # a full collection was not due: the cycle is frozen
    garbage = _cycle()
    settle_after_task(3600)
    gc.collect()
    assert garbage() is not None
    monkeypatch.setattr(gc_policy, "_last_full", time.monotonic() - 61)
    settle_after_task(60)  # due: unfrozen and collected
    assert garbage() is None
    assert gc.get_freeze_count() > 0  # and the survivors frozen again
