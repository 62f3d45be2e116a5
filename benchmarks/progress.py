"""Throughput as rows processed per wall second, never from the event clock.

A final heartbeat jumps the event clock to the end of a stream at once, so an
events/s computed from event time overstates short streams. Here the rate is
the rows a query processed after its warm-up over the wall time those rows
took: from the end of the batch that completed the warm-up to the end of the
last batch that read anything. Spark queries report batches in their progress;
a single-process peer reports each row (:class:`RowClock`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

WARM_UP_LIMIT_S = 900  # the warm-up may take long when every match fires at once


@dataclass(frozen=True)
class Throughput:
    rows: int  # every row processed, warm-up included
    counted_rows: int  # the rows after the warm-up, over ``seconds``
    seconds: float
    finished: bool  # the whole stream was processed within the budget

    @property
    def rate(self) -> float:
        return self.counted_rows / self.seconds if self.seconds > 0 else float("nan")


def rate_over(batches: list[tuple[float, int]], warm_up_rows: int, total_rows: int) -> Throughput:
    """``batches``: (wall time the batch ended, rows it read), in order; batches reading nothing are left out."""
    done, counted, since, until = 0, 0, None, None
    for ended, rows in batches:
        if rows <= 0:
            continue
        done += rows
        if since is None:
            if done >= warm_up_rows:
                since = ended
            continue
        counted, until = counted + rows, ended
    seconds = until - since if since is not None and until is not None else 0.0
    return Throughput(done, counted, seconds, done >= total_rows)


def batch_end_s(progress: dict[str, Any]) -> float:
    """When a Spark micro-batch ended, epoch seconds: its trigger time plus its trigger execution."""
    started = datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00")).timestamp()
    return started + progress["durationMs"].get("triggerExecution", 0) / 1000


def drain(query: Any, total_rows: int, warm_up_rows: int, budget_s: float) -> tuple[Throughput, list[dict]]:
    """Run a Spark streaming query until it has read ``total_rows`` or spent ``budget_s`` past its warm-up.

    A batch under way when the budget runs out is awaited if no batch has completed since the warm-up,
    so a row of slow batches still gets a rate (within ``WARM_UP_LIMIT_S``).

    Progress is collected while it runs (Spark keeps only the recent batches), then the query is stopped.
    Returns the throughput and the progress of every batch that read rows, in order.
    """
    seen: dict[int, dict] = {}
    started, warm_at, warmed = time.monotonic(), None, 0
    try:
        while True:
            if (failed := query.exception()) is not None:
                raise failed
            for p in query.recentProgress:
                if p["numInputRows"]:
                    seen[p["batchId"]] = p
            done = sum(p["numInputRows"] for p in seen.values())
            now = time.monotonic()
            if warm_at is None and done >= warm_up_rows:
                warm_at, warmed = now, done
            if done >= total_rows:
                break
            if warm_at is None and now - started > WARM_UP_LIMIT_S:
                break
            # past the budget, stop once a batch after the warm-up has completed (a rate to report) or the limit
            if warm_at is not None and now - warm_at > budget_s and (done > warmed or now - warm_at > WARM_UP_LIMIT_S):
                break
            time.sleep(0.25)
    finally:
        query.stop()
    for p in query.recentProgress:  # the last batches may have ended after the last poll
        if p["numInputRows"]:
            seen[p["batchId"]] = p
    progress = [seen[b] for b in sorted(seen)]
    return rate_over([(batch_end_s(p), p["numInputRows"]) for p in progress], warm_up_rows, total_rows), progress


class RowClock:
    """Per-row timing for a peer that is not a Spark query: the same rate as :func:`rate_over`."""

    def __init__(self, total_rows: int, warm_up_rows: int, budget_s: float) -> None:
        self.total_rows, self.warm_up_rows, self.budget_s = total_rows, warm_up_rows, budget_s
        self.rows = 0
        self.started = time.monotonic()
        self.warm_at: float | None = None
        self.last = self.started

    def tick(self) -> bool:
        """Count one row; False once the stream is done or the budget spent."""
        self.rows += 1
        self.last = time.monotonic()
        if self.warm_at is None and self.rows >= self.warm_up_rows:
            self.warm_at = self.last
        limit = self.budget_s if self.warm_at is not None else WARM_UP_LIMIT_S
        return self.rows < self.total_rows and self.last - (self.warm_at or self.started) <= limit

    def throughput(self) -> Throughput:
        if self.warm_at is None:
            return Throughput(self.rows, 0, 0.0, False)
        return Throughput(self.rows, self.rows - self.warm_up_rows, self.last - self.warm_at,
                          self.rows >= self.total_rows)
