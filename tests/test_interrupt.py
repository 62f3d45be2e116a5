"""One Ctrl-C ends a run of the suite, with its summary: pytest-xdist must not replace the interrupted workers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from devstack.patience import deadline, patient

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # CI: a whole pytest run of its own (~18 s)
def test_one_interrupt_ends_a_two_worker_run_with_its_summary(tmp_path: Path) -> None:
    """As infra/test runs it (two workers, the jvm group on one): a terminal's Ctrl-C reaches the whole process
    group, here while a test waits on a child process in its own session as the server fixtures start them."""
    (tmp_path / "conftest.py").write_text("from tests.conftest import pytest_configure, pytest_collection_modifyitems\n")
    (tmp_path / "test_waits.py").write_text(textwrap.dedent("""
        import subprocess, sys, time
        import pytest

        @pytest.mark.parametrize("i", range(40))
        def test_waits_on_a_server(i):
            server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
            try:
                time.sleep(2)
            finally:
                server.kill()

        @pytest.mark.jvm
        @pytest.mark.parametrize("i", range(40))
        def test_in_the_jvm_group(i):
            time.sleep(2)
    """))
    log = tmp_path / "run.log"
    with log.open("w") as out:
        run = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup", str(tmp_path)],
            cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as in a terminal, not ignored
            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        until = deadline(120)
        while log.read_text().partition(" items]")[2].count(".") < 3:  # tests passed: both workers are in tests
            assert run.poll() is None and time.monotonic() < until, log.read_text()
            time.sleep(0.2)
        os.killpg(run.pid, signal.SIGINT)
        run.wait(timeout=patient(60))
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    text = log.read_text()
    assert run.returncode == 2, text  # pytest's "interrupted"
    assert "KeyboardInterrupt" in text and " passed" in text.splitlines()[-1], text  # the summary line
    assert "replacing crashed worker" not in text, text
