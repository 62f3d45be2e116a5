"""Shard hosts, as real processes on a Unix socket (no Spark: tests/evaluator/spark/test_shard_hosts_in_spark.py
runs them under the query): a host keeps its shard's copy between batches whichever process asks, agrees with a
copy run in the asking process, rebuilds when its copy is not the state's, survives a failed batch, and goes away
with its anchor or when idle. The state store is a dict here (what Spark's keeps: snapshot, log, clock)."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
from multiprocessing.connection import Client
from pathlib import Path

import pandas as pd
import psutil
import pytest
import redis

from core.redis_schema import RedisKeys
from core.settings import Settings
from core.stream_names import TRADES
from evaluator.catalog import Catalog
from evaluator.shard import ShardConfig
from evaluator.spark import shard_host
from evaluator.spark.operator import ShardProcessor
from evaluator.spark.parse import PaneParser
from evaluator.spark.shard_host import ShardHostError, address_of, run_on_host, socket_dir
from evaluator.spark.shard_runner import BatchResult, ShardJob, ShardRunner, forget_copies
from evaluator.spec import SubscriptionSpec
from evaluator.streams import StreamShape
from ingest.model import ATTRIBUTES, Event, Heartbeat
from subscriptions.language import parse_condition
from subscriptions.service import publish_catalog
from tests.evaluator.shard_state import State
from tests.evaluator.streams import wait_until
from tests.evaluator.test_pane_parser import NOW, frame, run
from tests.evaluator.test_shard import pane_rows
from tests.evaluator.test_stream_operator import Handle

T0 = 1_700_000_000_000


def job_for(settings: Settings, name: str, snapshot_every: int = 1000) -> ShardJob:
    settings = settings.model_copy(update={"evaluator_snapshot_every": snapshot_every})
    config = ShardConfig(ATTRIBUTES, settings.pane_ms, 60_000, 0, 1)
    return ShardJob(settings, config, str(settings.data_dir / name), TRADES, StreamShape(TRADES, ATTRIBUTES))


def batch(i: int) -> tuple:
    """The i-th batch: three events of key A in its second, then progress past it (COUNT >= 3 fires each time)."""
    events = [("A", T0 + i * 1_000 + j * 100, 10.0 + i, 1.0) for j in range(3)]
    return pane_rows(events), {0: T0 + (i + 1) * 1_000 + 500}


def hosted(job: ShardJob, state: State, i: int, idle_s: float = 60.0) -> BatchResult:
    rows, progress = batch(i)
    result = run_on_host(job, idle_s, 0, *state.clock, rows, progress, state)
    state.write(result)
    return result


def host_pids(job: ShardJob) -> list[int]:
    """The processes listening on the job's shard 0 address."""
    address = address_of(job, 0, os.getpid())
    return [p.pid for p in psutil.process_iter(["cmdline"]) if "evaluator.spark.shard_host" in (p.info["cmdline"] or [])
            and listens_on(p, address)]


def listens_on(process: psutil.Process, address: str) -> bool:
    """Whether ``process`` listens on ``address``; a process that ended meanwhile does not (a race, not an error)."""
    try:
        return any(c.laddr == address for c in process.net_connections(kind="unix"))
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False


def refused(address: str) -> bool:
    try:
        Client(address, family="AF_UNIX").close()
    except ConnectionRefusedError:
        return True
    return False


@pytest.fixture
def busy(settings: Settings) -> Settings:
    spec = SubscriptionSpec(1, parse_condition("COUNT(*) OVER 1s >= 3"))
    assert publish_catalog(redis.Redis.from_url(settings.redis_url), RedisKeys(settings), Catalog(1, [spec]))
    return settings


def test_a_host_keeps_its_copy_and_agrees_with_a_copy_in_this_process(busy: Settings) -> None:
    job, local_job = job_for(busy, "hosted"), job_for(busy, "local")
    state, local_state = State(), State()
    forget_copies()
    transitions, reached = [], []
    for i in range(6):
        result = hosted(job, state, i)
        reached.append(result.connect_s)
        rows, progress = batch(i)
        local = ShardRunner(local_job).run(0, *local_state.clock, rows, progress, local_state)
        local_state.write(local)
        assert result.output.equals(local.output)
        assert result.delta == local.delta
        forget_copies()  # this process's copy is gone each time: the next local batch rebuilds from its state
        assert (local.how, result.how) == ("rebuilt", "rebuilt" if i == 0 else "cached")
        transitions += [(r["key"], r["state"]) for r in result.output.to_dict("records") if r["state"] != "clock"]
    assert transitions == [("A", "firing")]
    assert state.reads == 1, "the host read the state once: its first batch (an empty snapshot)"
    # the first batch started the host (a new interpreter), the others only connected to it
    assert reached[0] > max(reached[1:]), reached


def test_a_host_answers_whichever_process_asks(busy: Settings) -> None:
    job, state = job_for(busy, "shared"), State()
    hosted(job, state, 0)
    # another process (another Spark worker) with the same anchor reaches the same host and its copy
    script = (
        "import os, pickle, sys\n"
        "from evaluator.spark import shard_host\n"
        "shard_host.anchor_pid = lambda: int(sys.argv[1])\n"
        "job, clock, rows, progress = pickle.load(sys.stdin.buffer)\n"
        "class Nothing:\n"
        "    def snapshot(self): raise AssertionError('read')\n"
        "    def log_entry(self, epoch): raise AssertionError('read')\n"
        "result = shard_host.run_on_host(job, 60.0, 0, *clock, rows, progress, Nothing())\n"
        "sys.stdout.write(result.how)\n"
    )
    rows, progress = batch(1)
    other = subprocess.run([sys.executable, "-c", script, str(os.getpid())], capture_output=True,
                           input=pickle.dumps((job, state.clock, rows, progress)),
                           env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}, check=True)
    assert other.stdout == b"cached"


def test_a_retried_batch_and_a_lost_host_rebuild_from_the_state(busy: Settings) -> None:
    job, state = job_for(busy, "retried", snapshot_every=3), State()
    first = [hosted(job, state, i) for i in range(4)]  # batch 3 wrote a snapshot, batch 4 a log entry
    assert state.base is not None and list(state.log) == [4]
    # the task of batch 4 failed after the host stepped: Spark runs it again on the state before it
    state.clock, state.log = (3, 3), {}
    again = hosted(job, state, 3)
    assert again.how == "rebuilt" and again.output.equals(first[3].output)
    # the host is killed: the next batch starts another, which rebuilds from the snapshot and the log
    (pid,) = host_pids(job)
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: refused(address_of(job, 0, os.getpid())), 10)  # its threads gone too, and the socket with them
    after = hosted(job, state, 4)
    assert after.how == "rebuilt"
    assert host_pids(job) != [pid]


def test_a_failed_batch_fails_with_the_hosts_traceback_and_the_host_goes_on(busy: Settings) -> None:
    job, state = job_for(busy, "failing"), State()
    hosted(job, state, 0)
    rows, progress = batch(1)
    with pytest.raises(ShardHostError, match="missing from the change log"):
        run_on_host(job, 60.0, 0, 5, 0, rows, progress, state)  # a clock at 5 with no log: the restore fails
    assert hosted(job, state, 1).how == "rebuilt", "the copy the failure touched was not kept"


def test_a_host_exits_with_its_anchor_and_when_idle(busy: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    anchor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    monkeypatch.setattr(shard_host, "anchor_pid", lambda: anchor.pid)
    job, state = job_for(busy, "anchored"), State()
    hosted(job, state, 0)
    address = Path(address_of(job, 0, anchor.pid))
    assert address.exists()
    anchor.kill()
    anchor.wait()
    wait_until(lambda: not address.exists(), 10)
    assert not Path(f"{address}.lock").exists(), "nobody computes a gone anchor's address again"

    monkeypatch.setattr(shard_host, "anchor_pid", os.getpid)
    idle, state = job_for(busy, "idle"), State()
    hosted(idle, state, 0, idle_s=1.0)
    address = Path(address_of(idle, 0, os.getpid()))
    assert address.exists()
    wait_until(lambda: not address.exists(), 10)


def test_a_socket_directory_others_can_write_to_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    public = tmp_path / f"tocsin-shards-{os.getuid()}"
    public.mkdir(mode=0o777)
    public.chmod(0o777)
    with pytest.raises(PermissionError):
        socket_dir()
    public.chmod(0o700)
    assert socket_dir() == public


def test_the_operator_runs_the_batch_itself_when_no_host_can_be_reached(busy: Settings, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    (tmp_path / f"tocsin-shards-{os.getuid()}").mkdir(mode=0o777)
    (tmp_path / f"tocsin-shards-{os.getuid()}").chmod(0o777)  # not private: no host is started
    events = [Event(key="A", ts=NOW - 5_000 + j * 100, price=1, volume=2).to_json() for j in range(3)]
    raw = frame([*events, Heartbeat(partition=0, ts=NOW - 2_000).to_json()]).assign(partition=0)
    rows = run(PaneParser(busy, (0,)), raw)
    processor = ShardProcessor(busy, 1, (0,))
    processor.init(Handle())
    out = pd.concat(list(processor.handleInputRows((0,), iter([rows]), None)), ignore_index=True)
    assert [(r["key"], r["state"]) for r in out.to_dict("records")] == [("A", "firing"), ("", "clock")]
    stats = redis.Redis.from_url(busy.redis_url).hgetall(RedisKeys(busy).evaluator_stats)
    assert int(stats[b"shard_host_failures"]) == 1 and int(stats[b"shard_restore_rebuilt"]) == 1


def test_a_task_that_connects_and_goes_silent_does_not_hold_the_host(busy: Settings,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shard_host, "TASK_SILENCE_S", 1.0)
    job, state = job_for(busy, "silent"), State()
    hosted(job, state, 0)
    silent = Client(address_of(job, 0, os.getpid()), family="AF_UNIX")  # a worker stopped right after connecting
    try:
        started = time.monotonic()
        assert hosted(job, state, 1).how == "cached"  # waited for the silent one to be dropped, then ran
        assert time.monotonic() - started >= 0.5
    finally:
        silent.close()


def test_a_result_the_task_never_took_leaves_no_copy_behind(busy: Settings) -> None:
    """The task sent its batch and went away before the result (it ran the batch itself, as the operator does
    when its host fails it): the state moves on without the host's copy, which must not pass for the state's."""
    job, state = job_for(busy, "abandoned"), State()
    hosted(job, state, 0)
    rows, progress = batch(1)
    gone = Client(address_of(job, 0, os.getpid()), family="AF_UNIX")
    shard_host.send(gone, {"op": "batch", "shard": 0, "epoch": state.clock[0], "base_epoch": state.clock[1],
                           "progress": {str(p): t for p, t in progress.items()}}, rows.to_bytes())
    gone.close()
    forget_copies()
    state.write(ShardRunner(job).run(0, *state.clock, rows, progress, state))  # the worker's own run, persisted
    assert hosted(job, state, 2).how == "rebuilt", "the host's copy of batch 1 was not the state's"


def test_a_host_ends_with_its_workers_process_group(busy: Settings) -> None:
    """The pyspark daemon ends its workers with a SIGHUP to its process group: the hosts they started go too."""
    job, state = job_for(busy, "grouped"), State()
    script = (
        "import os, pickle, sys, time\n"
        "from evaluator.spark import shard_host\n"
        "shard_host.anchor_pid = lambda: int(sys.argv[1])  # an anchor that lives on: only the group ends it\n"
        "job, clock, rows, progress, state = pickle.load(sys.stdin.buffer)\n"
        "shard_host.run_on_host(job, 60.0, 0, *clock, rows, progress, state)\n"
        "sys.stdout.write('ran\\n'); sys.stdout.flush(); time.sleep(120)\n"
    )
    rows, progress = batch(0)
    worker = subprocess.Popen([sys.executable, "-c", script, str(os.getpid())], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, start_new_session=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert worker.stdin is not None and worker.stdout is not None
    worker.stdin.write(pickle.dumps((job, state.clock, rows, progress, state)))
    worker.stdin.close()
    assert worker.stdout.readline() == b"ran\n"
    (host,) = host_pids(job)
    assert os.getpgid(host) == worker.pid
    os.killpg(worker.pid, signal.SIGHUP)
    worker.wait()
    # Ended: gone, or a zombie nobody reaps (its parent, the worker, is gone; in a container PID 1 may not reap).
    # Waiting for it to disappear instead took 123 s of a CI-mode run (psutil waited its whole 120 s).
    wait_until(lambda: _ended(host), timeout_s=60)


def _ended(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_request_the_host_cannot_read_costs_that_request_not_the_host(busy: Settings) -> None:
    job, state = job_for(busy, "garbled"), State()
    hosted(job, state, 0)
    garbled = Client(address_of(job, 0, os.getpid()), family="AF_UNIX")
    shard_host.send(garbled, {"op": "batch", "epoch": 1})  # no shard, no rows: not a batch this host can run
    with pytest.raises(EOFError):
        garbled.recv_bytes()  # dropped
    garbled.close()
    assert hosted(job, state, 1).how == "cached", "the same host, with its copy, ran the next batch"
