"""How long an alert must wait for Spark's trigger, whatever the evaluator costs.

A window ending at a pane boundary ``b`` is decided once the log says event time passed ``b + allowed delay``:
a heartbeat (every ``heartbeat_ms``) says so up to one heartbeat later. Spark's processing-time trigger starts a
batch at the next multiple of its interval (``ProcessingTimeExecutor.nextBatchTime``: ticks aligned to the
epoch, when the batch before ended in time), and the alert is written once that batch ends. From an event at
``t`` in the pane ending at ``b``: ``tick(b + delay + heartbeat wait) - t`` before the batch even starts. Panes and
ticks are both aligned to the epoch, so with panes of 1 s and a 1 s trigger every boundary waits for the tick a
second after it: the first event of a pane waits ~2 s plus a batch. The live table sets this beside each row.
"""

from __future__ import annotations

import math

import numpy as np


def tick_wait_s(pane_ms: int, delay_ms: int, heartbeat_ms: int, trigger_ms: int, q: float, steps: int = 4_000) -> float:
    """The ``q``-th percentile (0-100) of the wait from an event to the start of the batch that decides its pane:
    event times uniform over a whole period of panes and ticks, heartbeat waits uniform over one interval (a
    midpoint grid, exact to ``period / steps``)."""
    period = math.lcm(pane_ms, trigger_ms)
    t = (np.arange(steps) + 0.5) * (period / steps)
    phases = max(steps // 10, 1)
    heartbeat = (np.arange(phases) + 0.5) * (heartbeat_ms / phases)
    boundary = np.ceil(t / pane_ms) * pane_ms
    decidable = boundary[:, None] + delay_ms + heartbeat[None, :]
    tick = np.ceil(decidable / trigger_ms) * trigger_ms
    return float(np.percentile(tick - t[:, None], q)) / 1000
