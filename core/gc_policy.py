"""How often CPython's cyclic garbage collector runs in Tocsin's long-lived data processes.

CPython starts a young-generation collection every 700 net container allocations and, every
100 of those, a full one that walks every tracked object. A Spark Python worker holding a
shard holds hundreds of thousands of long-lived objects (the catalog, the firing sets), so a
batch that builds tens of thousands of small objects (its transitions, a change-log entry read
back) pays for walking them again and again: in one shard at 10,000 subscriptions, 49 ms per
batch in collections and full ones of 250-500 ms every few batches (docs/evaluator.md: *Python's garbage
collector*). Tocsin's hot paths make almost no reference cycles (arrays, tuples, sets of strings),
so collecting less often costs a little memory held a little longer, never correctness.

PySpark's reused Python worker also runs a *full* collection after every task (``gc.collect()`` in
``pyspark/daemon.py``), which walks every tracked object the worker holds: its imports alone (~130,000
objects) cost ~70 ms a collection, and a micro-batch runs a dozen such tasks (each Kafka slice's read and
parse, each shard's operator), ~0.5-1.5 s of CPU a batch, most of a small batch's cost.
:func:`settle_after_task` freezes what the task left alive, so that collection walks only what
came after, and collects everything once every ``TOCSIN_PYTHON_GC_FULL_INTERVAL_S``.
"""

from __future__ import annotations

import gc
import time


def apply_gc_policy(young_threshold: int) -> None:
    """Collect the young generation every ``young_threshold`` net allocations (0: leave CPython's default).

    Process-wide and idempotent; the older generations keep their thresholds, so a full collection
    still comes, just ``young_threshold / 700`` times less often.
    """
    if young_threshold > 0:
        _, older, oldest = gc.get_threshold()
        gc.set_threshold(young_threshold, older, oldest)


_last_full = time.monotonic()  # this process's last full collection of the frozen objects too


def settle_after_task(full_interval_s: float) -> None:
    """End of a Spark task in a reused Python worker: freeze what is alive, so that the full collection PySpark runs
    next (and every automatic one) walks only the objects the next tasks allocate, not the whole heap.

    A frozen object freed by its reference count is freed as always; only cyclic garbage frozen with the survivors
    waits, until the first task ending ``full_interval_s`` after the last full collection unfreezes everything and
    collects it once. Memory held is bounded by what the tasks of that interval leave in cycles; the cost is one
    full collection an interval instead of one a task.
    """
    global _last_full
    now = time.monotonic()
    if now - _last_full >= full_interval_s:
        gc.unfreeze()
        gc.collect()
        _last_full = now
    gc.freeze()
