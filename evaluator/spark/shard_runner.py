"""One shard's batch where its copy lives: restore, step, answer previews, and say what to persist.

The operator (``evaluator.spark.operator``) owns Spark's state; this module owns the shard's copy. It runs in the
operator's Python worker, or in a shard host (``evaluator.spark.shard_host``) that keeps the copy between batches
whichever Python worker Spark hands the shard's next task to. Either way the state is read through
:class:`ShardState` and only when the copy needs it (a copy that is current reads nothing), and the result says
what to write: the batch's change-log entry, or a new snapshot that replaces the log.

Restore: this process's copy if it is at most behind (it replays the log entries it missed), else a rebuild from
the snapshot and the log after it. A copy ahead of the state (its batch was retried after a failure) is rebuilt.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any, Protocol

import pandas as pd
import structlog

from core.settings import Settings
from evaluator.panerows import PaneRows
from evaluator.preview import PreviewAnswer, PreviewRequest
from evaluator.shard import BatchStats, ShardConfig
from evaluator.spark.catalog_source import CatalogSource, shared_catalog_source
from evaluator.spark.parse import shard_of
from evaluator.spark.sink import shard_output
from evaluator.spark.waiting import write_waiting
from evaluator.streams import StreamShape, refusal
from evaluator.substreams import SubstreamDelta, SubstreamShard

PREVIEW_ANSWER_TTL_S = 60
log = structlog.get_logger("evaluator")

#: This process's copies of the shards it has run, by (checkpoint, shard id, attributes), least recently used first
#: (a stream whose attributes changed restarts its query on the same checkpoint: its old copies are not reused).
_COPIES: dict[tuple[str, int, tuple[str, ...]], SubstreamShard] = {}
_COPIES_KEPT = 16


class ShardState(Protocol):
    """A shard's persisted state as a restore reads it: the snapshot and the change-log entries after it."""

    def snapshot(self) -> bytes | None: ...

    def log_entry(self, epoch: int) -> bytes | None: ...


@dataclass(frozen=True)
class ShardJob:
    """What a shard's copy is: which query's shard, its configuration, and the keys it owns."""

    settings: Settings
    config: ShardConfig
    checkpoint: str
    stream_name: str
    shape: StreamShape
    optional: frozenset[str] = frozenset()
    cells: bool = False
    shard_ids: tuple[int, ...] = ()  # the parser's hash partitioning (empty: one shard owns every key)


@dataclass
class BatchResult:
    """A batch's outcome: the rows for the sink, what to persist, and where the time went."""

    output: pd.DataFrame  # the sink's rows: the transitions, then the shard's clock record
    epoch: int
    base_epoch: int
    delta: bytes | None  # the change-log entry for ``epoch``, or None when ``snapshot`` replaces the log
    snapshot: bytes | None
    how: str  # cached | caught_up | rebuilt
    stats: BatchStats = field(default_factory=BatchStats)
    log_read_s: float = 0.0  # of restore_s: reading the snapshot and the log entries
    restore_s: float = 0.0
    evaluate_s: float = 0.0  # the step and the previews
    connect_s: float = 0.0  # reaching the shard's host, started first if it was not running (not sent by the host)
    catalog_version: int = 0  # of the catalog it evaluated: every change up to it is in (web.admission)

    def header(self) -> dict[str, Any]:
        """The small fields, as JSON-ready data (a shard host sends the output and the blobs apart)."""
        return {"epoch": self.epoch, "base_epoch": self.base_epoch, "how": self.how, "stats": asdict(self.stats),
                "log_read_s": self.log_read_s, "restore_s": self.restore_s, "evaluate_s": self.evaluate_s,
                "catalog_version": self.catalog_version}

    @classmethod
    def of(cls, header: dict[str, Any], output: pd.DataFrame, delta: bytes | None,
           snapshot: bytes | None) -> BatchResult:
        stats = BatchStats(**header.pop("stats"))
        return cls(output, **header, delta=delta, snapshot=snapshot, stats=stats)


def _owned(shard: int, shard_ids: tuple[int, ...], key: str) -> bool:
    return shard_of(key, shard_ids) == shard


class ShardRunner:
    """Runs batches of one query's shards on the copies this process keeps."""

    def __init__(self, job: ShardJob) -> None:
        self.job = job

    def _key(self, shard: int) -> tuple[str, int, tuple[str, ...]]:
        return (self.job.checkpoint, shard, self.job.config.attributes)

    def _restore(self, shard: int, epoch: int, base_epoch: int, state: ShardState) -> tuple[SubstreamShard, str, float]:
        job, reading = self.job, 0.0
        cached = _COPIES.pop(self._key(shard), None)
        if cached is not None and base_epoch <= cached.epoch <= epoch:
            shard_copy, how = cached, "cached" if cached.epoch == epoch else "caught_up"
        else:
            asked = time.perf_counter()
            base = state.snapshot()
            reading += time.perf_counter() - asked
            # state written before the stream gained attributes is widened as it is read
            shard_copy = (SubstreamShard.from_snapshot(job.config, base, job.optional, job.cells) if base
                          else SubstreamShard(job.config, job.optional, job.cells))
            shard_copy.epoch, how = base_epoch, "rebuilt"
        for missed in range(shard_copy.epoch + 1, epoch + 1):
            asked = time.perf_counter()
            entry = state.log_entry(missed)
            reading += time.perf_counter() - asked
            assert entry is not None, f"shard {shard}: batch {missed} is missing from the change log"
            shard_copy.replay(SubstreamDelta.from_bytes(entry, len(job.config.attributes)))
        shard_copy.epoch = epoch
        if job.shard_ids:
            shard_copy.owns = partial(_owned, shard, job.shard_ids)
        return shard_copy, how, reading

    def forget(self, shard: int) -> None:
        """Drop this process's copy of the shard: its next batch rebuilds from the state."""
        _COPIES.pop(self._key(shard), None)

    def run(self, shard: int, epoch: int, base_epoch: int, rows: PaneRows, progress: dict[int, int],
            state: ShardState) -> BatchResult:
        """The batch after ``epoch`` (the state's clock, its snapshot at ``base_epoch``)."""
        job = self.job
        started = time.perf_counter()
        shard_copy, how, log_read = self._restore(shard, epoch, base_epoch, state)
        restored = time.perf_counter()
        stats = BatchStats()
        source = shared_catalog_source(job.settings)
        catalog = source.share(job.stream_name, job.shape)
        # A step that raises leaves the copy half-applied: it was taken out of _COPIES above and is not put back.
        transitions, delta = shard_copy.step(rows, progress, catalog, stats)
        epoch += 1
        snapshot = blob = None
        if epoch - base_epoch >= job.settings.evaluator_snapshot_every:
            snapshot, base_epoch = shard_copy.snapshot(), epoch
        else:
            blob = delta.to_bytes()
        shard_copy.epoch = epoch
        _COPIES[self._key(shard)] = shard_copy
        while len(_COPIES) > _COPIES_KEPT:  # copies of queries that stopped would otherwise stay forever
            del _COPIES[next(iter(_COPIES))]
        write_waiting(source.redis, source.outage, source.keys, job.stream_name, shard, self._key(shard),
                      shard_copy.waiting(), continued=how == "cached")
        answer_previews(source, shard, shard_copy, job.stream_name, job.shape)
        # The shard's clock travels with its output, so the sink reports it once the alerts are stored.
        output = shard_output(transitions, shard, shard_copy.evaluated_at or 0, shard_copy.take_ranked())
        return BatchResult(output, epoch, base_epoch, blob, snapshot, how, stats, log_read, restored - started,
                           time.perf_counter() - restored, catalog_version=catalog.version)


def answer_previews(source: CatalogSource, shard: int, shard_copy: SubstreamShard, stream: str,
                    shape: StreamShape | None = None) -> None:
    """Answer the web app's condition previews on ``stream`` this shard has not answered yet (``web.conditions``).

    Never raises: the batch is the shard's, not the previews'. A preview that fails is answered with its reason
    (``PreviewAnswer.error``; one the query cannot evaluate, with the reason a subscription would be refused,
    ``evaluator.streams.refusal``), and only that request fails; one whose answer cannot be stored (Redis
    unreachable) is not marked answered, so the next batch answers it while the web app still waits."""
    try:
        requests = source.previews(shard, stream)
    except Exception as exc:  # noqa: BLE001 - Redis unreachable: the batch goes on, the requests wait
        log.warning("preview_requests_unread", shard=shard, stream=stream, reason=f"{type(exc).__name__}: {exc}")
        return
    keys = source.keys
    for request_id, request in requests:
        answer = _answer(shard, shard_copy, request_id, request, shape)
        try:
            pipe = source.redis.pipeline()
            pipe.rpush(keys.preview_answers(request_id), answer.to_json())
            pipe.expire(keys.preview_answers(request_id), PREVIEW_ANSWER_TTL_S)
            pipe.execute()
        except Exception as exc:  # noqa: BLE001 - asked again at the next batch
            log.warning("preview_answer_unstored", shard=shard, stream=stream, request_id=request_id,
                        reason=f"{type(exc).__name__}: {exc}")
            continue
        source.answered(shard, request_id, stream)


def _answer(shard: int, shard_copy: SubstreamShard, request_id: str, request: PreviewRequest,
            shape: StreamShape | None) -> PreviewAnswer:
    """The shard's answer to one request: its matches, or why it has none."""
    try:
        refused = refusal(request.condition, shape)  # e.g. asked of a schema the query does not run yet
        if refused is not None:
            return PreviewAnswer.failed(shard, shard_copy.evaluated_at, refused)
        return PreviewAnswer.of(shard, *shard_copy.preview(request.condition, request.keys), request.condition)
    except Exception as exc:  # the request's failure, told to whoever asked (logged with its traceback)
        reason = f"{type(exc).__name__}: {exc}"
        log.warning("preview_failed", shard=shard, request_id=request_id, reason=reason, exc_info=True)
        return PreviewAnswer.failed(shard, shard_copy.evaluated_at, reason)


def forget_copies() -> None:
    """Drop this process's copies (tests: a query restarted on another worker)."""
    _COPIES.clear()
