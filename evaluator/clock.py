"""The clock rule: a stream's evaluation clock never runs ahead of the processing clock.

A partition's progress (the newest event or heartbeat time seen in it) is what moves the
watermark, and every window ending at or below the watermark is evaluated and closed. So a
producer whose clock runs fast, or a publisher lying about time, would otherwise close every
window shorter than its lead early: alerts resolve, honest events count as late, nothing fires
again until the wall clock catches up. Hence the rule: a partition's progress counts at most up
to the micro-batch's processing clock plus ``clock_tolerance_ms``. Events ahead of that (but
within ``max_future_skew_ms``, beyond which they are dead letters) are kept in their panes and
count when the clock reaches them: later records (any producer's, or heartbeats) carry the
partition's progress on. A stream behind the processing clock (a replay, a backfill, a backlog)
is not touched: its clock follows event time, at full speed.

The processing clock is the micro-batch's timestamp, fixed when Spark plans the batch and kept
in its offset log, so a re-run batch bounds progress exactly as the first run did (the same
transitions, the same alert ids).
"""

from __future__ import annotations

from collections.abc import Mapping


def bounded_progress(progress: Mapping[int, int], now: int, tolerance_ms: int) -> tuple[dict[int, int], dict[int, int]]:
    """Each partition's progress no further than ``now + tolerance_ms``, and for each partition that claimed
    more, how far ahead of ``now`` its newest time was (ms)."""
    limit = now + tolerance_ms
    ahead = {p: ts - now for p, ts in progress.items() if ts > limit}
    return {p: min(ts, limit) for p, ts in progress.items()}, ahead
