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
from pathlib import Path
from typing import Any

from evaluator.spark.graceful import stop_between_batches

WARM_UP_LIMIT_S = 900  # the warm-up may take long when every match fires at once


@dataclass(frozen=True)
class Throughput:
    rows: int  # every row processed, warm-up included
    counted_rows: int  # the rows after the warm-up, over ``seconds``
    seconds: float
    finished: bool  # the whole stream was processed within the budget
    since: float = 0.0  # wall time (epoch s) the warm-up ended, and the last counted batch ended (0: unknown)
    until: float = 0.0

    @property
    def rate(self) -> float:
        return self.counted_rows / self.seconds if self.seconds > 0 else float("nan")


def combined(throughputs: list[Throughput]) -> Throughput:
    """Several queries that ran at once as one: every counted row over the wall time from the first warm-up's
    end to the last counted batch's end."""
    timed = [t for t in throughputs if t.seconds > 0]
    since = min((t.since for t in timed), default=0.0)
    until = max((t.until for t in timed), default=0.0)
    return Throughput(sum(t.rows for t in throughputs), sum(t.counted_rows for t in timed), until - since,
                      all(t.finished for t in throughputs), since, until)


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
    if since is None or until is None:
        return Throughput(done, counted, 0.0, done >= total_rows)
    return Throughput(done, counted, until - since, done >= total_rows, since, until)


def batch_end_s(progress: dict[str, Any]) -> float:
    """When a Spark micro-batch ended, epoch seconds: its trigger time plus its trigger execution."""
    started = datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00")).timestamp()
    return started + progress["durationMs"].get("triggerExecution", 0) / 1000


def drain(query: Any, total_rows: int, warm_up_rows: int, budget_s: float,
          hold: Path | None = None) -> tuple[Throughput, list[dict]]:
    """Run a Spark streaming query until it has read ``total_rows`` or spent ``budget_s`` past its warm-up.

    A batch under way when the budget runs out is awaited if no batch has completed since the warm-up,
    so a row of slow batches still gets a rate (within ``WARM_UP_LIMIT_S``).

    Progress is collected while it runs (Spark keeps only the recent batches), then the query is stopped, between
    batches if ``hold`` is its source's stop file (``evaluator.spark.graceful``).
    Returns the throughput and the progress of every batch that read rows, in order.
    """
    return drain_all({"": (query, total_rows, warm_up_rows)}, budget_s, {"": hold} if hold else None)[""]


class _Draining:
    """One query of :func:`drain_all` and what it has read so far."""

    def __init__(self, query: Any, total_rows: int, warm_up_rows: int, hold: Path | None = None) -> None:
        self.query, self.total_rows, self.warm_up_rows, self.hold = query, total_rows, warm_up_rows, hold
        self.seen: dict[int, dict] = {}
        self.warm_at: float | None = None
        self.warmed = 0
        self.active = True

    def collect(self) -> int:
        for p in self.query.recentProgress:
            if p["numInputRows"]:
                self.seen[p["batchId"]] = p
        return sum(p["numInputRows"] for p in self.seen.values())

    def done(self, started: float, budget_s: float) -> bool:
        """Whether to stop it now: the whole stream read, or its budget spent (see :func:`drain`)."""
        if (failed := self.query.exception()) is not None:
            raise failed
        done, now = self.collect(), time.monotonic()
        if self.warm_at is None and done >= self.warm_up_rows:
            self.warm_at, self.warmed = now, done
        if done >= self.total_rows or (self.warm_at is None and now - started > WARM_UP_LIMIT_S):
            return True
        # past the budget, stop once a batch after the warm-up has completed (a rate to report) or the limit
        return self.warm_at is not None and now - self.warm_at > budget_s and (
            done > self.warmed or now - self.warm_at > WARM_UP_LIMIT_S)

    def stop(self) -> None:
        if self.active:
            self.active = False
            if self.hold is None:
                self.query.stop()
            else:  # stopped inside a batch, the shard operator's state store can crash the JVM
                stop_between_batches(self.query, self.hold, WARM_UP_LIMIT_S)
            self.collect()  # the last batches may have ended after the last poll

    def result(self) -> tuple[Throughput, list[dict]]:
        progress = [self.seen[b] for b in sorted(self.seen)]
        batches = [(batch_end_s(p), p["numInputRows"]) for p in progress]
        return rate_over(batches, self.warm_up_rows, self.total_rows), progress


def drain_all(queries: dict[str, tuple[Any, int, int]], budget_s: float,
              holds: dict[str, Path] | None = None) -> dict[str, tuple[Throughput, list[dict]]]:
    """:func:`drain` for queries running at once, each given as (query, total rows, warm-up rows) with its source's
    stop file in ``holds``: each is stopped as soon as it has read its stream or spent its budget, the others keep
    running."""
    draining = {name: _Draining(*spec, (holds or {}).get(name)) for name, spec in queries.items()}
    started = time.monotonic()
    try:
        while any(d.active for d in draining.values()):
            for d in draining.values():
                if d.active and d.done(started, budget_s):
                    d.stop()
            time.sleep(0.25)
    finally:
        for d in draining.values():
            d.stop()
    return {name: d.result() for name, d in draining.items()}


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
