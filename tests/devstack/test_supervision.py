"""The runner restarts a platform process that exits (real child processes, real Redis), with backoff, a log line
and a count in Redis, reports one that keeps crashing, and still stops everything on request."""

from __future__ import annotations

import socket
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import redis

from core import restarts
from core.redis_schema import RedisKeys
from core.settings import Settings
from devstack.run import Runner
from devstack.services import spawn
from devstack.supervision import Backoff
from tests.notifier.test_delivery import _eventually


def test_backoff_doubles_up_to_its_cap_and_starts_again_after_a_healthy_run() -> None:
    backoff = Backoff(first_s=1.0, cap_s=5.0, reset_after_s=60.0, crash_loop_after=3, started_at=0.0)
    waits = []
    for now in (1.0, 3.0, 8.0, 15.0, 22.0):  # each run shorter than 60 s: crashes in a row
        waits.append(backoff.exited(now))
        backoff.restarted(now + waits[-1])
    assert waits == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert backoff.crash_looping and backoff.in_a_row == 5
    assert backoff.exited(22.0 + 5.0 + 60.0) == 1.0, "up 60 s: healthy again, the first backoff"
    assert backoff.in_a_row == 1 and not backoff.crash_looping
    assert Backoff(1.0, 60.0, 60.0, 5).exited(1e9 + 0) == 1.0
    many = Backoff(1.0, 60.0, 1e12, 5)
    assert [many.exited(1.0) for _ in range(2000)][-1] == 60.0, "no overflow however long it crashes"


def test_a_killed_process_comes_back_counted_and_a_crash_loop_is_reported(
        settings: Settings, redis_client: redis.Redis, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    keys = RedisKeys(settings)
    with socket.socket() as web:  # the runner announces the URL once something answers there
        web.bind(("127.0.0.1", 0))
        web.listen()
        settings = settings.model_copy(update={
            "web_host": "127.0.0.1", "web_port": web.getsockname()[1], "data_dir": tmp_path,
            "runner_restart_backoff_s": 0.2, "runner_restart_backoff_max_s": 0.8, "runner_crash_loop_restarts": 3})
        runner = Runner(settings)
        runner.logs.mkdir(parents=True)
        sleeper = [sys.executable, "-c", "import time\nprint('dispatching', flush=True)\ntime.sleep(3600)"]
        crasher = [sys.executable, "-c", "import sys\nprint('cannot start: no such setting', flush=True)\nsys.exit(2)"]
        runner.supervise("dispatcher", lambda: spawn("dispatcher", sleeper, runner.logs / "dispatcher.log"))
        first_pid = runner.children[0].process.pid
        watching = threading.Thread(target=runner.watch, daemon=True)
        watching.start()
        try:
            psutil.Process(first_pid).kill()  # SIGKILL, as the OOM killer would

            def counted() -> restarts.Restarts | None:
                """the killed dispatcher restarted and counted"""
                found = {r.process: r for r in restarts.recorded(redis_client, keys)}.get("dispatcher")
                return found if found is not None and found.restarts == 1 else None

            _eventually(counted)
            entry = counted()
            assert entry is not None and entry.last_code == -9 and not entry.crash_looping
            dispatcher = next(c for c in runner.children if c.name == "dispatcher")
            assert dispatcher.process.pid != first_pid and dispatcher.process.poll() is None
            assert not psutil.pid_exists(first_pid) or psutil.Process(first_pid).status() == psutil.STATUS_ZOMBIE

            runner.supervise("mail", lambda: spawn("mail", crasher, runner.logs / "mail.log"))

            def looping() -> bool:
                """the crashing process reported as crash-looping"""
                found = {r.process: r for r in restarts.recorded(redis_client, keys)}.get("mail")
                return found is not None and found.crash_looping and found.restarts >= 3

            _eventually(looping)
            assert dispatcher.process.poll() is None, "the crash loop beside it stops nothing else"
        finally:
            runner.stopping = True
            watching.join(timeout=30)
            children = [c.process.pid for c in runner.children]
            runner.stop()
    out = capsys.readouterr().out
    assert "dispatcher exited with code -9; restarting it in 0.2 s" in out
    assert "dispatcher restarted (restart 1)" in out
    assert "mail KEEPS CRASHING: 3 exits in a row" in out and "cannot start: no such setting" in out
    assert not watching.is_alive()
    alive = [pid for pid in children if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert not alive, "stopping the runner stops the restarted processes too"


def test_ops_shows_the_restarts_and_names_a_crash_loop(settings: Settings, redis_client: redis.Redis) -> None:
    from tests.users import api_client, new_user, sign_in

    keys = RedisKeys(settings)
    restarts.record(redis_client, keys, restarts.Restarts("dispatcher", 2, time.time(), -9, 1, False, 0.0))
    restarts.record(redis_client, keys, restarts.Restarts("evaluator", 7, time.time(), 1, 7, True, 60.0))
    operator, _ = new_user(settings, role="operator")
    with api_client(settings) as api:
        sign_in(api, operator.email)
        fragment = api.get("/ops/watchdog").text
        page = api.get("/ops").text
    for html in (fragment, page):
        assert "Process restarts" in html
        assert "<td>dispatcher</td><td>2</td>" in html and "<td>-9</td>" in html
        assert "<td>evaluator</td><td>7</td>" in html and "keeps crashing" in html
