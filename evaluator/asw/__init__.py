"""Shared sliding-window aggregates (ASW): one synopsis answers windows of many sizes.

Every structure here is tuple-based over stream *positions* 0, 1, 2, ...:
``append(v)`` adds the element at position ``n``, ``lookup(w)`` aggregates the last
``w`` elements and ``range(a, b)`` the historical window of positions ``[a, b)``.
:class:`evaluator.asw.timebased.TimeWindows` turns any of them into time-based
windows. Retention is ``capacity`` positions (a power of two), grown on demand.

These are the reference implementations of Arasu & Widom's structures (B-INT, L-INT,
R-INT, B-INT-QNT and the baselines) that ``benchmarks/evaluator.py`` measures and the
tests check. Production does not import this package: a shard answers its conditions
from the per-key indexes of ``evaluator.ssf`` (through ``evaluator.collective``) and
the per-key pane values of ``evaluator.values``. Tuple-based windows, planned in
another issue, are the first production use in view; until then a change here changes
the benchmark, not the service.
"""
