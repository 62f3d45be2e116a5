"""The driver's stream supervisor: one streaming query per declared stream, following the stream registry.

``trades`` is the job's own query (``evaluator.spark.__main__``: its failure fails the job, as
before, and the runner restarts it). Every other declared stream gets a query of its own
(``evaluator.spark.job.build_query``), so its source, shards, watermark and checkpoint are its
own: an idle, late or poisoned stream holds back no other. Every ``TOCSIN_STREAM_REFRESH_S``
:meth:`StreamSupervisor.poll` reads the registry (``evaluator.spark.registry``) and

- starts a query for a stream that has none (a new stream: within one refresh);
- stops the query of a stream no longer declared;
- restarts a stream's query when its schema changed (the judge of its records changed), on the same
  checkpoint: the shards keep their windows and firing state, widened to new attributes
  (``evaluator.evolution``; the query's attributes only grow, see ``registry.query_attributes``);
- restarts a failed query after a backoff (1 s, doubling, at most ``MAX_BACKOFF_S``) while the others run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog
from prometheus_client import Gauge
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from core.settings import Settings
from core.stream_names import TRADES
from core.streams import StreamSchema
from evaluator.spark.registry import RegistryReader, checkpoint_of

log = structlog.get_logger("evaluator")

MAX_BACKOFF_S = 60.0
STREAM_QUERIES = Gauge("tocsin_evaluator_stream_queries", "Declared streams (trades aside) with a running query")
STREAM_RESTARTS = Gauge("tocsin_evaluator_stream_query_failures", "Failed stream queries restarted since start")

Starter = Callable[[SparkSession, Settings, StreamSchema], StreamingQuery]


@dataclass
class _Stream:
    schema: StreamSchema
    query: StreamingQuery | None = None
    failures: int = 0
    retry_at: float = 0.0
    started_at: float = 0.0


class StreamSupervisor:
    def __init__(self, spark: SparkSession, settings: Settings, registry: RegistryReader, start: Starter,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.spark = spark
        self.settings = settings
        self.registry = registry
        self.start = start
        self.clock = clock
        self.streams: dict[str, _Stream] = {}
        self.failures = 0

    def queries(self) -> dict[str, StreamingQuery]:
        return {name: s.query for name, s in self.streams.items() if s.query is not None}

    def poll(self) -> None:
        declared = {name: schema for name, schema in self.registry.read().items() if name != TRADES}
        for name in [n for n in self.streams if n not in declared]:
            self._stop(name, "stream_query_stopped", reason="the stream is no longer declared")
            del self.streams[name]
        now = self.clock()
        for name, schema in sorted(declared.items()):
            held = self.streams.get(name)
            if held is None:
                held = self.streams[name] = _Stream(schema)
            elif held.schema != schema:
                self._stop(name, "stream_query_restarting", reason="the stream's schema changed")
                held.schema, held.failures, held.retry_at = schema, 0, 0.0
            elif held.query is not None and not held.query.isActive:
                error = held.query.exception()
                held.query, held.failures = None, held.failures + 1
                held.retry_at = now + min(MAX_BACKOFF_S, 2.0 ** (held.failures - 1))
                self.failures += 1
                STREAM_RESTARTS.set(self.failures)
                log.warning("stream_query_failed", stream=name, error=str(error)[:500] if error else "stopped",
                            retry_in_s=round(held.retry_at - now, 1))
            elif held.query is not None and held.failures and now - held.started_at >= MAX_BACKOFF_S:
                held.failures = 0  # ran well for a while: the next failure is retried at once again
            if held.query is None and now >= held.retry_at:
                self._start(name, held, now)
        STREAM_QUERIES.set(sum(1 for s in self.streams.values() if s.query is not None))

    def _start(self, name: str, held: _Stream, now: float) -> None:
        try:
            held.query = self.start(self.spark, self.settings, held.schema)
            held.started_at = now
        except Exception as exc:  # noqa: BLE001 - e.g. its topic is not there yet: retried with backoff
            held.failures += 1
            held.retry_at = now + min(MAX_BACKOFF_S, 2.0 ** (held.failures - 1))
            log.warning("stream_query_not_started", stream=name, error=f"{type(exc).__name__}: {str(exc)[:300]}",
                        retry_in_s=round(held.retry_at - now, 1))
            return
        log.info("stream_query_started", stream=name, attributes=list(held.schema.attribute_names),
                 checkpoint=str(checkpoint_of(self.settings, name)))

    def _stop(self, name: str, event: str, **fields: str) -> None:
        held = self.streams.get(name)
        if held is None or held.query is None:
            return
        try:
            held.query.stop()
        except Exception as exc:  # noqa: BLE001 - a query that failed meanwhile: nothing left to stop
            fields["stop_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        held.query = None
        log.info(event, stream=name, **fields)

    def stop_all(self) -> None:
        for name in list(self.streams):
            self._stop(name, "stream_query_stopped", reason="the evaluator is stopping")
