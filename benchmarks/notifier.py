"""Delivery throughput and latency of the notifier: Celery workers vs a naive in-process loop.

    python benchmarks/notifier.py            # 2 workers, 3000-delivery burst, 20 s paced run
    python benchmarks/notifier.py --quick    # smoke run (seconds)

Everything is real and local: a Redis server of its own, Celery worker processes
running ``notifier.tasks.deliver``, a threaded HTTP receiver (webhooks) and an
aiosmtpd server (e-mail).

- *burst*: N notifications are enqueued at once; deliveries/s is N over the time
  from the first enqueue to the last arrival.
- *paced*: notifications are enqueued at a fixed rate (below capacity) and each
  one's enqueue-to-delivery latency is taken from its arrival at the receiver.
- *naive*: the same deliveries made one after another by one process, without a
  queue (what a notifier without workers would do), measured in the same run.

Numbers are printed, never asserted.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.report import add_markdown_option, markdown_run, percentiles, table
from core.settings import Settings
from devstack.mailsink import MailSink
from devstack.receiver import Received, WebhookReceiver
from devstack.services import free_port, python_module, spawn, start_redis
from notifier.app import DELIVER_TASK, make_celery
from notifier.channels.email import render, send_email
from notifier.channels.webhook import WebhookLimits, post_webhook
from notifier.notification import build_notification, notification_id
from subscriptions.accounts import AccountService
from subscriptions.db import session_factory
from subscriptions.models import Endpoint

RUN = f"{time.time():.0f}"
SECRET = "s" * 32
QS = (50, 95, 99)


def notification(i: int, tag: str) -> dict:
    alert = {"alert_id": f"{tag}-{i}", "key": f"K{i % 5000}", "state": "firing", "value": 1.0,
             "window_start": 0, "window_end": 60_000, "evaluated_at": 60_000}
    info = {"id": 1, "name": "benchmark", "condition": "COUNT(*) OVER 1m > 0"}
    payload = build_notification(info, [alert], notification_id([f"{RUN}-{tag}-{i}"]))
    payload["enqueued_at"] = time.time()
    return payload


class Arrivals:
    """Arrival times by notification id, from the webhook receiver or the mail sink."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self.lock = threading.Lock()

    def add(self, nid: str, at: float) -> None:
        with self.lock:
            self.at.setdefault(nid, at)

    def wait(self, ids: list[str], label: str, timeout_s: float = 600) -> None:
        deadline = time.monotonic() + timeout_s
        with tqdm(total=len(ids), desc=label, unit="delivery", leave=False) as bar:
            while time.monotonic() < deadline:
                done = sum(1 for i in ids if i in self.at)
                bar.update(done - bar.n)
                if done == len(ids):
                    return
                time.sleep(0.05)
        raise TimeoutError(f"{label}: {len(ids) - done} of {len(ids)} deliveries missing after {timeout_s}s")


def burst(celery, endpoint_id: int, arrivals: Arrivals, n: int, tag: str) -> tuple[float, list[float]]:
    payloads = [notification(i, tag) for i in range(n)]
    started = time.time()
    for p in payloads:
        p["enqueued_at"] = time.time()
        celery.send_task(DELIVER_TASK, args=(p, endpoint_id))
    ids = [p["notification_id"] for p in payloads]
    arrivals.wait(ids, tag)
    finished = max(arrivals.at[i] for i in ids)
    return n / (finished - started), [arrivals.at[p["notification_id"]] - p["enqueued_at"] for p in payloads]


def paced(celery, endpoint_id: int, arrivals: Arrivals, rate: float, seconds: float, tag: str) -> list[float]:
    payloads, started = [], time.perf_counter()
    for i in range(int(rate * seconds)):
        time.sleep(max(0.0, started + i / rate - time.perf_counter()))
        p = notification(i, tag)
        celery.send_task(DELIVER_TASK, args=(p, endpoint_id))
        payloads.append(p)
    arrivals.wait([p["notification_id"] for p in payloads], tag)
    return [arrivals.at[p["notification_id"]] - p["enqueued_at"] for p in payloads]


def naive_webhooks(url: str, arrivals: Arrivals, n: int, tag: str) -> tuple[float, list[float]]:
    payloads = [notification(i, tag) for i in range(n)]
    started = time.time()
    for p in tqdm(payloads, desc=tag, unit="delivery", leave=False):
        post_webhook(url, p, SECRET, p["notification_id"], WebhookLimits(allow_hosts=("127.0.0.1",)))
    finished = time.time()
    return n / (finished - started), [arrivals.at[p["notification_id"]] - started for p in payloads]


def naive_emails(settings: Settings, n: int) -> float:
    started = time.time()
    for i in range(n):
        send_email(render(notification(i, "naive-mail"), settings.smtp_from, "ops@example.com", 2), settings)
    return n / (time.time() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--workers", type=int, default=2, help="Celery worker processes")
    parser.add_argument("--concurrency", type=int, default=8, help="threads per worker")
    parser.add_argument("--deliveries", type=int, default=3000, help="size of the burst to the instant receiver")
    parser.add_argument("--slow-deliveries", type=int, default=600, help="size of the burst to the slow receiver")
    parser.add_argument("--slow-ms", type=float, default=50.0, help="response time of the slow receiver")
    parser.add_argument("--rate", type=float, default=200.0, help="paced enqueue rate per second")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of the paced run")
    add_markdown_option(parser)
    args = parser.parse_args()
    if args.quick:
        args.deliveries, args.slow_deliveries, args.seconds, args.rate = 200, 60, 3.0, 50.0

    work = Path(tempfile.mkdtemp(prefix="tocsin-bench-notifier-"))
    redis_port = free_port()
    redis_server = start_redis(redis_port, work / "redis", work / "redis.log")
    arrivals = Arrivals()

    def record(got: Received) -> None:
        arrivals.add(got.json["notification_id"], got.at)

    receivers = {"instant": WebhookReceiver(on_receive=record),
                 "slow": WebhookReceiver(on_receive=record, latency_s=args.slow_ms / 1000)}
    sink = MailSink()
    settings = Settings(
        redis_url=f"redis://127.0.0.1:{redis_port}/0", redis_prefix="bench", database_url=f"sqlite:///{work}/db.sqlite",
        data_dir=work, webhook_allow_hosts=["127.0.0.1"], smtp_port=sink.bound_port, metrics_port_worker=0,
        # One tenant, one endpoint per receiver: lift the isolation caps to measure the workers themselves.
        delivery_endpoint_concurrency=64, delivery_owner_concurrency=64,
    )
    with session_factory(settings.database_url)() as session:
        owner = AccountService(session, settings).sign_up("bench@example.com", "benchmark password")
        hooks = {name: Endpoint(owner_id=owner.id, kind="webhook", target=r.url) for name, r in receivers.items()}
        for hook in hooks.values():
            hook.set_secret(settings, SECRET)
        mail = Endpoint(owner_id=owner.id, kind="email", target="ops@example.com")
        session.add_all([*hooks.values(), mail])
        session.commit()
    worker_cmd = python_module("celery", "-A", "notifier.app", "worker", "--pool", "threads", "--concurrency",
                               str(args.concurrency), "--loglevel", "WARNING", "--without-gossip",
                               "--without-mingle", "--without-heartbeat")
    workers = [spawn(f"worker-{i}", worker_cmd, work / f"worker-{i}.log", env=settings.to_env())
               for i in range(args.workers)]
    celery = make_celery(settings)
    rows = []
    try:
        burst(celery, hooks["instant"].id, arrivals, 20, "warm-up")  # workers up, connections made
        for name, n in (("instant", args.deliveries), ("slow", args.slow_deliveries)):
            label = "instant receiver" if name == "instant" else f"receiver taking {args.slow_ms:.0f} ms"
            rate, latency = burst(celery, hooks[name].id, arrivals, n, f"burst-{name}")
            naive_rate, naive_latency = naive_webhooks(receivers[name].url, arrivals, n, f"naive-{name}")
            rows.append([f"celery burst, {label}", n, rate, *percentiles(latency, QS, 1e3), rate / naive_rate])
            rows.append([f"naive loop, {label}", n, naive_rate, *percentiles(naive_latency, QS, 1e3), 1.0])
        paced_latency = paced(celery, hooks["instant"].id, arrivals, args.rate, args.seconds, "paced")
        rows.append([f"celery paced {args.rate:.0f}/s, instant receiver", len(paced_latency), args.rate,
                     *percentiles(paced_latency, QS, 1e3), float("nan")])

        mails = max(args.deliveries // 10, 20)
        started = time.time()
        for i in range(mails):
            celery.send_task(DELIVER_TASK, args=(notification(i, "mail"), mail.id))
        deadline = time.monotonic() + 600
        while len(sink.messages) < mails and time.monotonic() < deadline:
            time.sleep(0.02)
        mail_rate = mails / (time.time() - started)
        naive_mail_rate = naive_emails(settings, mails)
        rss = sum(p.memory_info().rss for w in workers for p in [psutil.Process(w.process.pid),
                  *psutil.Process(w.process.pid).children(recursive=True)]) / 2**20
    finally:
        for w in workers:
            w.stop()
        for r in receivers.values():
            r.close()
        sink.close()
        redis_server.stop()

    table(
        f"Webhook deliveries: {args.workers} Celery workers x {args.concurrency} threads vs one naive loop "
        f"(latency = enqueue to arrival)",
        ["run", "deliveries", "deliveries/s", "p50 ms", "p95 ms", "p99 ms", "ratio vs naive"],
        rows,
    )
    table(
        "E-mail deliveries to a local aiosmtpd server",
        ["run", "e-mails", "e-mails/s", "ratio vs naive"],
        [["celery burst", mails, mail_rate, mail_rate / naive_mail_rate], ["naive loop", mails, naive_mail_rate, 1.0]],
    )
    table("Workers", ["processes", "threads each", "resident memory MB"], [[args.workers, args.concurrency, rss]])


if __name__ == "__main__":
    with markdown_run():
        main()
