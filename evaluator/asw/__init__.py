"""Shared sliding-window aggregates (ASW): one synopsis answers windows of many sizes.

Every structure here is tuple-based over stream *positions* 0, 1, 2, ...:
``append(v)`` adds the element at position ``n``, ``lookup(w)`` aggregates the last
``w`` elements and ``range(a, b)`` the historical window of positions ``[a, b)``.
:class:`evaluator.asw.timebased.TimeWindows` turns any of them into time-based
windows. Retention is ``capacity`` positions (a power of two), grown on demand.
"""
