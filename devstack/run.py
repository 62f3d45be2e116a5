"""The local runner: the whole platform on embedded defaults, stopped cleanly with Ctrl-C.

Starts, in order: the Tansu broker (unless something already listens at the
configured bootstrap address) with its topics, Redis (unless one answers), the
web app, the Celery workers (alerts, test alerts, backtests), the dispatcher, the Spark evaluator and the two
demo publishers: the synthetic market feed (stream ``trades``) and host metrics
(stream ``hosts``, declared here at start-up). Every child runs in its own process group and is stopped
with it.

A platform process that exits (the web app, a worker, the dispatcher, the evaluator, a
publisher) or the SMTP sink is restarted with backoff (``devstack.supervision``): the
exit is logged (``process_exited``, with the end of its log printed), the restart
too (``process_restarted``), and each is counted in Redis (``core.restarts``) for
``/ops``. The broker and Redis the runner started hold their data in memory only: a
restarted one would be an empty broker or Redis under a running platform, so their
exit stops everything, naming the log to read with its last lines.

"Tocsin is running" is printed once the evaluator has evaluated its first batch
(about a minute after the start), not when the processes merely exist; on a new database the
operator account's one-time password follows it, last, framed on stdout. On
Ctrl-C or SIGTERM the evaluator driver alone gets SIGTERM, stops its streaming
query and SparkContext, and its JVM exits by itself; only after
``evaluator_stop_timeout_s`` is its process group killed.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable

import redis
import structlog

from core import cli, restarts
from core.evaluator_status import evaluator_status
from core.logs import configure_logging, third_party_level
from core.redis_client import make_redis
from core.redis_replies import text_hash
from core.redis_schema import RedisKeys
from core.settings import Settings, get_settings
from devstack.services import ManagedProcess, ensure_redis, log_tail, python_module, spawn, start_tansu
from devstack.supervision import Backoff
from ingest.hosts import HOSTS, hosts_schema
from ingest.kafka import ensure_topics
from subscriptions.admin import LOCAL_OPERATOR, first_operator
from subscriptions.db import session_factory
from subscriptions.errors import Conflict
from subscriptions.streams import StreamService

log = structlog.get_logger("runner")


def _listening(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=0.5).close()
        return True
    except OSError:
        return False


def platform_commands(settings: Settings) -> list[tuple[str, list[str]]]:
    """The platform's own processes; docker-compose.yml runs the same modules."""
    return [
        # --no-proxy-headers: uvicorn would otherwise take X-Forwarded-For from any local peer as the client address.
        ("web", python_module("uvicorn", "web.main:app", "--host", settings.web_host, "--port", str(settings.web_port),
                              "--no-proxy-headers")),
        ("worker", python_module("notifier.worker", "--lane", "alerts", "--pool", "threads", "--concurrency", "8",
                                 "--loglevel", third_party_level(), "--without-gossip", "--without-mingle")),
        ("worker-tests", python_module("notifier.worker", "--lane", "tests", "--pool", "threads", "--concurrency", "2",
                                       "--loglevel", third_party_level(), "--without-gossip", "--without-mingle")),
        ("worker-backtests", python_module("notifier.worker", "--lane", "backtests", "--pool", "prefork",
                                           "--concurrency", "1", "--loglevel", third_party_level(), "--without-gossip",
                                           "--without-mingle")),
        ("dispatcher", python_module("notifier.dispatcher")),
        ("evaluator", python_module("evaluator.spark")),
        ("feed", python_module("ingest", "feed")),
        ("hosts", python_module("ingest", "hosts")),
    ]


def declare_demo_streams(settings: Settings) -> None:
    """The two demo streams: ``trades`` (built in) and ``hosts`` (host metrics), with their topics, unless declared.

    A ``hosts`` stream an operator changed (or declared differently) is kept as it is.
    """
    with session_factory(settings.database_url)() as session:
        service = StreamService(session, settings)
        service.ensure_builtin()
        if HOSTS not in {stream.name for stream in service.streams()}:
            with contextlib.suppress(Conflict):  # another process declared it meanwhile
                service.create(hosts_schema(settings))
            log.info("stream_declared", stream=HOSTS)


def operator_notice(password: str, url: str) -> str:
    """The operator account's one-time password, framed so it stands out of the runner's output."""
    rule = "  " + "=" * 76
    return (f"{rule}\n  Operator account: {LOCAL_OPERATOR} / {password}\n"
            f"  The password is shown only this once: sign in at {url}login and keep it (anyone may sign up as a user).\n"
            f"{rule}\n")


#: Children that stop themselves on SIGTERM (the runner waits for them rather than killing their group).
GRACEFUL = {"evaluator"}


class Runner:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.logs = settings.data_dir / "logs"
        self.children: list[ManagedProcess] = []
        self.stopping = False
        self.recipes: dict[str, Callable[[], ManagedProcess]] = {}  # how to start again what may be restarted
        self.backoffs: dict[str, Backoff] = {}
        self.counts: dict[str, int] = {}  # restarts per process since the runner started
        self.due: dict[str, float] = {}  # processes waiting for their restart, and when (monotonic)
        self.last_exit: dict[str, tuple[float, int]] = {}  # when (Unix time) and with which code each last exited

    def supervise(self, name: str, start: Callable[[], ManagedProcess]) -> None:
        """Start a process the runner restarts when it exits."""
        self.recipes[name] = start
        self.backoffs[name] = Backoff.of(self.settings, time.monotonic())
        self.children.append(start())

    def _reset_checkpoint(self) -> None:
        """Tansu keeps topics in memory: a checkpoint from an earlier broker points past the new logs. The runner
        has no JVM to reach a checkpoint through Hadoop, so the devstack keeps it on this host's disk."""
        local = self.settings.local_checkpoint_dir
        if local is None:
            raise SystemExit(f"TOCSIN_CHECKPOINT_DIR={self.settings.checkpoint_location}: the devstack's in-memory "
                             "broker starts empty, so it resets the checkpoint, which it can only do on this host's "
                             "disk (a path or a file: URI)")
        if local.exists():
            shutil.rmtree(local)
            log.info("checkpoint_reset", reason="fresh in-memory broker", path=str(local))

    def start(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        if _listening(self.settings.kafka_bootstrap):
            log.info("broker_found", bootstrap=self.settings.kafka_bootstrap)
        else:
            host, port = self.settings.kafka_bootstrap.rsplit(":", 1)
            self.children.append(start_tansu(host, int(port), self.logs / "broker.log"))
            self._reset_checkpoint()
            log.info("broker_started", bootstrap=self.settings.kafka_bootstrap, log=str(self.logs / "broker.log"))
        ensure_topics(self.settings)
        declare_demo_streams(self.settings)
        redis_server = ensure_redis(self.settings.redis_url, self.settings.data_dir / "redis", self.logs / "redis.log")
        if redis_server:
            self.children.append(redis_server)
            log.info("redis_started", url=self.settings.redis_url)
        else:
            log.info("redis_found", url=self.settings.redis_url)
        smtp = f"{self.settings.smtp_host}:{self.settings.smtp_port}"
        if _listening(smtp):
            log.info("smtp_found", address=smtp)
        else:  # somewhere for e-mail alerts to go: the sink prints each one to its log
            args = python_module("devstack.mailsink", "--host", self.settings.smtp_host, "--port", str(self.settings.smtp_port))
            self.supervise("mail", functools.partial(spawn, "mail", args, self.logs / "mail.log"))
            log.info("smtp_started", address=smtp, log=str(self.logs / "mail.log"))
        with contextlib.suppress(redis.RedisError):  # the counts on /ops are this run's
            restarts.forget(make_redis(self.settings, socket_timeout=2), RedisKeys(self.settings))
        for name, args in platform_commands(self.settings):
            graceful = name in GRACEFUL
            self.supervise(name, functools.partial(
                spawn, name, args, self.logs / f"{name}.log", graceful=graceful,
                stop_timeout_s=self.settings.evaluator_stop_timeout_s if graceful else 10.0))
            log.info("started", process=name, log=str(self.logs / f"{name}.log"))

    def evaluator_ready(self, client: redis.Redis) -> bool:
        try:
            stats = client.hgetall(RedisKeys(self.settings).evaluator_stats)
        except redis.RedisError:
            return False
        return evaluator_status(text_hash(stats), self.settings, time.time()).ready

    def _web_answers(self, timeout_s: float = 120.0) -> None:
        """Announce the URL only once something answers there."""
        deadline = time.monotonic() + timeout_s
        while not self.stopping and time.monotonic() < deadline:
            if _listening(f"{self.settings.web_host}:{self.settings.web_port}"):
                return
            time.sleep(0.2)

    def watch(self) -> int:
        url = f"http://{self.settings.web_host}:{self.settings.web_port}/"
        self._web_answers()
        print(f"\n  Tocsin is starting: {url}  (the evaluator's first batch takes about a minute)\n"
              f"  API docs: {url}docs   logs: {self.logs}/   stop: Ctrl-C\n", flush=True)
        client = make_redis(self.settings, decode_responses=True, socket_timeout=2)
        ready = False
        while not self.stopping:
            for child in self.children:
                code = child.process.poll()
                if code is None or child.name in self.due:
                    continue
                path = self.logs / f"{child.name}.log"
                tail = "\n".join(f"    {line}" for line in log_tail(path))
                if child.name not in self.recipes:
                    log.error("process_exited", process=child.name, code=code, log=str(path))
                    print(f"\n  {child.name} exited with code {code}; the end of {path}:\n{tail}\n", flush=True)
                    return 1
                self.exited(child, code, client, tail)
            for name, due in list(self.due.items()):
                if time.monotonic() >= due and not self.stopping:
                    self.restart(name, client)
            if not ready and self.evaluator_ready(client):
                ready = True
                self.announce_ready(url)
            time.sleep(0.5)
        return 0

    def exited(self, child: ManagedProcess, code: int, client: redis.Redis, tail: str) -> None:
        """A supervised process exited: what is left of its group goes, and its restart is due after its backoff."""
        child.kill()  # a crashed driver's JVM, a worker's children: the new process must not meet them
        backoff = self.backoffs[child.name]
        delay = backoff.exited(time.monotonic())
        self.due[child.name] = time.monotonic() + delay
        path = self.logs / f"{child.name}.log"
        log.warning("process_exited", process=child.name, code=code, log=str(path), restart_in_s=delay,
                    in_a_row=backoff.in_a_row)
        print(f"\n  {child.name} exited with code {code}; restarting it in {delay:g} s. The end of {path}:\n"
              f"{tail}\n", flush=True)
        if backoff.crash_looping:
            log.error("process_crash_looping", process=child.name, in_a_row=backoff.in_a_row, code=code,
                      log=str(path))
            print(f"  {child.name} KEEPS CRASHING: {backoff.in_a_row} exits in a row, none up "
                  f"{self.settings.runner_restart_reset_s:g} s; retrying every {delay:g} s at most. Read {path}.\n",
                  flush=True)
        self.last_exit[child.name] = (time.time(), code)
        self.record(child.name, delay, client)

    def restart(self, name: str, client: redis.Redis) -> None:
        del self.due[name]
        index = next(i for i, child in enumerate(self.children) if child.name == name)
        self.children[index] = self.recipes[name]()
        self.backoffs[name].restarted(time.monotonic())
        self.counts[name] = self.counts.get(name, 0) + 1
        log.warning("process_restarted", process=name, restarts=self.counts[name], pid=self.children[index].process.pid)
        print(f"  {name} restarted (restart {self.counts[name]})\n", flush=True)
        self.record(name, 0.0, client)

    def record(self, name: str, delay: float, client: redis.Redis) -> None:
        """The process's restarts in Redis, for /ops (Redis away: the log lines above still say it)."""
        backoff = self.backoffs[name]
        at, code = self.last_exit[name]
        entry = restarts.Restarts(process=name, restarts=self.counts.get(name, 0), last_at=at, last_code=code,
                                  in_a_row=backoff.in_a_row, crash_looping=backoff.crash_looping, next_in_s=delay)
        try:
            restarts.record(client, RedisKeys(self.settings), entry)
        except redis.RedisError as exc:
            log.warning("restart_not_recorded", process=name, error=str(exc))

    def announce_ready(self, url: str) -> None:
        """Say the platform is up; on a new database, then create the operator account and print its one-time
        password last, framed on its own, where the person who started the platform looks (created only now, so
        a start that fails before this leaves no account whose password nobody saw)."""
        print(f"  Tocsin is running: {url}  (evaluator ready: first batch evaluated)\n", flush=True)
        password = first_operator(self.settings)
        if password is not None:  # a new database: someone must be able to see the operator dashboard
            print(operator_notice(password, url), flush=True)

    def stop(self) -> None:
        """The feed first, then the evaluator (gracefully), then what serves them."""
        for child in reversed(self.children):
            child.stop()
        log.info("stopped")


def main(argv: list[str] | None = None) -> int:
    cli.no_arguments(__doc__, "python -m devstack.run", argv)
    configure_logging()
    runner = Runner(get_settings())

    def request_stop(*_: object) -> None:
        runner.stopping = True

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    try:
        runner.start()
        return runner.watch()
    finally:
        runner.stop()


if __name__ == "__main__":
    sys.exit(main())
