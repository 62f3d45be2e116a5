"""The runner says why a child died: the end of its log, in the terminal (a real child process)."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from core.settings import Settings
from devstack.run import Runner
from devstack.services import free_port, log_tail, spawn


def test_a_dead_child_is_named_with_the_end_of_its_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A CI run saw only "evaluator exited, code 1" and a path in a temporary directory gone with the run."""
    with socket.socket() as web:  # the runner announces the URL once something answers there
        web.bind(("127.0.0.1", 0))
        web.listen()
        # its own database: the runner creates the first operator there (with the default, the checkout's
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
    assert (tmp_path / "tocsin.db").exists()
    assert "evaluator exited with code 3" in out and "the reason it died" in out
    assert "noise 79" not in out and "noise 99" in out  # the end, not the whole log


def test_a_log_tail_reads_only_the_end_and_survives_a_missing_file(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_bytes(b"a\n" * 100_000 + b"\xff broken utf-8\nlast\n")
    assert log_tail(log, lines=2) == ["\ufffd broken utf-8", "last"]
    assert log_tail(tmp_path / "missing.log") == []
