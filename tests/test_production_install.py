"""The production install starts: a clean venv from ``infra/install-production`` (what the image runs), no test tools,
then each entry point started from it against the test Redis and broker.

The venv is built once per pyproject.toml and install script (a hash) into a cache outside the checkout
(``$TOCSIN_INSTALL_CACHE``, default ``~/.cache/tocsin/production-venv``): the first build downloads and installs
every dependency (minutes), later runs reuse it. Its processes run outside the checkout with no PYTHONPATH, so they
import the installed wheel and its declared dependencies only: a package production code imports without declaring
it fails here. Slow (the first build): CI runs it; ``-m slow`` here.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from core.redis_schema import RedisKeys
from core.settings import Settings
from devstack.patience import patient
from devstack.services import ManagedProcess, free_port, log_tail, spawn, wait_for_port
from ingest.kafka import ensure_topics

ROOT = Path(__file__).resolve().parents[1]
INSTALL = ROOT / "infra" / "install-production"
CACHE = Path(os.environ.get("TOCSIN_INSTALL_CACHE") or Path.home() / ".cache" / "tocsin" / "production-venv")
BUILD_TIMEOUT_S = 1_800  # every dependency from the index on a cold cache: pyspark alone is ~300 MB
STALE_AFTER_S = 7 * 86_400  # venvs of other pyproject.toml versions (other branches may still use them)
#: The packages the test venv must resolve as a production install does (quixstreams once held them back).
SAME_VERSIONS = ("pydantic", "pydantic-core", "pydantic-settings")

#: The first test waits for the venv's build (pytest-timeout counts fixture set-up time).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(BUILD_TIMEOUT_S + 600)]


def install_key() -> str:
    digest = hashlib.sha256()
    for path in (ROOT / "pyproject.toml", INSTALL):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def build_venv(venv: Path) -> None:
    """A new venv with the production install in it, exactly as the image gets it."""
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    before = sorted(p.name for p in ROOT.iterdir())
    install = subprocess.Popen([str(INSTALL), str(venv / "bin" / "python")], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True)
    try:
        stdout, stderr = install.communicate(timeout=BUILD_TIMEOUT_S)
    finally:  # a timeout (or an interrupted run) stops pip too, not only the script
        with contextlib.suppress(ProcessLookupError):
            os.killpg(install.pid, signal.SIGKILL)
    assert install.returncode == 0, f"infra/install-production failed:\n{stdout[-3_000:]}\n{stderr[-5_000:]}"
    # it builds from a copy: no build/ or tocsin.egg-info/ left for a later lint run to read
    assert sorted(p.name for p in ROOT.iterdir()) == before


@pytest.fixture(scope="session")
def production_venv() -> Path:
    """The cached clean venv for this pyproject.toml (built under a lock: pytest-xdist workers share it)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    key = install_key()
    venv = CACHE / key
    with open(CACHE / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = venv / ".tocsin-installed"
        if not stamp.exists():
            build_venv(venv)
            stamp.write_text(key)
    for other in CACHE.iterdir():
        if other.is_dir() and other != venv and time.time() - other.stat().st_mtime > STALE_AFTER_S:
            shutil.rmtree(other, ignore_errors=True)
    return venv


@pytest.fixture
def run_installed(production_venv: Path, settings: Settings, tmp_path: Path) -> Iterator:
    """``start(name, module, *args)``: a process of the installed Tocsin, outside the checkout, configured by
    ``settings``; each is stopped after the test."""
    python = str(production_venv / "bin" / "python")
    cwd = tmp_path / "cwd"  # python -m puts the working directory first on sys.path: never the checkout
    cwd.mkdir()
    started: list[ManagedProcess] = []

    def start(name: str, module: str, *args: str, graceful: bool = False, env: dict[str, str] | None = None,
              stop_timeout_s: float = 60) -> ManagedProcess:
        environment = {**settings.to_env(), "PYTHONPATH": "", "TOCSIN_LOG_LEVEL": "INFO", **(env or {})}
        process = spawn(name, [python, "-m", module, *args], tmp_path / f"{name}.log", env=environment, cwd=cwd,
                        graceful=graceful, stop_timeout_s=stop_timeout_s)
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()


def wait_for(predicate, what: str, process: ManagedProcess, log: Path, timeout_s: float = 180) -> None:
    """Poll ``predicate`` until it holds; fail at once, with the log's tail, if ``process`` exits first."""
    deadline = time.monotonic() + patient(timeout_s)
    while not predicate():
        assert process.process.poll() is None, (f"{process.name} exited with {process.process.returncode} before "
                                                f"{what}:\n" + "\n".join(log_tail(log, 40)))
        assert time.monotonic() < deadline, f"{process.name}: no {what} in {timeout_s} s:\n" + "\n".join(
            log_tail(log, 40))
        time.sleep(0.3)


def stops_cleanly(process: ManagedProcess, log: Path, last_line: str | None = None) -> None:
    """SIGTERM stops it with status 0; or, for uvicorn, which re-raises the signal once it has shut down, by that
    signal after its own last line (``last_line``)."""
    process.stop()
    code = process.process.returncode
    clean = code == 0 or (last_line is not None and code == -signal.SIGTERM and logged(log, last_line))
    assert clean, f"{process.name} stopped with {code}:\n" + "\n".join(log_tail(log, 40))


def logged(log: Path, text: str) -> bool:
    return log.exists() and text in log.read_text(errors="replace")


def installed_python(production_venv: Path, code: str, tmp_path: Path) -> str:
    done = subprocess.run([str(production_venv / "bin" / "python"), "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": ""}, timeout=300)
    assert done.returncode == 0, done.stderr[-5_000:]
    return done.stdout


def test_the_test_venv_resolves_what_production_does(production_venv: Path, tmp_path: Path) -> None:
    """The suite runs the versions production gets: no test-only peer (quixstreams) holds pydantic back.

    infra/bootstrap upgrades an existing .venv eagerly when pyproject.toml changes; a fresh one resolves the same."""
    from importlib.metadata import version

    code = f"from importlib.metadata import version; print(*(version(n) for n in {SAME_VERSIONS!r}))"
    production = dict(zip(SAME_VERSIONS, installed_python(production_venv, code, tmp_path).split(), strict=True))
    tests = {name: version(name) for name in SAME_VERSIONS}
    assert tests == production, "the test venv differs from a production install: run infra/bootstrap"


def test_every_module_imports_from_the_production_install(production_venv: Path, settings: Settings,
                                                          tmp_path: Path) -> None:
    """Each module of every shipped package imports with the declared dependencies only (not from the checkout)."""
    code = """
import importlib, pkgutil, sys, tomllib
packages = sys.argv[1:]
for package in packages:
    module = importlib.import_module(package)
    assert sys.prefix in module.__file__, (module.__file__, sys.prefix)  # the installed wheel, not the checkout
    for info in pkgutil.walk_packages(module.__path__, package + "."):
        if not info.name.endswith("__main__") and ".migrations." not in info.name:
            importlib.import_module(info.name)
print("imported", len(sys.modules))
"""
    from tests.test_dependencies import PRODUCTION

    done = subprocess.run([str(production_venv / "bin" / "python"), "-c", code, *PRODUCTION], capture_output=True,
                          text=True, cwd=tmp_path, env={**os.environ, **settings.to_env(), "PYTHONPATH": ""},
                          timeout=600)
    assert done.returncode == 0, done.stderr[-5_000:]
    assert done.stdout.startswith("imported")
    pip = subprocess.run([str(production_venv / "bin" / "python"), "-m", "pip", "list", "--format=freeze"],
                         capture_output=True, text=True, timeout=120)
    installed = {line.split("==")[0].lower() for line in pip.stdout.split()}
    assert {"pytest", "ruff", "mypy", "quixstreams"}.isdisjoint(installed)  # no test tools, no benchmark peers
    assert "psycopg" in installed  # the postgres extra the image runs with


def test_web_worker_and_dispatcher_start_and_stop_from_the_production_install(
        run_installed, settings: Settings, tmp_path: Path) -> None:
    topics = run_installed("topics", "ingest", "topics")
    assert topics.process.wait(timeout=180) == 0, "\n".join(log_tail(tmp_path / "topics.log", 40))

    port = free_port()
    web = run_installed("web", "uvicorn", "web.main:app", "--host", "127.0.0.1", "--port", str(port))
    wait_for_port("127.0.0.1", port, timeout_s=180, process=web.process)
    health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=30)
    assert health.status_code == 200, health.text
    # the migrations ran: the schema is at the head revision the package ships
    from alembic.script import ScriptDirectory
    from sqlalchemy import text

    from subscriptions.db import alembic_config, engine_for

    with engine_for(settings.database_url).connect() as connection:
        revision = connection.execute(text("SELECT version_num FROM alembic_version")).scalar_one()
    assert revision == ScriptDirectory.from_config(alembic_config()).get_current_head()

    worker = run_installed("worker", "notifier.worker", "--lane", "alerts", "--pool", "threads", "--concurrency", "2",
                           "--loglevel", "INFO", "--without-gossip", "--without-mingle", "--without-heartbeat")
    dispatcher = run_installed("dispatcher", "notifier.dispatcher")
    wait_for(lambda: logged(tmp_path / "worker.log", " ready."), "ready line", worker, tmp_path / "worker.log")
    wait_for(lambda: logged(tmp_path / "dispatcher.log", "dispatcher_started"), "dispatcher_started", dispatcher,
             tmp_path / "dispatcher.log")
    stops_cleanly(worker, tmp_path / "worker.log")
    stops_cleanly(dispatcher, tmp_path / "dispatcher.log")
    stops_cleanly(web, tmp_path / "web.log", last_line="Finished server process")


@pytest.mark.jvm
def test_the_evaluator_runs_a_batch_from_the_production_install(run_installed, settings: Settings,
                                                                tmp_path: Path) -> None:
    from tests.evaluator.streams import generated_stream, publish

    ensure_topics(settings)
    publish(settings, generated_stream(seed=7, n=200))
    stats = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    key = RedisKeys(settings).evaluator_stats
    log = tmp_path / "evaluator.log"
    evaluator = run_installed("evaluator", "evaluator.spark", graceful=True,
                              stop_timeout_s=settings.evaluator_stop_timeout_s)
    wait_for(lambda: int(stats.hget(key, "last_batch_id") or -1) >= 0, "micro-batch", evaluator, log, timeout_s=300)
    stops_cleanly(evaluator, log)
    assert logged(log, "evaluator_stopped")


def test_the_install_leaves_no_copies_a_lint_run_reads(tmp_path: Path) -> None:
    """A user's own ``pip install .`` leaves build/lib/… and tocsin.egg-info/ in the checkout: ruff ignores them
    (and the lint error a copy may carry), while the same error in the sources fails it."""
    copy = tmp_path / "checkout"
    copy.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, copy / name)
    from tests.test_dependencies import PRODUCTION

    for package in PRODUCTION:
        shutil.copytree(ROOT / package, copy / package, ignore=shutil.ignore_patterns("__pycache__"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-deps", "."],
                          cwd=copy, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-5_000:]
    assert (copy / "build" / "lib" / "core").is_dir() and list(copy.glob("*.egg-info"))  # what it leaves behind
    (copy / "build" / "lib" / "core" / "leftover.py").write_text("import os\n")  # F401 in a copy
    (copy / "build" / "lib" / "test_leftover.py").write_text("def test_leftover():\n    pass\n")
    ruff = [str(Path(sys.executable).parent / "ruff"), "check", "--quiet", "--no-cache", "."]
    lint = subprocess.run(ruff, cwd=copy, capture_output=True, text=True, timeout=300)
    assert lint.returncode == 0, lint.stdout[-5_000:]
    (copy / "core" / "leftover.py").write_text("import os\n")  # the same error in the sources is found
    lint = subprocess.run(ruff, cwd=copy, capture_output=True, text=True, timeout=300)
    assert lint.returncode == 1 and "core/leftover.py" in lint.stdout and "build/" not in lint.stdout, lint.stdout
    collect = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                              "--rootdir", str(copy), "-c", str(copy / "pyproject.toml"), str(copy)],
                             cwd=copy, capture_output=True, text=True, timeout=300,
                             env={**os.environ, "PYTHONPATH": str(copy)})
    assert collect.returncode == 5 and "test_leftover" not in collect.stdout, collect.stdout[-3_000:]  # none
