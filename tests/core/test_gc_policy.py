"""The garbage collector's young-generation threshold: set where asked, left where not."""

from __future__ import annotations

import gc

import pytest

from core.gc_policy import apply_gc_policy

pytestmark = pytest.mark.usefixtures("cpython_gc")


def test_the_young_threshold_is_raised_and_the_older_ones_kept() -> None:
    apply_gc_policy(50_000)
    assert gc.get_threshold() == (50_000, 10, 10)
    apply_gc_policy(50_000)  # idempotent: every task of a worker calls it
    assert gc.get_threshold() == (50_000, 10, 10)


def test_zero_leaves_cpython_as_it_is() -> None:
    apply_gc_policy(0)
    assert gc.get_threshold() == (700, 10, 10)
