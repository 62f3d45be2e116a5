"""When the local runner restarts a process that exited: exponential backoff with a cap, reset by staying up.

Like systemd's ``Restart=`` with a growing ``RestartSec`` or Erlang's supervisors: a
process that crashed waits ``runner_restart_backoff_s`` before its restart, twice
that after a second crash in a row, and so on up to ``runner_restart_backoff_max_s``.
A process that stayed up ``runner_restart_reset_s`` is healthy again: its next crash
starts from the first backoff. ``runner_crash_loop_restarts`` crashes in a row make it
*crash-looping*, which the runner reports (it keeps restarting it, at the cap).
Pure: the runner passes the clock in.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.settings import Settings


@dataclass
class Backoff:
    """One process's crashes in a row and the wait before its next restart."""

    first_s: float
    cap_s: float
    reset_after_s: float
    crash_loop_after: int
    started_at: float = 0.0  # when the current run of the process started (monotonic)
    in_a_row: int = 0

    @classmethod
    def of(cls, settings: Settings, started_at: float) -> Backoff:
        return cls(settings.runner_restart_backoff_s, settings.runner_restart_backoff_max_s,
                   settings.runner_restart_reset_s, settings.runner_crash_loop_restarts, started_at)

    def exited(self, now: float) -> float:
        """The process exited at ``now``: how long to wait before restarting it."""
        if now - self.started_at >= self.reset_after_s:
            self.in_a_row = 0
        self.in_a_row += 1
        return min(self.cap_s, self.first_s * 2 ** min(self.in_a_row - 1, 30))

    def restarted(self, now: float) -> None:
        self.started_at = now

    @property
    def crash_looping(self) -> bool:
        return self.in_a_row >= self.crash_loop_after
