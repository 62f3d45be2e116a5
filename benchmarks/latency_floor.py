"""How long an alert must wait for Spark's trigger, whatever the evaluator costs.

A window ending at a pane boundary ``b`` is decided once the log says event time passed ``b + allowed delay``:
the stream's progress (its newest events or heartbeats) lags the wall clock by a little on a busy feed, by up to a
heartbeat interval on a quiet one. Spark's processing-time trigger starts a batch at the next multiple of its
interval (``ProcessingTimeExecutor.nextBatchTime``: ticks aligned to the epoch, when the batch before ended in
time), and the alert is written once that batch ends. From an event at ``t`` in the pane ending at ``b``:
``tick(b + delay + lag) - t`` before the batch even starts. Panes and ticks are both aligned to the epoch, so with
panes of 1 s and a 1 s trigger every boundary waits for the tick a second after it (the first event of a pane
waits ~2 s plus a batch). A boundary decidable exactly at a tick (an allowed delay of a whole number of
intervals) is a race: the batch plans its offsets some milliseconds after its tick, and a feed's progress lags
by some milliseconds; lost, it waits a whole interval more (measured: docs/benchmarks.md). The live table sets
the lower bound, the race always won, beside each row.
"""

from __future__ import annotations

import math

import numpy as np

#: How far (ms) the progress a batch plans with may be past its tick: its offsets are asked for just after it.
#: With ``lag_ms=0`` every boundary decidable at a tick is decided there: the lower bound.
AHEAD_MS = 1e-3


def tick_wait_s(pane_ms: int, delay_ms: int, lag_ms: float, trigger_ms: int, q: float, steps: int = 4_000) -> float:
    """The ``q``-th percentile (0-100) of the wait from an event to the start of the batch that decides its pane:
    event times uniform over a whole period of panes and ticks, the progress's lag uniform up to ``lag_ms`` behind
    the batch's planning, just past its tick (a midpoint grid, exact to ``period / steps``). A trigger of 0 starts
    the next batch at once: no tick to wait for (the batch under way aside)."""
    period = math.lcm(pane_ms, trigger_ms) if trigger_ms else pane_ms
    t = (np.arange(steps) + 0.5) * (period / steps)
    phases = max(steps // 10, 1)
    lag = (np.arange(phases) + 0.5) * (lag_ms / phases) - AHEAD_MS
    boundary = np.ceil(t / pane_ms) * pane_ms
    decidable = boundary[:, None] + delay_ms + lag[None, :]
    tick = np.ceil(decidable / trigger_ms) * trigger_ms if trigger_ms else decidable
    return float(np.percentile(tick - t[:, None], q)) / 1000
