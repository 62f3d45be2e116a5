"""Riding out a Redis outage: a lost node, a cluster failing over, a server restarting.

Long-running processes (the evaluator, the dispatcher, the workers, the web app) never exit because
Redis went away for a while: the errors a wait can cure (:data:`TRANSIENT`, see :func:`is_transient`)
are retried with a bounded exponential backoff, and each component's outage is logged once when it
starts (``redis_outage``, a warning) and once when it ends (``redis_recovered``, with how long it
lasted), and counted once (``tocsin_redis_outages_total``), not per retry. Errors no wait changes
(WRONGTYPE, a script's error) are raised at once.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import redis
import redis.exceptions as redis_errors
import structlog
from prometheus_client import Counter, Gauge
from redis.backoff import ExponentialBackoff
from redis.client import Pipeline
from redis.cluster import ClusterPipeline, RedisCluster

from core.settings import Settings

log = structlog.get_logger(__name__)

OUTAGES = Counter("tocsin_redis_outages_total", "Redis outages ridden out (a node lost, a failover, a restart)",
                  ["component"])
DOWN = Gauge("tocsin_redis_down", "1 while this component finds Redis unreachable or failing over", ["component"])

TRANSIENT: tuple[type[Exception], ...] = (
    redis.ConnectionError,  # also LOADING (BusyLoadingError): a node reading its AOF back
    redis.TimeoutError,
    redis_errors.ClusterDownError,  # CLUSTERDOWN, MASTERDOWN: a primary lost, its replica not promoted yet
    redis_errors.TryAgainError,  # TRYAGAIN: a multi-key command during a slot's migration
    redis_errors.SlotNotCoveredError,
    redis_errors.ReadOnlyError,  # a primary demoted under a client that still writes to it
    redis_errors.AskError,  # ASK / MOVED that redis-py's redirect budget did not settle
    # OOM: a node at maxmemory under noeviction (core.redis_eviction) refuses writes; expiring marks, trimmed
    # streams or an operator adding memory cure it, and the work waits for that instead of failing
    redis_errors.OutOfMemoryError,
)
"""Errors of Redis being away or moving, not of the command: the same command may succeed later."""

T = TypeVar("T")


def is_transient(exc: BaseException) -> bool:
    """Whether waiting may cure ``exc``. redis-py raises a bare ``RedisClusterException`` when no node of the
    cluster answers ("Redis Cluster cannot be connected"); its subclasses (a cross-slot command) are bugs."""
    return isinstance(exc, TRANSIENT) or type(exc) is redis_errors.RedisClusterException


class Outage:
    """One component's view of Redis: up, or down since a moment (thread-safe: workers run threads)."""

    def __init__(self, component: str, settings: Settings, client: redis.Redis | None = None) -> None:
        self.component = component
        self.client = client  # a cluster client's slot map is refreshed after each failure (see refresh)
        self.base_s = settings.redis_outage_backoff_base_s
        self.cap_s = settings.redis_outage_backoff_cap_s
        self.since: float | None = None
        self._lock = threading.Lock()
        DOWN.labels(component).set(0)

    @property
    def down(self) -> bool:
        return self.since is not None

    def failed(self, exc: BaseException) -> None:
        """Redis failed a command with a transient error: an outage starts, unless one is under way."""
        with self._lock:
            if self.since is not None:
                return
            self.since = time.monotonic()
        OUTAGES.labels(self.component).inc()
        DOWN.labels(self.component).set(1)
        log.warning("redis_outage", component=self.component, error=f"{type(exc).__name__}: {str(exc)[:300]}")

    def refresh(self) -> None:
        """After a failure, have a cluster client ask the cluster again who serves which slots: a pipeline's
        failure does not always make redis-py do so, and then every try goes to the primary that is gone, even
        once its replica took over. A node that does not answer yet is no error here (the next try says so)."""
        if isinstance(self.client, RedisCluster):
            with contextlib.suppress(Exception):
                self.client.nodes_manager.initialize()

    def recovered(self) -> None:
        """A command succeeded: the outage under way, if any, is over."""
        if self.since is None:  # the common case, without taking the lock
            return
        with self._lock:
            since, self.since = self.since, None
        if since is not None:
            DOWN.labels(self.component).set(0)
            log.info("redis_recovered", component=self.component, outage_s=round(time.monotonic() - since, 3))

    def backoff(self) -> ExponentialBackoff:
        return ExponentialBackoff(cap=self.cap_s, base=self.base_s)

    def ride_out(self, operation: Callable[[], T], stop: threading.Event | None = None, *,
                 transient: Callable[[BaseException], bool] = is_transient, for_s: float | None = None) -> T:
        """``operation()``, tried again after a growing pause (up to the cap) for as long as Redis is away.

        Use it where giving up would lose work or stop the process (the evaluator's sink), with an operation that
        is safe to run twice (its first run may have taken effect before the reply was lost). ``stop`` set during
        an outage raises the last error instead of waiting on, as does an outage longer than ``for_s``;
        ``transient`` tells the errors waited out from those raised at once.
        """
        backoff = self.backoff()
        failures = 0
        give_up = None if for_s is None else time.monotonic() + for_s
        while True:
            try:
                result = operation()
            except Exception as exc:
                if not transient(exc):
                    raise
                self.failed(exc)
                self.refresh()
                failures += 1
                if (stop is not None and stop.is_set()) or (give_up is not None and time.monotonic() >= give_up):
                    raise
                pause = backoff.compute(min(failures, 30))  # 2**failures: bounded before it overflows
                if stop is not None:
                    stop.wait(pause)
                else:
                    time.sleep(pause)
                continue
            self.recovered()
            return result

    def execute(self, pipe: Pipeline, stop: threading.Event | None = None) -> list:
        """``pipe.execute()``, riding out an outage (:meth:`ride_out`): a failed execute may leave a redis-py
        pipeline empty (a cluster's) or not (a single Redis'), so each new try empties it and queues the same
        commands (and, on a single Redis, the scripts to load) again."""
        commands = _queued(pipe)
        scripts = set(getattr(pipe, "scripts", ()))
        tried = False

        def attempt() -> list:
            nonlocal tried
            if tried:
                pipe.reset()
                for args, options in commands:
                    pipe.pipeline_execute_command(*args, **options)
                if scripts:
                    pipe.scripts.update(scripts)
            tried = True
            return pipe.execute()
        return self.ride_out(attempt, stop)

    def pause_s(self, failures: int) -> float:
        """How long a loop that met its ``failures``-th transient error in a row waits before its next round."""
        return float(self.backoff().compute(min(failures, 30)))


def _queued(pipe: Pipeline) -> list[tuple[tuple, dict]]:
    """The commands queued on ``pipe``, as ``pipeline_execute_command`` takes them."""
    if isinstance(pipe, ClusterPipeline):
        return [(command.args, dict(command.options)) for command in pipe._execution_strategy.command_queue]
    return [(args, dict(options)) for args, options in pipe.command_stack]
