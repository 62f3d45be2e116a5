"""The local runner starts the whole platform and Ctrl-C stops all of it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from infra.services import free_port
from infra.settings import Settings
from ingest.kafka import topic_end_offsets
from subscriptions.accounts import AccountService
from subscriptions.db import session_factory

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def _cmdline(process: psutil.Process) -> str:
    """Its command line, or "" for a helper that already exited (Spark's launcher does)."""
    try:
        return " ".join(process.cmdline())
    except (psutil.ZombieProcess, psutil.NoSuchProcess):
        return ""


def test_runner_starts_everything_and_stops_cleanly(tmp_path: Path) -> None:
    settings = Settings(
        kafka_bootstrap=f"127.0.0.1:{free_port()}",
        redis_url=f"redis://127.0.0.1:{free_port()}/0",  # nothing answers: the runner starts its own
        database_url=f"sqlite:///{tmp_path / 'tocsin.db'}",
        data_dir=tmp_path / "var",
        web_port=free_port(),
        metrics_port_feed=free_port(),
        metrics_port_evaluator=free_port(),
        metrics_port_dispatcher=free_port(),
        metrics_port_worker=free_port(),
        smtp_port=free_port(),  # nothing answers: the runner starts its SMTP sink
        feed_rate=200,
        feed_symbols=50,
    )
    runner = subprocess.Popen(
        [sys.executable, "-m", "infra.run"],
        cwd=ROOT,
        env={**os.environ, **settings.to_env()},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{settings.web_port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert runner.poll() is None, runner.stdout.read()
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "web app never became ready"
            time.sleep(0.5)
        children = psutil.Process(runner.pid).children(recursive=True)
        names = " ".join(_cmdline(c) for c in children)
        for part in ("tansu", "redis-server", "uvicorn", "celery", "notifier.dispatcher", "evaluator.spark", "ingest feed",
                     "infra.mailsink"):
            assert part in names, f"{part} is not running"
        deadline = time.monotonic() + 60
        while sum(topic_end_offsets(settings, settings.events_topic).values()) == 0:
            assert time.monotonic() < deadline, "the sample feed published nothing"
            time.sleep(0.5)
        metrics = httpx.get(f"http://127.0.0.1:{settings.metrics_port_feed}/metrics").text
        assert "tocsin_ingest_events_total" in metrics
        deadline = time.monotonic() + 30
        while True:  # the worker serves its metrics once it is ready
            try:
                metrics = httpx.get(f"http://127.0.0.1:{settings.metrics_port_worker}/metrics").text
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "the worker serves no metrics"
                time.sleep(0.5)
        assert "tocsin_delivery_attempts_total" in metrics
    finally:
        runner.send_signal(signal.SIGINT)
        output = runner.communicate(timeout=60)[0]
    assert runner.returncode == 0, output
    assert f"Tocsin is running: {url}/" in output
    match = re.search(r"Operator account: (\S+) / (\S+)", output)
    assert match, "a new database gets an operator account, announced once"
    with session_factory(settings.database_url)() as session:
        operator = AccountService(session, settings).authenticate(match[1], match[2])
        assert operator is not None and operator.role == "operator"
    time.sleep(0.5)
    alive = [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"orphans left behind: {[c.cmdline() for c in alive]}"
