"""Is the evaluator evaluating? One answer for the runner's ready line, ``/readyz`` and previews.

Read from the ``stats:evaluator`` hash: the driver writes ``driver_started_at``
when it starts and ``driver_heartbeat_at`` every second from then on; the sink
writes each shard's clock (the last pane boundary it evaluated) and
``last_batch_at`` after every micro-batch. The evaluator is *ready* once a batch
has been evaluated since the driver started (clocks left by an earlier run do not
count) and the driver's heartbeat is younger than ``evaluator_stale_s``.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.redis_schema import shard_clocks
from core.settings import Settings

#: Fields of ``stats:evaluator`` a catalog reader sets while the catalog it holds is behind a published version it
#: cannot reach (since when; held, published and why as JSON), and removes once it reaches it again.
CATALOG_STUCK_SINCE = "catalog_stuck_since"
CATALOG_STUCK = "catalog_stuck"


@dataclass(frozen=True)
class EvaluatorStatus:
    state: str  # "ready", "starting" (driver alive, no boundary evaluated yet), "stale" or "absent"
    reason: str
    shards: int
    heartbeat_age_s: float | None
    last_batch_age_s: float | None
    newest_clock_ms: int | None

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    def as_dict(self) -> dict:
        return {"state": self.state, "reason": self.reason, "shards": self.shards,
                "heartbeat_age_s": self.heartbeat_age_s, "last_batch_age_s": self.last_batch_age_s,
                "newest_clock_ms": self.newest_clock_ms}


def _float(stats: dict[str, str], name: str) -> float | None:
    try:
        return float(stats[name])
    except (KeyError, TypeError, ValueError):
        return None


def evaluator_status(stats: dict[str, str], settings: Settings, now: float) -> EvaluatorStatus:
    """The evaluator's state from its stats hash (decoded strings) at wall time ``now``."""
    clocks = shard_clocks(stats)
    heartbeat, last_batch = _float(stats, "driver_heartbeat_at"), _float(stats, "last_batch_at")
    started = _float(stats, "driver_started_at") or 0.0
    heartbeat_age = None if heartbeat is None else round(max(now - heartbeat, 0.0), 1)
    batch_age = None if last_batch is None else round(max(now - last_batch, 0.0), 1)
    newest = max(clocks, default=None)

    def status(state: str, reason: str) -> EvaluatorStatus:
        return EvaluatorStatus(state, reason, len(clocks), heartbeat_age, batch_age, newest)

    if heartbeat_age is None:
        if clocks:
            return status("stale", "the evaluator has evaluated before but sends no heartbeat")
        return status("absent", "the evaluator has not started yet (no heartbeat, no shard has reported)")
    if heartbeat_age > settings.evaluator_stale_s:
        return status("stale", f"no heartbeat from the evaluator for {heartbeat_age:.0f} s "
                               f"(more than {settings.evaluator_stale_s:g} s): it is down or hung")
    if not clocks or last_batch is None or last_batch < started:
        return status("starting", "the evaluator is starting: no batch evaluated yet (the first takes about a minute)")
    return status("ready", f"{len(clocks)} shards evaluating")
