"""The runner says why a child died: the end of its log, in the terminal (a real child process)."""

from __future__ import annotations

import re
import socket
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy import func, select

from core.redis_client import make_redis
from core.redis_schema import RedisKeys
from core.settings import Settings
from devstack.patience import patient
from devstack.run import Runner
from devstack.services import free_port, log_tail, spawn
from subscriptions.accounts import AccountService
from subscriptions.db import session_factory
from subscriptions.models import User


def test_a_dead_child_is_named_with_the_end_of_its_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A CI run saw only "evaluator exited, code 1" and a path in a temporary directory gone with the run."""
    with socket.socket() as web:  # the runner announces the URL once something answers there
        web.bind(("127.0.0.1", 0))
        web.listen()
        # its own database: a ready runner creates the first operator there (with the default, the checkout's
        # var/tocsin.db, a CI run left an operator behind and `infra/up` on that clone showed no account)
        settings = Settings(web_host="127.0.0.1", web_port=web.getsockname()[1], data_dir=tmp_path,
                            database_url=f"sqlite:///{tmp_path / 'tocsin.db'}",
                            redis_url=f"redis://127.0.0.1:{free_port()}/0")
        runner = Runner(settings)
        runner.logs.mkdir(parents=True)
        script = "import sys\nfor i in range(100): print('noise', i)\nprint('the reason it died')\nsys.exit(3)"
        runner.children.append(spawn("evaluator", [sys.executable, "-c", script], runner.logs / "evaluator.log"))
        assert runner.watch() == 1
    out = capsys.readouterr().out
    assert "Operator account" not in out  # never ready: no account was made whose password nobody would see
    assert "evaluator exited with code 3" in out and "the reason it died" in out
    assert "noise 79" not in out and "noise 99" in out  # the end, not the whole log


def test_a_log_tail_reads_only_the_end_and_survives_a_missing_file(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_bytes(b"a\n" * 100_000 + b"\xff broken utf-8\nlast\n")
    assert log_tail(log, lines=2) == ["\ufffd broken utf-8", "last"]
    assert log_tail(tmp_path / "missing.log") == []


def _accounts(settings: Settings) -> int:
    with session_factory(settings.database_url)() as session:
        return session.scalar(select(func.count()).select_from(User)) or 0


def test_the_operator_password_comes_last_once_the_platform_is_up(
        tmp_path: Path, redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """It was printed with the start-up lines and scrolled away: now it follows "Tocsin is running", framed."""
    with socket.socket() as web:
        web.bind(("127.0.0.1", 0))
        web.listen()
        settings = Settings(web_host="127.0.0.1", web_port=web.getsockname()[1], data_dir=tmp_path,
                            database_url=f"sqlite:///{tmp_path / 'tocsin.db'}", redis_url=redis_url,
                            redis_prefix=f"run-{uuid.uuid4().hex[:8]}")
        runner = Runner(settings)
        client = make_redis(settings)
        now = time.time()  # the evaluator's stats once its first batch is evaluated (core.evaluator_status)
        client.hset(RedisKeys(settings).evaluator_stats, mapping={
            "driver_started_at": now - 5, "driver_heartbeat_at": now, "last_batch_at": now,
            "shard_0_evaluated_at": 60_000})
        watching = threading.Thread(target=runner.watch)
        watching.start()
        deadline = time.monotonic() + patient(60)
        while not _accounts(settings):
            assert watching.is_alive() and time.monotonic() < deadline
            time.sleep(0.1)
        runner.stopping = True
        watching.join(timeout=60)
    out = capsys.readouterr().out
    assert out.index("Tocsin is starting") < out.index("Tocsin is running") < out.index("Operator account")
    rule = "  " + "=" * 76
    last = out.rstrip("\n").splitlines()[-4:]
    assert last[0] == rule and last[-1] == rule, out  # the password's frame ends the output
    user, password = re.fullmatch(r"  Operator account: (\S+) / (\S+)", last[1]).groups()  # type: ignore[union-attr]
    with session_factory(settings.database_url)() as session:
        operator = AccountService(session, settings).authenticate(user, password)
        assert operator is not None and operator.role == "operator"
    runner.announce_ready("http://127.0.0.1/")  # a second start on the same database: no new account, no password
    assert "Operator account" not in capsys.readouterr().out
