"""What an evaluator driver restart costs: SIGKILL the driver of a running platform, time it back to its first batch.

    python -m benchmarks.driver_restart            # against the platform `infra/up` runs (same settings/.env)
    python -m benchmarks.driver_restart --start    # starts a platform of its own (free ports, a temporary
                                                   # directory), waits for its first batch, measures, stops it

The local runner (``devstack.run``) restarts the killed driver after its backoff; this
watches the new one through what it leaves behind (its process and its JVM child, the
lines of ``evaluator.log``, ``stats:evaluator`` in Redis) every 50 ms and prints, from
the kill: the runner's backoff, the Python start (imports, up to the driver recording
its start), the JVM's start, the SparkSession, the query's start (checkpoint and offset
logs read), and the first resumed micro-batch, with the shards' state restore inside it
(``restore_ms_total``, summed over shards). The load average is printed beside it:
figures from a busy machine are upper bounds (docs/operations.md).
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import redis

from benchmarks.report import add_markdown_option, markdown_run, table
from core import cli, restarts
from core.redis_client import make_redis
from core.redis_replies import text_hash
from core.redis_schema import RedisKeys
from core.settings import Settings, get_settings
from devstack.services import free_port

POLL_S = 0.05
DRIVER = "evaluator.spark"


def _cmdline(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return ""


def _children(process: psutil.Process) -> list[psutil.Process]:
    try:
        return process.children(recursive=True)
    except psutil.NoSuchProcess:  # it died meanwhile: the runner starts another
        return []


def drivers(root: psutil.Process | None) -> list[psutil.Process]:
    """The evaluator drivers (``python -m evaluator.spark``) under ``root`` (a runner), or on this machine."""
    candidates = _children(root) if root is not None else list(psutil.process_iter())
    return [p for p in candidates if _runs_driver(p)]


def _runs_driver(process: psutil.Process) -> bool:
    """``python -m evaluator.spark`` itself, not its shard hosts (``-m evaluator.spark.shard_host``)."""
    args = _cmdline(process).split()
    return any(flag == "-m" and module == DRIVER for flag, module in itertools.pairwise(args))


def _stats(client: redis.Redis, keys: RedisKeys) -> dict[str, str]:
    return text_hash(client.hgetall(keys.evaluator_stats))


def _float(stats: dict[str, str], name: str) -> float:
    try:
        return float(stats.get(name) or 0.0)
    except ValueError:
        return 0.0


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"


def wait_ready(client: redis.Redis, keys: RedisKeys, timeout_s: float) -> None:
    """Until the evaluator has evaluated a batch since its driver started."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stats = _stats(client, keys)
        if _float(stats, "last_batch_at") > _float(stats, "driver_started_at") > 0:
            return
        time.sleep(1.0)
    evaluator = {entry.process: entry for entry in restarts.recorded(client, keys)}.get("evaluator")
    why = (f"the runner restarted the evaluator {evaluator.restarts} times (last exit code {evaluator.last_code}): "
           "read its log" if evaluator else "is the platform running?")
    raise SystemExit(f"the evaluator evaluated no batch within {timeout_s:g} s; {why}")


def measure(settings: Settings, timeout_s: float, root: psutil.Process | None) -> list[list[object]]:
    """Kill the one running driver (under the runner ``root``, if given) and time its successor's phases; the
    rows of the breakdown."""
    client, keys = make_redis(settings, decode_responses=True, socket_timeout=5), RedisKeys(settings)
    wait_ready(client, keys, timeout_s)
    found = drivers(root)
    if len(found) != 1:
        raise SystemExit(f"expected one evaluator driver, found {len(found)}: name its runner with --runner PID")
    old = found[0]
    log = settings.data_dir / "logs" / "evaluator.log"
    offset = log.stat().st_size if log.exists() else 0
    restored_before = _float(_stats(client, keys), "restore_ms_total")
    seen: dict[str, float] = {}
    killed = time.time()
    old.send_signal(signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    text = ""
    while "first batch" not in seen:
        if time.monotonic() > deadline:
            raise SystemExit(f"no resumed batch within {timeout_s:g} s of the kill (seen: {sorted(seen)}); "
                             "a platform not run by devstack.run is not restarted by it")
        now = time.time()
        new = [p for p in drivers(root) if p.pid != old.pid]
        if new and "process started" not in seen:
            seen["process started"] = now
        if new and "JVM started" not in seen and any("java" in _cmdline(c) for c in _children(new[0])):
            seen["JVM started"] = now
        if log.exists():
            with log.open("rb") as lines:
                lines.seek(offset)
                text = lines.read().decode(errors="replace")
        for phase, line in (("SparkSession ready", "spark_session_ready"), ("query started", "evaluator_started")):
            if phase not in seen and line in text:
                seen[phase] = now
        stats = _stats(client, keys)
        if "driver recorded its start" not in seen and _float(stats, "driver_started_at") > killed:
            seen["driver recorded its start"] = _float(stats, "driver_started_at")
        if _float(stats, "last_batch_at") > max(killed, _float(stats, "driver_started_at")) > killed:
            seen["first batch"] = _float(stats, "last_batch_at")
        time.sleep(POLL_S)
    restored_s = (_float(_stats(client, keys), "restore_ms_total") - restored_before) / 1000
    order = ["process started", "driver recorded its start", "JVM started", "SparkSession ready", "query started",
             "first batch"]
    what = {"process started": "the runner's backoff, then spawning", "driver recorded its start": "Python start and "
            "imports", "JVM started": "launching the JVM (py4j gateway)", "SparkSession ready": "the JVM's start, "
            "SparkContext and session", "query started": "checkpoint, offset log, query plan", "first batch":
            f"the first resumed micro-batch (shard state restore in it: {restored_s:.1f} s, summed over shards)"}
    rows: list[list[object]] = []
    previous = killed
    for phase in order:
        if phase not in seen:
            rows.append([phase, "-", "-", what[phase]])
            continue
        rows.append([phase, round(seen[phase] - killed, 1), round(seen[phase] - previous, 1), what[phase]])
        previous = seen[phase]
    return rows


def started_platform(directory: Path) -> tuple[subprocess.Popen, Settings]:
    """A platform of its own, on free ports in ``directory`` (``--start``)."""
    settings = Settings(kafka_bootstrap=f"127.0.0.1:{free_port()}", redis_url=f"redis://127.0.0.1:{free_port()}/0",
                        database_url=f"sqlite:///{directory / 'tocsin.db'}", data_dir=directory / "var",
                        web_port=free_port(), smtp_port=free_port(), metrics_port_feed=free_port(),
                        metrics_port_evaluator=free_port(), metrics_port_dispatcher=free_port(),
                        metrics_port_worker=free_port())
    runner = subprocess.Popen([sys.executable, "-m", "devstack.run"], env={**os.environ, **settings.to_env()},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while True:  # the runner started Redis (and wrote the deployment id) before it starts the evaluator
        try:
            if redis.Redis.from_url(settings.redis_url, socket_timeout=2).ping():
                return runner, settings
        except redis.RedisError:
            pass
        if runner.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the platform did not start")
        time.sleep(1.0)


def main() -> None:
    parser = cli.parser(__doc__, "python -m benchmarks.driver_restart")
    parser.add_argument("--start", action="store_true", help="start a platform of its own and stop it afterwards")
    parser.add_argument("--runner", type=int, help="the pid of the runner (devstack.run) whose driver to restart")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for each of readiness and resume")
    add_markdown_option(parser)
    args = parser.parse_args()
    print(f"before: {load()}", flush=True)
    if not args.start:
        rows = measure(get_settings(), args.timeout, psutil.Process(args.runner) if args.runner else None)
    else:
        with tempfile.TemporaryDirectory(prefix="tocsin-restart-") as directory:
            runner, settings = started_platform(Path(directory))
            try:
                rows = measure(settings, args.timeout, psutil.Process(runner.pid))
            finally:
                runner.send_signal(signal.SIGTERM)
                runner.wait(timeout=180)
    print_breakdown(rows)


def print_breakdown(rows: list[list[object]]) -> None:
    table(f"Evaluator driver restart, from SIGKILL to the first resumed batch ({load()})",
          ["phase", "at (s)", "took (s)", "what"], rows)


if __name__ == "__main__":
    with markdown_run():
        main()
