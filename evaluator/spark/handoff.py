"""The sink's handoff: transitions a micro-batch leaves to be stored after it ends, oldest first.

A burst (a first evaluation over a backlog, thousands of subscriptions created at once) can hold millions of
transitions, and storing them takes Redis tens of seconds: stored by its own batch, the whole stream, and every
other subscription's next alerts, waited behind it. The sink (``evaluator.spark.sink``) stores up to
``TOCSIN_SINK_BATCH_TRANSITIONS`` of a batch's transitions itself and puts the rest here, with every later
transition of a subscription that still has some waiting, so each subscription's transitions land in the order
they were evaluated. Subscriptions with nothing waiting are stored by their batch, as before.

Durable before the batch ends: pieces (Arrow IPC, zstd) in Redis, their ids in a list, written before the sink
returns, so Spark's commit never covers a transition held only in memory. A thread of the sink's process stores
them oldest first with the sink's own script (a piece stored twice adds nothing: its ids are seen) and pops each
once stored; a process that starts finds the pieces an earlier one left and stores them first. A batch's clocks
travel in its last piece while anything waits, and are reported once it is stored: a shard's clock still says
its alerts up to there are stored.

Bounded: a batch that would take the handoff past ``TOCSIN_SINK_HANDOFF_MAX_TRANSITIONS`` waits for it to drain
first, so a stream that makes more transitions than Redis stores, batch after batch, is held back as before the
handoff, rather than growing it without end. A failure of the thread other than Redis being away (which it rides
out) fails the sink's next batch, so the query fails where it can be seen and its restart tries again; the
thread also tries again by itself, after a growing pause, so a stream with no next batch still gets its alerts
stored once the cause is gone.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import redis
import structlog
from prometheus_client import Gauge

from core.redis_client import run_script
from core.redis_outage import Outage
from core.redis_schema import HANDOFF_STORED, HANDOFF_WAITING, RedisKeys, handoff_field

log = structlog.get_logger("evaluator")

WAITING = Gauge("tocsin_evaluator_handoff_waiting", "Transitions in the sink's handoff, to be stored after their "
                "batch (a burst beyond TOCSIN_SINK_BATCH_TRANSITIONS)", ["stream"])

_META = b"tocsin"  # the schema metadata key of a piece's report
_OPTIONS = pa.ipc.IpcWriteOptions(compression="zstd")  # 29 bytes a transition; lz4 57, none 105

#: KEYS[1]: the id list, KEYS[2]: the piece; ARGV[1]: its id. Pops the piece only if it is still the oldest, so a
#: thread of a query that was restarted cannot pop one its successor has not stored.
_POP = """
if redis.call('LINDEX', KEYS[1], 0) == ARGV[1] then
  redis.call('LPOP', KEYS[1])
  redis.call('DEL', KEYS[2])
  return 1
end
return 0
"""


_RUNNING: dict[str, Handoff] = {}  # by list key: this process's thread for each query's handoff
_RUNNING_LOCK = threading.Lock()


@dataclass
class Piece:
    """Rows of the sink's frame (``TRANSITIONS_SCHEMA``), and with a batch's last piece the stats fields to write
    once they are stored (its clocks)."""

    frame: pd.DataFrame
    report: dict[str, Any] | None = None

    def to_bytes(self) -> bytes:
        table = pa.Table.from_pandas(self.frame, preserve_index=False)
        table = table.replace_schema_metadata({_META: json.dumps(self.report).encode()})
        out = pa.BufferOutputStream()
        with pa.ipc.new_stream(out, table.schema, options=_OPTIONS) as writer:
            writer.write_table(table)
        return out.getvalue().to_pybytes()

    @classmethod
    def from_bytes(cls, blob: bytes) -> Piece:
        table = pa.ipc.open_stream(blob).read_all()  # a piece with no rows still has the frame's columns
        return cls(table.to_pandas(), json.loads((table.schema.metadata or {}).get(_META, b"null")))


def stop_thread(keys: RedisKeys, stream: str) -> None:
    """Stop this process's thread storing ``stream``'s handoff, if it runs (its query stopped for good: the stream
    was deleted), after the piece it is storing."""
    with _RUNNING_LOCK:
        running = _RUNNING.pop(keys.handoff(stream), None)
    if running is not None:
        running.stop()


class Handoff:
    """One query's handoff and the thread that stores it (see the module doc).

    ``store`` records a frame's transitions (the sink's script, riding out Redis outages) and returns how many were
    new; ``report`` writes a stored batch's stats fields with that count.
    """

    PIECE = 50_000  # rows per piece: ~1.5 MB in Redis each
    RETRY_FIRST_S = 1.0  # after a failure the thread tries again this much later, twice as late each time after
    RETRY_MOST_S = 30.0

    def __init__(self, client: redis.Redis, keys: RedisKeys, stream: str, outage: Outage,
                 store: Callable[[pd.DataFrame], int], report: Callable[[dict[str, Any], int], None],
                 most: int) -> None:
        self.client, self.keys, self.stream, self.outage = client, keys, stream, outage
        self.store, self.report, self.most = store, report, most
        self.list = keys.handoff(stream)
        self.pop = client.register_script(_POP)
        self._changed = threading.Condition()
        self._publishing = threading.Lock()
        self._waiting: Counter[int] = Counter()  # subscription id -> its transitions waiting
        self.rows = 0  # transitions waiting
        self.pieces = 0  # pieces waiting (a batch's clocks alone are one, with no rows)
        self.failure: BaseException | None = None
        self._stop = threading.Event()
        with _RUNNING_LOCK:  # a restarted query's sink replaces its predecessor's thread: one stores a list
            before = _RUNNING.pop(self.list, None)
            if before is not None:
                before.stop()  # first: the pieces counted below are then the ones left to store
            _RUNNING[self.list] = self
        for piece_id in outage.ride_out(lambda: client.lrange(self.list, 0, -1)):  # left by an earlier process
            piece = self._read(piece_id)
            if piece is not None:
                self._count(piece.frame, 1)
            self.pieces += 1
        WAITING.labels(stream).set(self.rows)  # served from the start, not only after a first burst
        self._publish()
        if self.pieces:
            log.info("handoff_resumed", stream=stream, transitions=self.rows)
        self._thread = threading.Thread(target=self._run, name=f"sink-handoff-{stream}", daemon=True)
        self._thread.start()

    # -- the sink's side ---------------------------------------------------------------------------------------

    def waiting(self) -> np.ndarray:
        """The subscriptions with transitions waiting: their later ones must wait behind them."""
        with self._changed:
            return np.fromiter(self._waiting, dtype=np.int64, count=len(self._waiting))

    def put(self, frame: pd.DataFrame, report: dict[str, Any]) -> bool:
        """Hand ``frame`` over, in pieces, its last carrying ``report``; returns once they are in Redis. False
        (nothing handed over) when ``frame`` is empty and nothing waits: the caller reports its batch itself.
        First waits while the handoff holds transitions and this would take it past its bound."""
        self.check()
        pieces = [frame.iloc[first:first + self.PIECE] for first in range(0, len(frame), self.PIECE)] or [frame]
        with self._changed:
            if frame.empty and not self.pieces:
                return False
            while self.rows and self.rows + len(frame) > self.most:
                self._changed.wait(1.0)
                self.check()
            # counted before they are in Redis: the thread may store them before this returns
            self._count(frame, 1)
            self.pieces += len(pieces)
        for n, rows in enumerate(pieces):
            blob = Piece(rows, report if n == len(pieces) - 1 else None).to_bytes()
            piece_id = uuid.uuid4().hex

            def write(piece_id: str = piece_id, blob: bytes = blob) -> None:
                pipe = self.client.pipeline(transaction=True)  # one slot: the list and its pieces share a tag
                pipe.set(self.keys.handoff_piece(self.stream, piece_id), blob)
                pipe.rpush(self.list, piece_id)
                pipe.execute()
            self.outage.ride_out(write)
        with self._changed:
            self._changed.notify_all()
        self._publish()
        return True

    def check(self) -> None:
        """Raise what stopped the thread, if anything did."""
        if self.failure is not None:
            raise RuntimeError(f"the sink's handoff of {self.stream!r} failed: {self.failure!r}") from self.failure

    def drained(self, timeout_s: float | None = None) -> bool:
        """Wait until nothing waits (``timeout_s`` None: as long as it takes); whether nothing does."""
        with self._changed:
            return self._changed.wait_for(lambda: not self.pieces or self.failure is not None, timeout_s) \
                and not self.pieces

    def stop(self) -> None:
        """Stop the thread after the piece it is storing; what waits stays in Redis for the next process."""
        self._stop.set()
        with self._changed:
            self._changed.notify_all()
        self._thread.join()

    def _publish(self, stored: int = 0) -> None:
        """The transitions waiting, and ``stored`` more stored, in ``stats:evaluator``: the operators' dashboard and
        the dead man's switch read them (the gauge is this process's)."""
        with self._publishing:  # the batch's side and the thread's: the last to write read the count last
            pipe = self.client.pipeline(transaction=False)
            pipe.hset(self.keys.evaluator_stats, handoff_field(HANDOFF_WAITING, self.stream), self.rows)
            if stored:
                pipe.hincrby(self.keys.evaluator_stats, handoff_field(HANDOFF_STORED, self.stream), stored)
            self.outage.execute(pipe, self._stop)

    # -- the thread --------------------------------------------------------------------------------------------

    def _count(self, frame: pd.DataFrame, sign: int) -> None:
        ids, counts = np.unique(frame["subscription_id"].to_numpy(dtype=np.int64), return_counts=True)
        for sid, n in zip(ids.tolist(), counts.tolist(), strict=True):
            left = self._waiting[sid] + sign * n
            if left > 0:
                self._waiting[sid] = left
            else:
                self._waiting.pop(sid, None)
        self.rows += sign * len(frame)
        WAITING.labels(self.stream).set(self.rows)

    def _pop(self, piece_id: str, piece_key: str) -> None:
        pipe = self.client.pipeline(transaction=False)
        run_script(self.pop, pipe, [self.list, piece_key], [piece_id])
        pipe.execute()

    def _read(self, piece_id: str | bytes) -> Piece | None:
        key = self.keys.handoff_piece(self.stream, piece_id.decode() if isinstance(piece_id, bytes) else piece_id)
        blob = self.outage.ride_out(lambda: self.client.get(key))
        assert blob is None or isinstance(blob, bytes), "the sink's client does not decode replies"
        return None if blob is None else Piece.from_bytes(blob)

    def _pieces(self) -> Iterator[tuple[str, Piece | None]]:
        """The oldest piece, as long as there is one (None: its blob is gone, a crash between the two pops)."""
        while not self._stop.is_set():
            head = self.outage.ride_out(lambda: self.client.lindex(self.list, 0), self._stop)
            if head is None:
                return
            piece_id = head.decode() if isinstance(head, bytes) else head
            yield piece_id, self._read(piece_id)

    def _run(self) -> None:
        """Store the pieces as they come. A failure is kept for the sink's next batch to raise, and the thread
        tries again after a growing pause: a stream with no next batch (no new record) would otherwise keep its
        evaluated alerts unstored until one comes; the first piece stored clears it."""
        pause = self.RETRY_FIRST_S
        while not self._stop.is_set():
            try:
                self._store_waiting()
                pause = self.RETRY_FIRST_S
            except Exception as exc:  # kept for the next batch to raise, and tried again
                log.error("handoff_failed", stream=self.stream, error=repr(exc), retry_in_s=pause, exc_info=True)
                with self._changed:
                    self.failure = exc
                    self._changed.notify_all()
                self._stop.wait(pause)
                pause = min(2 * pause, self.RETRY_MOST_S)
            except BaseException as exc:
                with self._changed:
                    self.failure = exc
                    self._changed.notify_all()
                raise

    def _store_waiting(self) -> None:
        """Wait up to a second for pieces, then store every one waiting, oldest first."""
        with self._changed:
            if not self._changed.wait_for(lambda: self.pieces > 0 or self._stop.is_set(), 1.0):
                return
        stored = 0
        for piece_id, piece in self._pieces():
            stored += 1
            written = self.store(piece.frame) if piece is not None and not piece.frame.empty else 0
            if piece is not None and piece.report is not None:
                self.report(piece.report, written)
            elif written:
                self.report({}, written)
            piece_key = self.keys.handoff_piece(self.stream, piece_id)
            self.outage.ride_out(partial(self._pop, piece_id, piece_key))
            with self._changed:
                if piece is not None:
                    self._count(piece.frame, -1)
                if self.failure is not None:
                    log.info("handoff_recovered", stream=self.stream, after=repr(self.failure))
                    self.failure = None
            self._publish(0 if piece is None else len(piece.frame))  # before it counts as gone: drained() sees it
            with self._changed:
                self.pieces -= 1
                self._changed.notify_all()
        if not stored:  # counted by a batch still writing them: it notifies once they are in
            with self._changed:
                self._changed.wait(0.05)
