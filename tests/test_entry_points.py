"""Every entry point answers ``--help`` with its usage (exit 0) and refuses an unknown argument with its usage
(exit 2), before it starts anything: ``infra/up --help`` once started the whole platform."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ingest", "subscriptions", "evaluator", "notifier", "web", "core", "devstack", "benchmarks")


def entry_points() -> list[str]:
    """Every ``python -m`` module: each package's ``__main__.py`` and each module with a ``__main__`` block."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__main__":
                found.append(".".join(parts[:-1]))
            elif 'if __name__ == "__main__":' in path.read_text():
                found.append(".".join(parts))
    return found


def test_the_entry_points_are_found() -> None:
    found = entry_points()
    for module in ("ingest", "evaluator.spark", "devstack.run", "devstack.mailsink", "notifier.worker",
                   "notifier.dispatcher", "subscriptions.admin", "benchmarks.pipeline"):
        assert module in found


def _run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run ``args`` in a session of its own with no Java to be found (a JVM start would fail loudly) and no
    platform to talk to; nothing it started may outlive it."""
    env = {**os.environ, "JAVA_HOME": str(tmp_path / "no-java"), "TOCSIN_DATA_DIR": str(tmp_path / "var"),
           "TOCSIN_DATABASE_URL": f"sqlite:///{tmp_path / 'none.db'}"}
    process = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        out, err = process.communicate(timeout=240)
    finally:
        process.kill()
    left = [p for p in psutil.process_iter(["pid", "cmdline"]) if _session(p.pid) == process.pid]
    assert not left, f"{args} left running: {[p.info['cmdline'] for p in left]}"
    return subprocess.CompletedProcess(args, process.returncode, out, err)


def _session(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


@pytest.mark.slow  # CI: ~60 s of interpreters importing everything; the infra scripts' stay
@pytest.mark.parametrize("module", entry_points())
def test_help_and_unknown_arguments(module: str, tmp_path: Path) -> None:
    with ThreadPoolExecutor(2) as both:  # the two interpreters start side by side: imports are most of their time
        helped, refused = both.map(lambda arg: _run([sys.executable, "-m", module, arg], tmp_path / arg.strip("-")),
                                   ["--help", "--bogus"])
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith(f"usage: python -m {module}"), helped.stdout
    assert refused.returncode == 2, refused.stderr
    # the usage, then why: "unrecognized arguments: --bogus" (or, first, the command a parser requires)
    assert refused.stderr.startswith(f"usage: python -m {module}") and "error: " in refused.stderr, refused.stderr
    assert not (tmp_path / "help" / "none.db").exists(), f"{module} --help opened the database"
    assert not (tmp_path / "bogus" / "none.db").exists(), f"{module} --bogus opened the database"


def test_the_dispatchers_help_opens_no_database(tmp_path: Path) -> None:
    # Importing notifier.app built the Celery app's queue names, which carry the deployment id: `--help` created
    # and migrated a database (./var/tocsin.db in whatever directory it was asked in).
    helped = _run([sys.executable, "-m", "notifier.dispatcher", "--help"], tmp_path)
    assert helped.returncode == 0 and helped.stdout.startswith("usage: python -m notifier.dispatcher"), helped.stderr
    assert not (tmp_path / "none.db").exists()


@pytest.mark.parametrize("script", ["infra/up", "infra/bootstrap", "infra/test"])
def test_infra_scripts_answer_help_without_running(script: str, tmp_path: Path) -> None:
    for flag in ("--help", "-h"):
        done = _run([str(ROOT / script), flag], tmp_path)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f"usage: {script}"), done.stdout
        assert done.stderr == ""  # nothing was installed, checked or run


@pytest.mark.parametrize("script", ["infra/up", "infra/bootstrap"])
def test_infra_scripts_without_arguments_refuse_them(script: str, tmp_path: Path) -> None:
    """(infra/test hands unknown arguments to pytest, which refuses them itself.)"""
    done = _run([str(ROOT / script), "--bogus"], tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith(f"usage: {script}") and "unrecognized arguments: --bogus" in done.stderr
    assert done.stdout == ""
