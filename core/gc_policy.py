"""How often CPython's cyclic garbage collector runs in Tocsin's long-lived data processes.

CPython starts a young-generation collection every 700 net container allocations and, every
100 of those, a full one that walks every tracked object. A Spark Python worker holding a
shard holds hundreds of thousands of long-lived objects (the catalog, the firing sets), so a
batch that builds tens of thousands of small objects (its transitions, a change-log entry read
back) pays for walking them again and again: in one shard at 10,000 subscriptions, 49 ms per
batch in collections and full ones of 250-500 ms every few batches (docs/evaluator.md: *Python's garbage
collector*). Tocsin's hot paths make almost no reference cycles (arrays, tuples, sets of strings),
so collecting less often costs a little memory held a little longer, never correctness.
"""

from __future__ import annotations

import gc


def apply_gc_policy(young_threshold: int) -> None:
    """Collect the young generation every ``young_threshold`` net allocations (0: leave CPython's default).

    Process-wide and idempotent; the older generations keep their thresholds, so a full collection
    still comes, just ``young_threshold / 700`` times less often.
    """
    if young_threshold > 0:
        _, older, oldest = gc.get_threshold()
        gc.set_threshold(young_threshold, older, oldest)
