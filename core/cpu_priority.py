"""Lowering a process's CPU priority so that it yields the cores to the rest of the platform.

``nice`` alone is not enough on Linux with autogroup scheduling (``kernel.sched_autogroup_enabled``,
on by default on desktop and many server kernels): each session is a group of its own and the
groups share the CPU equally, whatever their processes' nice values, so a niced process started in a
session of its own (as ``infra/up`` starts every process) competes with the evaluator as an equal.
The session's group is niced too (``/proc/self/autogroup``; raising it needs no privilege), when the
process leads its session (``infra/up`` starts each so): a worker started from a terminal would
otherwise nice the terminal's whole session; there it is niced alone, as ``nice`` would. In a
container the same holds between containers: give the backtest worker's container a smaller CPU
weight (the compose file's ``cpu_shares``).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

AUTOGROUP = Path("/proc/self/autogroup")


def lower_cpu_priority(nice: int) -> None:
    """This process (and the children it starts later) at ``nice``, and its session's autogroup too where there is
    one and this process leads the session (best effort: a kernel without autogroups, or one that refuses, leaves
    plain nice)."""
    os.nice(max(nice - os.nice(0), 0))
    if AUTOGROUP.exists() and os.getsid(0) == os.getpid():
        with contextlib.suppress(OSError):
            AUTOGROUP.write_text(str(nice))
