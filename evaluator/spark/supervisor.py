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
- restarts a stream's query on an empty checkpoint when the stream was deleted and declared again (its id in
  the registry changed; ``registry.claim_checkpoint``), its old shard clocks forgotten: a stream declared
  again under an old name starts clean, on its new topic, even if this job never saw it deleted (a stream
  merely missing from the registry, say Redis lost it, keeps its checkpoint);
- restarts a failed query after a backoff (1 s, doubling, at most ``MAX_BACKOFF_S``) while the others run;
- removes the checkpoint of a stream that was deleted (:class:`DeletedCheckpoints`).

A query is stopped between batches (``evaluator.spark.graceful``): its stream's stop file is made, and a later poll
(or the same one) that finds no batch running stops it; a batch still running after ``TOCSIN_EVALUATOR_STOP_TIMEOUT_S``
is interrupted, with a warning. Meanwhile the stream waits: a restart starts once the old query has stopped, and a
deleted stream's checkpoint stays until then.

What operators need to hear about goes to ``stats:evaluator`` (``core.redis_schema.stream_stat`` fields): when
each query last started (``QUERY_STARTED_AT``) and, while a query keeps failing, its failures in a row, since
when and the last error (``QUERY_FAILING``), which the web app's dead man's switch turns into the ``stream``
incident (``web.watchdog.stream``). A query that ran ``MAX_BACKOFF_S`` without failing clears it.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import structlog
from prometheus_client import Gauge
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery
from redis import RedisError

from core.redis_client import make_redis
from core.redis_schema import (
    CATALOG_READ_VERSION,
    HANDOFF_STORED,
    HANDOFF_WAITING,
    QUERY_FAILING,
    QUERY_STARTED_AT,
    RedisKeys,
    admission_waiting_by_shard,
    admission_waiting_field,
    catalog_read_field,
    handoff_field,
    per_shard,
    stream_stat,
)
from core.settings import Settings
from core.stream_names import TRADES
from core.streams import StreamSchema, topic_name
from evaluator.spark.checkpoint_fs import CheckpointFiles, child
from evaluator.spark.graceful import between_batches, hold, wait_between_batches
from evaluator.spark.handoff import stop_thread
from evaluator.spark.registry import STREAMS, RegistryReader, checkpoint_of, claim_checkpoint, text_of
from evaluator.spark.source import stop_file
from ingest.kafka import new_consumer

log = structlog.get_logger("evaluator")

MAX_BACKOFF_S = 60.0
STREAM_QUERIES = Gauge("tocsin_evaluator_stream_queries", "Declared streams (trades aside) with a running query")
STREAM_RESTARTS = Gauge("tocsin_evaluator_stream_query_failures", "Failed stream queries restarted since start")

Starter = Callable[[SparkSession, Settings, StreamSchema], StreamingQuery]


@dataclass(frozen=True)
class _Stopping:
    """A stop asked for: the query's source offers nothing new; it is stopped once its batch has ended."""

    event: str
    reason: str
    deadline: float


@dataclass
class _Stream:
    schema: StreamSchema
    incarnation: int | None = None  # the stream's row id: another one is a stream deleted and declared again
    query: StreamingQuery | None = None
    failures: int = 0
    retry_at: float = 0.0
    started_at: float = 0.0
    failing_since: float | None = None  # wall time of the first of the failures in a row
    earlier_failures: int = 0  # of those, the ones an earlier run of the job recorded
    stopping: _Stopping | None = None


def forget_in_redis(client: Any, keys: RedisKeys, name: str) -> None:
    """What a deleted stream's query left in Redis (the stream is gone, or declared again under its name): its
    sink's handoff (alerts of subscriptions deleted with the stream, which no query will store; this process's
    thread storing it is stopped first), its shards' sets of subscriptions awaiting admission, and its fields in
    ``stats:evaluator``: the shard clocks and batch fields (a successor with fewer shards would have its evaluated
    time held back by the others' clocks), the handoff and admission counts (the operators' dashboard and the
    dead man's switch would count them forever) and the catalog versions its shards read (a shard the successor
    does not have would keep its subscriptions "not evaluated yet" on their pages)."""
    stop_thread(keys, name)
    stats = keys.evaluator_stats
    pieces = [text_of(p) for p in client.lrange(keys.handoff(name), 0, -1)]
    fields = client.hgetall(stats)
    shards = admission_waiting_by_shard(fields).get(name, {})
    read = per_shard(fields, CATALOG_READ_VERSION).get(name, {})
    ours = (stream_stat(name, "shard_"), stream_stat(name, "last_batch_"))
    pipe = client.pipeline(transaction=False)
    for piece in pieces:
        pipe.delete(keys.handoff_piece(name, piece))
    pipe.delete(keys.handoff(name), *(keys.admission_waiting(name, shard) for shard in shards))
    pipe.hdel(stats, handoff_field(HANDOFF_WAITING, name), handoff_field(HANDOFF_STORED, name),
              *(admission_waiting_field(name, shard) for shard in shards),
              *(catalog_read_field(name, shard) for shard in read),
              *(f for f in map(text_of, fields) if f.startswith(ours)))
    pipe.execute()


class DeletedCheckpoints:
    """Removes the checkpoints of deleted streams: a stream no longer declared whose topic is gone too (deleting a
    stream deletes its topic first, ``subscriptions.streams.StreamService.delete``). A stream merely missing from
    the registry (Redis lost it) still has its topic, so it keeps its checkpoint and comes back where it was.

    Checked when the job starts (a deletion it did not see), when a stream leaves the registry, and, while some
    undeclared stream's checkpoint remains, every ``MAX_BACKOFF_S`` (a topic whose deletion Kafka had not
    finished)."""

    def __init__(self, spark: SparkSession, settings: Settings) -> None:
        self.settings = settings
        self.streams = CheckpointFiles(spark, child(settings.checkpoint_location, STREAMS))
        self.due_at = 0.0
        self.redis = make_redis(settings)
        self.keys = RedisKeys(settings)

    def check(self, declared: Collection[str], now: float, left: bool) -> None:
        """``left``: a stream left the registry since the last check."""
        if not left and now < self.due_at:
            return
        self.due_at = now + MAX_BACKOFF_S  # checked again then, unless nothing is left to check
        try:
            undeclared = [name for name in self.streams.names() if name not in declared]
            if not undeclared:
                self.due_at = math.inf
                return
            consumer = new_consumer(self.settings)
            try:
                topics = set(consumer.topics())
            finally:
                consumer.close()
            for name in undeclared:
                if topic_name(name, self.settings) not in topics:
                    forget_in_redis(self.redis, self.keys, name)  # first: a failure leaves it to be checked again
                    self.streams.delete(name)
                    log.info("stream_checkpoint_removed", stream=name, reason="the stream and its topic were deleted")
        except Exception as exc:  # noqa: BLE001 - Kafka or the file system not answering: checked again later
            log.warning("stream_checkpoints_not_checked", error=f"{type(exc).__name__}: {str(exc)[:300]}")


class StreamSupervisor:
    def __init__(self, spark: SparkSession, settings: Settings, registry: RegistryReader, start: Starter,
                 clock: Callable[[], float] = time.monotonic, deleted: DeletedCheckpoints | None = None) -> None:
        """``deleted``: removes deleted streams' checkpoints (the job's; None leaves checkpoints be)."""
        self.spark = spark
        self.deleted = deleted
        self.settings = settings
        self.registry = registry
        self.start = start
        self.clock = clock
        self.streams: dict[str, _Stream] = {}
        self.failures = 0
        self.stats, self.keys = registry.redis, registry.keys

    def queries(self) -> dict[str, StreamingQuery]:
        return {name: s.query for name, s in self.streams.items() if s.query is not None}

    def poll(self) -> None:
        declared = {name: schema for name, schema in self.registry.read().items() if name != TRADES}
        now = self.clock()
        left = [n for n in self.streams if n not in declared]
        for name in left:
            if self._stop(name, now, "stream_query_stopped", "the stream is no longer declared"):
                del self.streams[name]
                self._record(name, forget=(QUERY_FAILING, QUERY_STARTED_AT))
        if self.deleted is not None:  # a query still stopping keeps its checkpoint until it has stopped
            self.deleted.check({*declared, *self.streams}, now, bool(left))
        for name, schema in sorted(declared.items()):
            held = self.streams.get(name)
            incarnation = self.registry.incarnation(name)
            if held is None:
                held = self.streams[name] = _Stream(schema, incarnation)
                self._adopt(name, held)
            elif incarnation is not None and held.incarnation != incarnation:  # between two polls
                self._stop(name, now, "stream_query_restarting", "the stream was deleted and declared again")
                held.schema, held.incarnation, held.retry_at = schema, incarnation, 0.0
                self._recovered(name, held)
            elif held.schema != schema:
                self._stop(name, now, "stream_query_restarting", "the stream's schema changed")
                held.schema, held.retry_at = schema, 0.0
                self._recovered(name, held)
            elif held.stopping is not None:
                self._stop(name, now, held.stopping.event, held.stopping.reason)
            elif held.query is not None and not held.query.isActive:
                error = held.query.exception()
                held.query = None
                self.failures += 1
                STREAM_RESTARTS.set(self.failures)
                self._failed(name, held, now, "stream_query_failed", str(error)[:500] if error else "stopped")
            elif held.query is not None and (held.failures or held.failing_since is not None) \
                    and now - held.started_at >= MAX_BACKOFF_S:
                self._recovered(name, held)  # ran well for a while: the next failure is retried at once again
            if held.query is None and now >= held.retry_at:
                self._start(name, held, now)
        STREAM_QUERIES.set(sum(1 for s in self.streams.values() if s.query is not None and s.stopping is None))

    def _start(self, name: str, held: _Stream, now: float) -> None:
        try:
            stop_file(self.settings, name).unlink(missing_ok=True)  # its last query's, or a killed job's
            if claim_checkpoint(self.spark, self.settings, name, held.incarnation):
                self._forget_predecessor(name)
            held.query = self.start(self.spark, self.settings, held.schema)
            held.started_at = now
        except Exception as exc:  # noqa: BLE001 - e.g. its topic is not there yet: retried with backoff
            self._failed(name, held, now, "stream_query_not_started", f"{type(exc).__name__}: {str(exc)[:300]}")
            return
        self._record(name, write={QUERY_STARTED_AT: time.time()})
        log.info("stream_query_started", stream=name, attributes=list(held.schema.attribute_names),
                 checkpoint=checkpoint_of(self.settings, name))

    def _failed(self, name: str, held: _Stream, now: float, event: str, error: str) -> None:
        """One more failure in a row: retried after the backoff, and recorded for the dead man's switch."""
        held.failures += 1
        held.retry_at = now + min(MAX_BACKOFF_S, 2.0 ** (held.failures - 1))
        if held.failing_since is None:
            held.failing_since = time.time()
        in_a_row = held.earlier_failures + held.failures
        log.warning(event, stream=name, error=error, failures=in_a_row, retry_in_s=round(held.retry_at - now, 1))
        self._record(name, write={QUERY_FAILING: json.dumps(
            {"failures": in_a_row, "since": held.failing_since, "error": error[:300]})})

    def _recovered(self, name: str, held: _Stream) -> None:
        if held.failures or held.failing_since is not None:
            held.failures, held.failing_since, held.earlier_failures = 0, None, 0
            self._record(name, forget=(QUERY_FAILING,))

    def _adopt(self, name: str, held: _Stream) -> None:
        """Failures in a row an earlier run of the job recorded go on counting (so a job restart neither hides
        nor re-announces them); they are cleared as this run's would be, once the query has run well a while."""
        try:
            raw = self.stats.hget(self.keys.evaluator_stats, stream_stat(name, QUERY_FAILING))
        except RedisError:
            return
        if not raw:
            return
        try:
            earlier = json.loads(raw)
            held.earlier_failures, held.failing_since = int(earlier["failures"]), float(earlier["since"])
        except (ValueError, TypeError, KeyError):
            return  # unreadable: this run counts afresh (and overwrites it at its first failure)

    def _record(self, name: str, write: dict[str, float | str] | None = None, forget: tuple[str, ...] = ()) -> None:
        """Set or remove the stream's query fields of ``stats:evaluator``; Redis trouble costs the record only."""
        try:
            pipe = self.stats.pipeline()
            if write:
                pipe.hset(self.keys.evaluator_stats, mapping={stream_stat(name, f): v for f, v in write.items()})
            if forget:
                pipe.hdel(self.keys.evaluator_stats, *(stream_stat(name, f) for f in forget))
            pipe.execute()
        except RedisError as exc:
            log.warning("stream_query_state_not_recorded", stream=name, error=f"{type(exc).__name__}: {str(exc)[:200]}")

    def _forget_predecessor(self, name: str) -> None:
        """Remove what the deleted stream's query left in Redis (:func:`forget_in_redis`) before its successor starts."""
        try:
            forget_in_redis(self.stats, self.keys, name)
        except RedisError as exc:
            log.warning("stream_query_state_not_recorded", stream=name, error=f"{type(exc).__name__}: {str(exc)[:200]}")

    def _stop(self, name: str, now: float, event: str, reason: str) -> bool:
        """Ask the stream's query to stop, or go on stopping it: True once it has no query (stopped between
        batches, or interrupted past the deadline); a query already stopping keeps its first event and reason."""
        held = self.streams.get(name)
        if held is None or held.query is None:
            return True
        if held.stopping is None:
            held.stopping = _Stopping(event, reason, now + self.settings.evaluator_stop_timeout_s)
            try:
                hold(stop_file(self.settings, name))
            except OSError as exc:
                log.warning("stream_query_stop_file_not_made", stream=name, error=f"{type(exc).__name__}: {exc}"[:300])
        fields = {"reason": held.stopping.reason}
        try:
            if not between_batches(held.query):
                if now < held.stopping.deadline:
                    return False  # looked at again in the next poll
                log.warning("stream_query_batch_interrupted", stream=name,
                            reason="the batch under way outlived the stop timeout; it is evaluated again on restart")
            held.query.stop()
        except Exception as exc:  # noqa: BLE001 - a query that failed meanwhile: nothing left to stop
            fields["stop_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        log.info(held.stopping.event, stream=name, **fields)
        held.query, held.stopping = None, None
        stop_file(self.settings, name).unlink(missing_ok=True)
        return True

    def stop_all(self) -> None:
        """Stop every stream's query between batches, waiting at most ``TOCSIN_EVALUATOR_STOP_TIMEOUT_S``: for what
        runs the supervisor without the job (tests, benchmarks); the job stops them all with its own stop file."""
        for name in self.streams:
            self._stop(name, self.clock(), "stream_query_stopped", "the evaluator is stopping")
        deadline = time.monotonic() + self.settings.evaluator_stop_timeout_s
        for name, held in self.streams.items():
            if held.query is not None and held.stopping is not None:
                wait_between_batches(held.query, deadline)
                self._stop(name, math.inf, held.stopping.event, held.stopping.reason)  # past any deadline: now
