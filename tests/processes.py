"""Running Tocsin's own processes (Celery worker, dispatcher) as real child processes in tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from core.settings import Settings
from devstack.services import ManagedProcess, python_module, spawn


def worker_args(lane: str = "all", concurrency: int = 4) -> list[str]:
    return python_module("notifier.worker", "--lane", lane, "--pool", "threads", "--concurrency", str(concurrency),
                         "--loglevel", "INFO", "--without-gossip", "--without-mingle", "--without-heartbeat")


@contextmanager
def running(settings: Settings, log_dir: Path, *commands: tuple[str, list[str]]) -> Iterator[list[ManagedProcess]]:
    log_dir.mkdir(parents=True, exist_ok=True)
    processes = [spawn(name, args, log_dir / f"{name}.log", env=settings.to_env()) for name, args in commands]
    try:
        yield processes
    finally:
        for process in processes:
            process.stop()
