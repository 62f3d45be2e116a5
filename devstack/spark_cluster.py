"""A Spark standalone cluster on this machine: one master and N workers, each its own JVM.

Started from the ``bin/spark-class`` that pyspark's wheel ships, so no download is needed.
The evaluator submits to :attr:`SparkCluster.master_url` (``TOCSIN_SPARK_MASTER``) exactly as
it would to a real cluster: executors are separate JVMs launched by the workers, with Python
workers of their own. Used by the cluster tests (faults on a worker or the driver) and the
scaling benchmark (1 vs 2 workers).

Every process the cluster starts runs with its working directory under ``work_dir`` (the
master and workers are started there, executors run in ``work_dir/<app>/<executor>`` and their
Python daemons inherit it), so :func:`processes_under` finds them all, also after their parents
died: the tests assert that nothing is left once the cluster stopped.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from devstack.services import ManagedProcess, free_port, spawn, wait_for_port

HOST = "127.0.0.1"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


def spark_class() -> Path:
    """``bin/spark-class`` of the installed pyspark (its ``SPARK_HOME``)."""
    from pyspark.find_spark_home import _find_spark_home

    path = Path(_find_spark_home()) / "bin" / "spark-class"
    if not path.exists():
        raise FileNotFoundError(f"spark-class not found at {path}; is pyspark installed?")
    return path


def _stat(pid: int) -> tuple[int, int, int] | None:
    """``(parent pid, process group, start time)`` of a live process, None if it is gone (or a zombie)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses
    if fields[0] == "Z":
        return None
    return int(fields[1]), int(fields[2]), int(fields[19])


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (children, their children, …), from ``/proc``."""
    children: dict[int, list[int]] = {}
    for other in _pids():
        stat = _stat(other)
        if stat is not None:
            children.setdefault(stat[0], []).append(other)
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(children.get(child, []))
    return found


def processes_under(directory: Path) -> list[int]:
    """Live processes (of this user) whose working directory is ``directory`` or below it."""
    root = directory.resolve()
    found = []
    for pid in _pids():
        try:
            cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
        except OSError:  # gone, or not ours
            continue
        if (cwd == root or root in cwd.parents) and _stat(pid) is not None:
            found.append(pid)
    return found


def _kill_tree(process: ManagedProcess) -> None:
    """SIGKILL a JVM, everything below it and every process group below it (pyspark's daemon forms its own)."""
    below = descendants(process.process.pid)
    groups = {process.process.pid} | {stat[1] for pid in below if (stat := _stat(pid)) is not None}
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
    for pid in below:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    process.process.wait()


def _sweep(directory: Path, timeout_s: float = 10.0) -> None:
    """SIGKILL whatever still runs in ``directory`` until nothing does: a process that a dying parent forked into a
    group of its own after :func:`_kill_tree` looked (PySpark's daemon forks its workers), or one still exiting."""
    deadline = time.monotonic() + timeout_s
    while left := processes_under(directory):
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {left} under {directory} survive SIGKILL")
        time.sleep(0.05)


@dataclass(frozen=True)
class Machine:
    """Where a daemon runs: the address it binds and advertises (``--host``, ``SPARK_LOCAL_IP``) and the command
    prefix that starts a process there (none: here; ``ip netns exec …``: a host of a :class:`devstack.netns.Network`)."""

    address: str = HOST
    prefix: tuple[str, ...] = ()

    def command(self, args: Sequence[str]) -> list[str]:
        return [*self.prefix, *args]


@dataclass
class _Worker:
    process: ManagedProcess
    webui_port: int
    machine: Machine


class SparkCluster:
    """A master and ``workers`` workers of ``cores_per_worker`` cores and ``memory`` each; a context manager.

    ``worker_timeout_s`` is how long the master waits for a silent worker before it declares it dead
    (Spark's ``spark.worker.timeout``, 60 s by default): short here so that a killed worker stops
    being offered to applications soon after a test kills it.

    By default every daemon runs here on 127.0.0.1; ``master`` and ``machines`` (one per worker) place them on other
    addresses, each bound and advertised there (docs/cluster.md, *Several hosts*).
    """

    def __init__(self, workers: int = 2, cores_per_worker: int = 1, memory: str = "1g",
                 work_dir: Path | None = None, start_timeout_s: float = 120.0, worker_timeout_s: int = 15,
                 daemon_memory: str = "512m", master: Machine | None = None,
                 machines: Sequence[Machine] | None = None) -> None:
        if machines is not None and len(machines) != workers:
            raise ValueError(f"{len(machines)} machines for {workers} workers")
        self.master = master or Machine()
        self.machines = list(machines or [Machine()] * workers)
        self.workers = workers
        self.cores_per_worker = cores_per_worker
        self.memory = memory
        self._own_dir = work_dir is None
        self.work_dir = (work_dir or Path(tempfile.mkdtemp(prefix="tocsin-spark-"))).resolve()
        self.start_timeout_s = start_timeout_s
        self.worker_timeout_s = worker_timeout_s
        self.daemon_memory = daemon_memory
        self.port = free_port()
        self.webui_port = free_port()
        self.master_url = f"spark://{self.master.address}:{self.port}"
        self._master: ManagedProcess | None = None
        self._workers: list[_Worker | None] = [None] * workers

    # --- lifecycle -------------------------------------------------------------------------------
    def __enter__(self) -> SparkCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        (self.work_dir / "logs").mkdir(parents=True, exist_ok=True)
        self._master = spawn(
            "spark-master",
            self.master.command([str(spark_class()), MASTER_CLASS, "--host", self.master.address,
                                 "--port", str(self.port), "--webui-port", str(self.webui_port)]),
            self.work_dir / "logs" / "master.log", env=self._env(self.master), cwd=self.work_dir,
        )
        wait_for_port(self.master.address, self.port, self.start_timeout_s, self._master.process)
        for i in range(self.workers):
            self._start_worker(i)
        for i in range(self.workers):
            self._wait_registered(i)

    def stop(self) -> None:
        """Stop the workers (each ends its executors), then the master; kill whatever outlived that."""
        for i, worker in enumerate(self._workers):
            if worker is not None:
                self._stop_worker(worker)
                self._workers[i] = None
        if self._master is not None:
            self._master.stop()
            if self._master.process.poll() is None:
                _kill_tree(self._master)
            self._master = None
        deadline = time.monotonic() + 10
        while (left := processes_under(self.work_dir)) and time.monotonic() < deadline:
            time.sleep(0.1)  # a Python daemon ends by itself once its executor's pipe closed
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if self._own_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    # --- faults ----------------------------------------------------------------------------------
    def kill_worker(self, i: int) -> None:
        """SIGKILL worker ``i``'s JVM, its executor JVMs and their Python workers, as a lost machine would."""
        worker = self._workers[i]
        if worker is None:
            raise ValueError(f"worker {i} is not running")
        _kill_tree(worker.process)
        _sweep(self.work_dir / f"worker-{i}")
        self._workers[i] = None

    def restart_worker(self, i: int) -> None:
        """Start worker ``i`` again (on new ports: a new worker to the master) and wait until it is registered."""
        if self._workers[i] is not None:
            raise ValueError(f"worker {i} is running")
        self._start_worker(i)
        self._wait_registered(i)

    def alive_workers(self) -> int:
        """Workers of ours whose JVM runs and that the master lists as alive."""
        alive = {w.get("webuiaddress") for w in self.master_state().get("workers", []) if w.get("state") == "ALIVE"}
        return sum(1 for w in self._workers
                   if w is not None and w.process.process.poll() is None and self._webui(w) in alive)

    def app_processes(self) -> list[int]:
        """Live executors of applications and their Python workers (they run in ``<worker dir>/<app id>/<n>``)."""
        return [pid for app in self.work_dir.glob("worker-*/app-*") for pid in processes_under(app)]

    def master_state(self) -> dict:
        """The master's state as its web UI reports it (``/json/``): workers, applications, cores."""
        with urllib.request.urlopen(f"http://{self.master.address}:{self.webui_port}/json/", timeout=5) as response:
            state: dict = json.load(response)
        return state

    # --- internals -------------------------------------------------------------------------------
    def _env(self, machine: Machine) -> dict[str, str]:
        return {
            "SPARK_LOCAL_IP": machine.address,  # what the daemon, its web UI and its executors bind
            "SPARK_DAEMON_MEMORY": self.daemon_memory,
            # the master declares a worker dead after this silence; a worker heartbeats every quarter of it
            "SPARK_MASTER_OPTS": f"-Dspark.worker.timeout={self.worker_timeout_s}",
            "SPARK_WORKER_OPTS": f"-Dspark.worker.timeout={self.worker_timeout_s}",
            "SPARK_NO_DAEMONIZE": "1",
            # as on a machine of its own: executors import the application's code from what the application
            # ships them (spark.executorEnv, pyFiles), not from whatever started the cluster
            "PYTHONPATH": "",
        }

    def _start_worker(self, i: int) -> None:
        webui_port = free_port()
        work = self.work_dir / f"worker-{i}"
        work.mkdir(exist_ok=True)
        machine = self.machines[i]
        process = spawn(
            f"spark-worker-{i}",
            machine.command([str(spark_class()), WORKER_CLASS, self.master_url, "--host", machine.address,
                             "--cores", str(self.cores_per_worker), "--memory", self.memory,
                             "--webui-port", str(webui_port), "--work-dir", str(work)]),
            self.work_dir / "logs" / f"worker-{i}.log", env=self._env(machine), cwd=work,
        )
        self._workers[i] = _Worker(process, webui_port, machine)

    @staticmethod
    def _webui(worker: _Worker) -> str:
        return f"http://{worker.machine.address}:{worker.webui_port}"

    def _wait_registered(self, i: int) -> None:
        worker = self._workers[i]
        assert worker is not None
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            if worker.process.process.poll() is not None:
                raise RuntimeError(f"spark worker {i} exited with {worker.process.process.returncode}; "
                                   f"see {self.work_dir / 'logs' / f'worker-{i}.log'}")
            with contextlib.suppress(OSError, urllib.error.URLError, ValueError):
                workers = self.master_state().get("workers", [])
                if any(w.get("webuiaddress") == self._webui(worker) and w.get("state") == "ALIVE" for w in workers):
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"spark worker {i} did not register with {self.master_url} "
                                   f"in {self.start_timeout_s}s")
            time.sleep(0.2)

    def _stop_worker(self, worker: _Worker) -> None:
        below = descendants(worker.process.process.pid)
        worker.process.stop()  # SIGTERM: the worker's shutdown hook ends its executors
        if worker.process.process.poll() is None or any(_stat(pid) is not None for pid in below):
            for pid in below:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            if worker.process.process.poll() is None:
                _kill_tree(worker.process)
