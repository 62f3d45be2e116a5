"""Publishing benchmark: events/s into Kafka through ``POST /api/streams/{name}/events`` from one web process.

    python benchmarks/publish.py            # 300k events per row
    python benchmarks/publish.py --quick    # smoke run (20k events per row)

A real Tansu broker, a real Redis and one uvicorn web process (the production app,
``web.app:create_app``) are started here; this process is the load generator:
``--clients`` threads with httpx post pre-built NDJSON bodies of ``batch`` records of
the ``trades`` stream (as ``ingest.model.Event`` writes them) in a loop. A request
answers once Kafka acknowledged every record of it, so the throughput is events in
Kafka; at the end the topic's log end offsets are checked to hold every accepted
event. The target is >= 50,000 events/s; the machine is shared, so the numbers are
printed, never asserted.

A second table compares the producers on their own (no web app): the same
pre-serialised records through librdkafka (``confluent_kafka``, what the web app
uses) and kafka-python (what ``ingest.publisher`` uses).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.report import add_markdown_option, markdown_run, percentiles, table
from core.settings import Settings
from devstack.services import free_port, python_module, spawn, start_redis, start_tansu, wait_for_port
from ingest.kafka import ensure_topics, topic_end_offsets

NOW = 1_700_000_000_000


def bodies(batch: int, count: int, seed: int = 15) -> list[bytes]:
    """``count`` NDJSON bodies of ``batch`` trades each, over 5,000 Zipf-popular keys."""
    rng = random.Random(seed)
    names = [f"S{i:05d}" for i in range(5_000)]
    weights = [1 / (i + 1) ** 0.8 for i in range(len(names))]
    out = []
    for b in range(count):
        keys = rng.choices(names, weights, k=batch)
        out.append("\n".join(
            f'{{"key":"{k}","ts":{NOW + b * batch + i},"price":{rng.uniform(1, 500):.2f},'
            f'"volume":{rng.randrange(1, 10_000)}}}' for i, k in enumerate(keys)).encode())
    return out


def load(url: str, token: str, payloads: list[bytes], clients: int, total: int) -> tuple[float, list[float], int]:
    """Post bodies from ``clients`` threads until ``total`` events are accepted: (seconds, latencies, accepted)."""
    latencies: list[float] = []
    accepted = [0]
    lock = threading.Lock()
    per_body = payloads[0].count(b"\n") + 1
    requests = max(total // per_body, clients)
    counter = iter(range(requests))
    errors: list[str] = []

    def work() -> None:
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/x-ndjson"}
        with httpx.Client(base_url=url, timeout=60) as client:
            for n in counter:
                body = payloads[n % len(payloads)]
                while True:
                    started = time.perf_counter()
                    answer = client.post("/api/streams/trades/events", content=body, headers=headers)
                    if answer.status_code == 429:  # backpressure: as a publisher should, wait and retry
                        time.sleep(float(answer.headers["Retry-After"]) / 10)
                        continue
                    break
                elapsed = time.perf_counter() - started
                if answer.status_code != 202 or answer.json()["rejected"]:
                    errors.append(answer.text[:300])
                    return
                with lock:
                    latencies.append(elapsed)
                    accepted[0] += answer.json()["accepted"]

    threads = [threading.Thread(target=work) for _ in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise RuntimeError(f"a publish failed: {errors[0]}")
    return time.perf_counter() - started, latencies, accepted[0]


def producer_rows(settings: Settings, n: int) -> list[list[object]]:
    """The two producers alone: events/s until every record is acknowledged."""
    from confluent_kafka import Producer
    from kafka import KafkaProducer

    values = [v for body in bodies(10_000, max(n // 10_000, 1), seed=3) for v in body.split(b"\n")][:n]
    keys = [v[8:14] for v in values]
    rows: list[list[object]] = []
    topic = "bench.producers"
    ensure_topics(settings, {topic: settings.event_partitions})
    fast = Producer({"bootstrap.servers": settings.kafka_bootstrap, "acks": "all", "linger.ms": 5,
                     "partitioner": "murmur2_random", "queue.buffering.max.messages": n + 1})
    started = time.perf_counter()
    for key, value in zip(keys, values, strict=True):
        fast.produce(topic, value, key)
    fast.flush()
    rows.append(["confluent_kafka (librdkafka)", n, n / (time.perf_counter() - started)])
    slow = KafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all", linger_ms=5)
    started = time.perf_counter()
    for key, value in zip(keys, values, strict=True):
        slow.send(topic, value=value, key=key)
    slow.flush()
    rows.append(["kafka-python", n, n / (time.perf_counter() - started)])
    slow.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run")
    parser.add_argument("--events", type=int, default=300_000, help="events per row")
    parser.add_argument("--clients", type=int, default=4, help="load generator threads")
    add_markdown_option(parser)
    args = parser.parse_args()
    events = 20_000 if args.quick else args.events
    plan = [(1_000, args.clients), (5_000, args.clients), (10_000, args.clients), (10_000, 1)]
    with tempfile.TemporaryDirectory(prefix="tocsin-publish-") as tmp:
        work = Path(tmp)
        kafka_port, redis_port, web_port = free_port(), free_port(), free_port()
        broker = start_tansu("127.0.0.1", kafka_port, work / "tansu.log")
        redis_server = start_redis(redis_port, work / "redis", work / "redis.log")
        web = None
        try:
            settings = Settings(kafka_bootstrap=f"127.0.0.1:{kafka_port}", redis_url=f"redis://127.0.0.1:{redis_port}/0",
                                database_url=f"sqlite:///{work / 'tocsin.db'}", data_dir=work / "var",
                                events_topic="bench.events", dead_letter_topic="bench.dead", dashboard_sample_s=3600,
                                # no heartbeats (at most one per partition a second), so the topic's offsets count
                                # exactly the events accepted
                                publish_heartbeat_ms=0)
            ensure_topics(settings)
            from subscriptions.db import session_factory
            from subscriptions.streams import StreamService

            with session_factory(settings.database_url)() as session:
                service = StreamService(session, settings)
                service.ensure_builtin()
                token, _ = service.create_token("benchmark", ["trades"], None)
            web = spawn("web", python_module("uvicorn", "web.app:create_app", "--factory", "--host", "127.0.0.1",
                                             "--port", str(web_port), "--log-level", "warning", "--no-access-log"),
                        work / "web.log", env=settings.to_env())
            wait_for_port("127.0.0.1", web_port, timeout_s=60, process=web.process)
            url = f"http://127.0.0.1:{web_port}"
            load(url, token, bodies(1_000, 2), 1, 2_000)  # warm up: imports, the validator, the producer
            rows: list[list[object]] = []
            for batch, clients in plan:
                payloads = bodies(batch, 8)
                seconds, latencies, accepted = load(url, token, payloads, clients, events)
                p50, p99 = percentiles(latencies, (50, 99), scale=1e3)
                rows.append([batch, clients, len(latencies), accepted, accepted / seconds, p50, p99,
                             len(payloads[0]) / 1024])
            table("HTTP publishing into Kafka, one web process (target >= 50,000 events/s)",
                  ["batch", "clients", "requests", "events", "events/s", "p50 ms", "p99 ms", "body KiB"], rows)
            in_kafka = sum(topic_end_offsets(settings, settings.events_topic).values())
            sent = 2_000 + sum(int(r[3]) for r in rows)  # type: ignore[call-overload]
            print(f"\nevents on the topic: {in_kafka:,} of {sent:,} accepted ({'all there' if in_kafka == sent else 'MISSING'})")
            table("The producers alone (pre-serialised records, acks=all)", ["producer", "events", "events/s"],
                  producer_rows(settings, 20_000 if args.quick else 200_000))
        finally:
            if web is not None:
                web.stop()
            redis_server.stop()
            broker.stop()


if __name__ == "__main__":
    with markdown_run():
        main()
