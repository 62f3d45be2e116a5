"""Shard hosts: each shard's copy in a process of its own on each executor, so no task catches up for another's.

Spark hands a task the oldest idle Python worker of its pool, so with two shards the two operator tasks of a
batch swap workers every other batch, and a worker whose copy is a batch behind replays the change-log entry it
missed: at a live 20,000 events/s that replay was as costly as evaluating the batch (restore 32 % of the
operator's time, docs/evaluator.md: *Which worker runs a shard*). A shard host holds one shard's copy for the life of the
executor's Python daemon; the operator's task, whichever worker runs it, hands it the batch's pane rows over a
Unix socket, answers its reads of Spark's state (needed only to rebuild) and writes what it returns. Two shards,
two hosts: the batch still evaluates on both cores.

Trust: the socket directory is private to the user (refused otherwise); a host serves one task at a time; it
exits when the process that bounds it (the Spark Python daemon, or the process that started it outside Spark) is
gone, or after ``TOCSIN_EVALUATOR_SHARD_HOST_IDLE_S`` without a batch. A host that dies or cannot start costs a
rebuild, not a batch: the operator runs that batch in its own worker (``evaluator.spark.operator``). A batch that
fails in the host fails the task as it would in the worker, and the host keeps no copy of it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import pickle
import select
import stat
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from typing import Any

import pyarrow as pa
import structlog

from core import cli
from core.gc_policy import apply_gc_policy
from evaluator.panerows import PaneRows
from evaluator.spark.shard_runner import BatchResult, ShardJob, ShardRunner, ShardState

log = structlog.get_logger("evaluator")

#: How long a worker waits for a host it started to listen (it imports the evaluator: ~1-2 s).
START_TIMEOUT_S = 60.0
#: How long a host waits for a task's next message (a task sends at once): a task that connected and went silent
#: (its worker stopped, not killed) must not hold the shard's host, and every later batch of the shard, forever.
TASK_SILENCE_S = 60.0
_STARTED: list[subprocess.Popen] = []  # hosts this process started, reaped once they exit


class ShardHostError(RuntimeError):
    """The batch failed inside the host: the task fails with the host's traceback, as it would in the worker."""


# -- wire: a JSON header, then the blobs it announces (None travels as absent) -------------------------------------

def send(conn: Connection, header: dict[str, Any], *blobs: bytes | None) -> None:
    conn.send_bytes(json.dumps({**header, "blobs": [b is not None for b in blobs]}).encode())
    for blob in blobs:
        if blob is not None:
            conn.send_bytes(blob)


def receive(conn: Connection, timeout_s: float | None = None) -> tuple[dict[str, Any], list[bytes | None]]:
    """The next message; TimeoutError if none starts within ``timeout_s`` (None: wait as long as it takes)."""
    if timeout_s is not None and not conn.poll(timeout_s):
        raise TimeoutError(f"nothing received in {timeout_s} s")
    header = json.loads(conn.recv_bytes())
    return header, [conn.recv_bytes() if present else None for present in header.pop("blobs")]


# -- where a shard's host listens ----------------------------------------------------------------------------------

def socket_dir() -> Path:
    """This user's private directory for host sockets; refused if anyone else could write to it."""
    path = Path(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()) / f"tocsin-shards-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise PermissionError(f"{path} is not a directory private to this user: no shard hosts")
    return path


def anchor_pid() -> int:
    """The process whose life bounds a host: the Spark Python daemon that forked this worker (Spark retires idle
    workers; the daemon lives as long as the executor), or the JVM that started a worker without one; outside
    Spark, this process."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name in ("pyspark.daemon", "pyspark.worker"):
        return os.getppid()
    return os.getpid()


def address_of(job: ShardJob, shard: int, anchor: int) -> str:
    """One host per anchor, query, shard and configuration: a changed setting or schema never reuses a copy."""
    identity = repr((anchor, job.checkpoint, shard, job.config, sorted(job.optional), job.cells, job.shard_ids,
                     job.stream_name, job.shape.attributes, sorted(job.shape.optional), job.shape.dimensions,
                     job.settings.model_dump_json()))
    return str(socket_dir() / f"{hashlib.sha256(identity.encode()).hexdigest()[:24]}.sock")


# -- the operator's side -------------------------------------------------------------------------------------------

@contextmanager
def _locked(address: str):  # noqa: ANN202 - a context manager
    with open(address + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _reap() -> None:
    """Collect the exit of hosts this process started (a dead child is a zombie until its parent waits)."""
    for done in [p for p in _STARTED if p.poll() is not None]:
        _STARTED.remove(done)


def _start(address: str, anchor: int, job: ShardJob, idle_s: float) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    # In this worker's process group, which is the pyspark daemon's: the daemon's SIGHUP to its group when the
    # executor stops ends the host with the workers (the watchdog below is for a daemon that could not send it).
    host = subprocess.Popen([sys.executable, "-m", "evaluator.spark.shard_host"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=env, close_fds=True)
    _STARTED.append(host)
    assert host.stdin is not None and host.stdout is not None
    with host.stdin:
        pickle.dump((address, anchor, job, idle_s, TASK_SILENCE_S), host.stdin)
    with host.stdout:
        ready, _, _ = select.select([host.stdout], [], [], START_TIMEOUT_S)
        if not ready or host.stdout.readline().strip() != b"ready":
            host.kill()
            raise OSError(f"shard host {address} did not start")


def connect(job: ShardJob, shard: int, idle_s: float) -> Connection:
    """A connection to the shard's host, started if there is none (one start at a time per host)."""
    _reap()
    anchor = anchor_pid()
    address = address_of(job, shard, anchor)
    try:
        return Client(address, family="AF_UNIX")
    except (FileNotFoundError, ConnectionRefusedError):
        pass
    with _locked(address):
        try:
            return Client(address, family="AF_UNIX")
        except (FileNotFoundError, ConnectionRefusedError):
            _start(address, anchor, job, idle_s)
    return Client(address, family="AF_UNIX")


def run_on_host(job: ShardJob, idle_s: float, shard: int, epoch: int, base_epoch: int, rows: PaneRows,
                progress: dict[int, int], state: ShardState) -> BatchResult:
    """The batch, run by the shard's host; its reads of the state are answered from ``state``. Raises
    :class:`ShardHostError` if the batch failed there, OSError or EOFError if the host could not be reached."""
    asked = time.perf_counter()
    with connect(job, shard, idle_s) as conn:
        connect_s = time.perf_counter() - asked
        send(conn, {"op": "batch", "shard": shard, "epoch": epoch, "base_epoch": base_epoch,
                    "progress": {str(p): t for p, t in progress.items()}}, rows.to_bytes())
        while True:
            header, blobs = receive(conn)
            op = header.pop("op")
            if op == "snapshot":
                send(conn, {"op": "state"}, state.snapshot())
            elif op == "log":
                send(conn, {"op": "state"}, state.log_entry(int(header["epoch"])))
            elif op == "result":
                output, delta, snapshot = blobs
                assert output is not None
                result = BatchResult.of(header, pa.ipc.open_stream(output).read_all().to_pandas(), delta, snapshot)
                result.connect_s = connect_s
                return result
            else:
                raise ShardHostError(f"shard {shard} failed in its host:\n{header.get('message')}")


# -- the host's side -----------------------------------------------------------------------------------------------

class _TaskGone(Exception):
    """The task's connection broke while the host read the state through it (the task was cancelled or its worker
    killed): the batch is abandoned, and the copy with it."""


@dataclass
class _RemoteState:
    """The operator's state, read over the task's connection."""

    conn: Connection
    silence_s: float

    def _ask(self, header: dict[str, Any]) -> bytes | None:
        try:
            send(self.conn, header)
            _, blobs = receive(self.conn, self.silence_s)
        except (OSError, EOFError) as error:
            raise _TaskGone from error
        return blobs[0]

    def snapshot(self) -> bytes | None:
        return self._ask({"op": "snapshot"})

    def log_entry(self, epoch: int) -> bytes | None:
        return self._ask({"op": "log", "epoch": epoch})


class _Host:
    def __init__(self, job: ShardJob, silence_s: float) -> None:
        self.runner = ShardRunner(job)
        self.silence_s = silence_s
        self.busy = threading.Lock()
        self.last = time.monotonic()

    def serve(self, conn: Connection) -> None:
        """One task's batch. A task that goes away leaves the next one to find the copy current or rebuild it; a
        request this host cannot read costs that task, never the host."""
        with conn, self.busy:
            try:
                self._serve(conn)
            except (OSError, EOFError, _TaskGone) as error:
                log.warning("shard_host_task_gone", error=repr(error))
            except Exception:  # the host goes on serving the shard's other batches
                log.exception("shard_host_request_failed")
            finally:
                self.last = time.monotonic()

    def _serve(self, conn: Connection) -> None:
        header, blobs = receive(conn, self.silence_s)
        shard = int(header["shard"])
        delivered = False
        try:
            delivered = self._answer(conn, shard, header, blobs)
        finally:
            if not delivered:
                # The task fails, or may run the batch itself (the operator's fallback, on a catalog this host did
                # not see): the copy this batch made need not be the one the state will hold. The next one rebuilds.
                self.runner.forget(shard)

    def _answer(self, conn: Connection, shard: int, header: dict[str, Any], blobs: list[bytes | None]) -> bool:
        """Run the batch and send its result (True), or the error it failed with (False)."""
        try:
            assert blobs and blobs[0] is not None, "a batch without its pane rows"
            progress = {int(p): int(t) for p, t in header["progress"].items()}
            result = self.runner.run(shard, int(header["epoch"]), int(header["base_epoch"]),
                                     PaneRows.from_bytes(blobs[0]), progress, _RemoteState(conn, self.silence_s))
            # the output as Arrow: a drain batch has tens of thousands of transitions (as JSON records: ~0.5 s)
            output = pa.BufferOutputStream()
            table = pa.Table.from_pandas(result.output, preserve_index=False)
            with pa.ipc.new_stream(output, table.schema) as writer:
                writer.write_table(table)
        except _TaskGone:
            raise
        except Exception as error:  # noqa: BLE001 - the task fails with it, in the worker that asked
            send(conn, {"op": "error", "message": "".join(traceback.format_exception(error))})
            return False
        send(conn, {"op": "result", **result.header()}, output.getvalue().to_pybytes(), result.delta, result.snapshot)
        return True

    def watch(self, address: str, anchor: int, idle_s: float) -> None:
        """Exit once the anchor is gone, or after ``idle_s`` without a batch (never during one)."""
        while True:
            time.sleep(1.0)
            gone = not _alive(anchor)
            if gone or (time.monotonic() - self.last > idle_s and self.busy.acquire(blocking=False)):
                Path(address).unlink(missing_ok=True)
                if gone:  # nobody computes this address again
                    Path(address + ".lock").unlink(missing_ok=True)
                os._exit(0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main(argv: list[str] | None = None) -> None:
    cli.no_arguments(__doc__, "python -m evaluator.spark.shard_host", argv)  # its job comes on stdin
    address, anchor, job, idle_s, silence_s = pickle.load(sys.stdin.buffer)  # from the worker that started this host
    apply_gc_policy(job.settings.python_gc_threshold)  # this process holds a shard: many long-lived objects
    Path(address).unlink(missing_ok=True)  # a dead host's socket (the starter holds the lock)
    listener = Listener(address, family="AF_UNIX")
    host = _Host(job, silence_s)
    threading.Thread(target=host.watch, args=(address, anchor, idle_s), daemon=True).start()
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # the starter stopped reading: later output is a log's
    while True:
        host.serve(listener.accept())


if __name__ == "__main__":
    main()
