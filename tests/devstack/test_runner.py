"""The local runner starts the whole platform, says when the evaluator is ready, and Ctrl-C stops all of it:
no process is left, and the evaluator stops its query between batches (no traceback, one "stopped" line)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from core.settings import Settings
from devstack.patience import patient
from devstack.services import free_port
from ingest.kafka import topic_end_offsets
from subscriptions.accounts import AccountService
from subscriptions.db import session_factory

pytestmark = [pytest.mark.e2e, pytest.mark.spark, pytest.mark.slow]  # lifecycle: run in CI

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
        [sys.executable, "-m", "devstack.run"],
        cwd=ROOT,
        # the platform's default log levels, not the quieter ones the test session sets for its SparkSession
        env={**{k: v for k, v in os.environ.items() if k != "TOCSIN_LOG_LEVEL"}, **settings.to_env()},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(runner.stdout), daemon=True)
    reader.start()
    url = f"http://127.0.0.1:{settings.web_port}"
    try:
        deadline = time.monotonic() + patient(90)
        while not any("Tocsin is starting" in line for line in lines):
            assert runner.poll() is None, "".join(lines)
            assert time.monotonic() < deadline, "the runner never started the platform"
            time.sleep(0.5)
        assert not any("Tocsin is running" in line for line in lines), "ready before the evaluator evaluated"
        children = psutil.Process(runner.pid).children(recursive=True)
        names = " ".join(_cmdline(c) for c in children)
        for part in ("tansu", "redis-server", "uvicorn", "notifier.worker --lane alerts", "notifier.worker --lane tests",
                     "notifier.dispatcher", "evaluator.spark", "ingest feed", "devstack.mailsink"):
            assert part in names, f"{part} is not running"
        deadline = time.monotonic() + patient(60)
        while sum(topic_end_offsets(settings, settings.events_topic).values()) == 0:
            assert time.monotonic() < deadline, "the sample feed published nothing"
            time.sleep(0.5)
        metrics = httpx.get(f"http://127.0.0.1:{settings.metrics_port_feed}/metrics").text
        assert "tocsin_ingest_events_total" in metrics
        deadline = time.monotonic() + patient(30)
        while True:  # the worker serves its metrics once it is ready
            try:
                metrics = httpx.get(f"http://127.0.0.1:{settings.metrics_port_worker}/metrics").text
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "the worker serves no metrics"
                time.sleep(0.5)
        assert "tocsin_delivery_attempts_total" in metrics
        deadline = time.monotonic() + patient(600)  # generous: the first batch takes a minute, more on a busy machine
        while not any("Tocsin is running" in line for line in lines):
            assert runner.poll() is None, "".join(lines)
            assert time.monotonic() < deadline, "the evaluator never became ready"
            time.sleep(0.5)
        ready = httpx.get(f"{url}/readyz", timeout=10)
        assert ready.status_code == 200 and ready.json()["checks"]["evaluator"] == "ok", ready.text
        children = psutil.Process(runner.pid).children(recursive=True)  # Spark's JVM and Python workers too
    finally:
        runner.send_signal(signal.SIGINT)
        runner.wait(timeout=180)
        reader.join(timeout=10)
    output = "".join(lines)
    assert runner.returncode == 0, output
    assert f"Tocsin is running: {url}/" in output
    match = re.search(r"Operator account: (\S+) / (\S+)", output)
    assert match, "a new database gets an operator account, announced once"
    with session_factory(settings.database_url)() as session:
        operator = AccountService(session, settings).authenticate(match[1], match[2])
        assert operator is not None and operator.role == "operator"
    alive = [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"orphans left behind: {[_cmdline(c) for c in alive]}"
    evaluator_log = (settings.data_dir / "logs" / "evaluator.log").read_text()
    for trace in ("Traceback", "Exception in thread", "\tat "):  # Python's and Java's
        assert trace not in evaluator_log, evaluator_log[-5000:]
    assert evaluator_log.count("evaluator_stopped") == 1
    assert "evaluator_stopped" in evaluator_log.strip().splitlines()[-1], evaluator_log[-2000:]
