"""``python -m ingest``: create topics, run the synthetic feeds (market ``trades``, host metrics ``hosts``), or
replay a file into a stream."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from pathlib import Path

import structlog
from tqdm import tqdm

from core import cli
from core.logs import configure_logging
from core.metrics import serve_metrics
from core.settings import Settings, get_settings
from core.streams import TRADES, StreamSchema, topic_name, trades_schema
from ingest.hosts import HOSTS, HostMetrics, hosts_schema
from ingest.kafka import ensure_topics
from ingest.market import MarketGenerator
from ingest.publisher import EventPublisher
from ingest.replay import read_records
from ingest.streams import StreamPublisher

#: The streams ingest has publishers for (the local platform declares both at start-up).
DEMO_STREAMS: dict[str, Callable[[Settings], StreamSchema]] = {TRADES: trades_schema, HOSTS: hosts_schema}
REPLAY_BATCH = 1_000  # records judged at once (the validator works on whole batches)

log = structlog.get_logger("ingest")


def run_feed(duration_s: float | None, step_ms: int = 100) -> None:
    """Publish the synthetic market in real time, with heartbeats, until stopped."""
    settings = get_settings()
    market = MarketGenerator(
        symbols=settings.feed_symbols,
        rate=settings.feed_rate,
        seed=settings.feed_seed,
        start_ms=int(time.time() * 1000),
        max_disorder_ms=settings.feed_max_disorder_ms,
    )
    serve_metrics(settings.metrics_port_feed, settings.metrics_bind_address)
    log.info("feed_started", symbols=settings.feed_symbols, rate=settings.feed_rate, topic=settings.events_topic)
    stop_at = time.monotonic() + duration_s if duration_s else None
    next_heartbeat = 0.0
    with EventPublisher(settings) as publisher:
        while stop_at is None or time.monotonic() < stop_at:
            behind_ms = int(time.time() * 1000) - market.clock_ms
            if behind_ms < step_ms:
                time.sleep((step_ms - behind_ms) / 1000)
                continue
            publisher.publish_many(market.advance(step_ms))
            if time.monotonic() >= next_heartbeat:
                publisher.heartbeat(market.low_watermark_ms)
                next_heartbeat = time.monotonic() + settings.heartbeat_interval_ms / 1000
    log.info("feed_stopped", published=publisher.published)


def run_hosts(duration_s: float | None) -> None:
    """Publish the synthetic host metrics of the ``hosts`` stream in real time, with heartbeats, until stopped."""
    settings = get_settings()
    fleet = HostMetrics(hosts=settings.hosts_feed_hosts, seed=settings.feed_seed, interval_ms=settings.hosts_feed_interval_ms,
                        start_ms=int(time.time() * 1000))
    serve_metrics(settings.metrics_port_hosts_feed, settings.metrics_bind_address)
    stop_at = time.monotonic() + duration_s if duration_s else None
    with StreamPublisher(settings, hosts_schema(settings)) as publisher:
        log.info("hosts_feed_started", hosts=settings.hosts_feed_hosts, topic=publisher.topic)
        while stop_at is None or time.monotonic() < stop_at:
            wait_ms = fleet.clock_ms + fleet.interval_ms - time.time() * 1000
            if wait_ms > 0:
                time.sleep(wait_ms / 1000)
                continue
            records = fleet.advance()
            publisher.publish_records(records, [f"hosts feed {i}" for i in range(len(records))])
            publisher.heartbeat(fleet.clock_ms)
    log.info("hosts_feed_stopped", published=publisher.published, dead_lettered=publisher.dead_lettered)


def run_replay(path: Path, stream: str = TRADES) -> None:
    """Publish a file's rows to ``stream``, judged in batches against its schema; bad rows are dead-lettered
    with their reason and ``file:line``."""
    settings = get_settings()
    rows = iter(tqdm(read_records(path), desc=f"replay {path.name}", unit="ev"))
    with StreamPublisher(settings, DEMO_STREAMS[stream](settings)) as publisher:
        while batch := list(itertools.islice(rows, REPLAY_BATCH)):
            publisher.publish_records([r if isinstance(r, str) else json.dumps(r) for _, r in batch],
                                      [source for source, _ in batch])
        publisher.flush()
    log.info("replay_done", file=str(path), stream=stream, published=publisher.published,
             dead_lettered=publisher.dead_lettered)


def main(argv: list[str] | None = None) -> None:
    configure_logging()
    parser = cli.parser(__doc__, "python -m ingest")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("topics", help="create the event and dead-letter topics")
    feed = sub.add_parser("feed", help="publish the synthetic market in real time")
    feed.add_argument("--duration", type=float, default=None, help="seconds to run (default: forever)")
    hosts = sub.add_parser("hosts", help="publish the synthetic host metrics (stream 'hosts') in real time")
    hosts.add_argument("--duration", type=float, default=None, help="seconds to run (default: forever)")
    replay = sub.add_parser("replay", help="publish a CSV or JSONL file of records to a stream")
    replay.add_argument("path", type=Path)
    replay.add_argument("--stream", choices=sorted(DEMO_STREAMS), default=TRADES,
                        help="the stream whose schema the rows follow (default: trades)")
    args = parser.parse_args(argv)
    settings = get_settings()
    ensure_topics(settings)
    if args.command == "feed":
        run_feed(args.duration)
    elif args.command == "hosts":  # its topic, if no one declared the stream yet (the local runner does)
        schema = hosts_schema(settings)
        ensure_topics(settings, {topic_name(HOSTS, settings): schema.partitions, settings.dead_letter_topic: 1})
        run_hosts(args.duration)
    elif args.command == "replay":
        run_replay(args.path, args.stream)


if __name__ == "__main__":
    main()
