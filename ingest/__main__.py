"""``python -m ingest``: create topics, run the synthetic feed, or replay a file."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import structlog
from tqdm import tqdm

from core.logs import configure_logging
from core.metrics import serve_metrics
from core.settings import get_settings
from ingest.kafka import ensure_topics
from ingest.market import MarketGenerator
from ingest.publisher import EventPublisher
from ingest.replay import read_records

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
    serve_metrics(settings.metrics_port_feed)
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


def run_replay(path: Path) -> None:
    settings = get_settings()
    good = bad = 0
    with EventPublisher(settings) as publisher:
        for source, record in tqdm(read_records(path), desc=f"replay {path.name}", unit="ev"):
            if publisher.publish_raw(record, source=source):
                good += 1
            else:
                bad += 1
        publisher.flush()
    log.info("replay_done", file=str(path), published=good, dead_lettered=bad)


def main(argv: list[str] | None = None) -> None:
    configure_logging()
    parser = argparse.ArgumentParser(prog="python -m ingest", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("topics", help="create the event and dead-letter topics")
    feed = sub.add_parser("feed", help="publish the synthetic market in real time")
    feed.add_argument("--duration", type=float, default=None, help="seconds to run (default: forever)")
    replay = sub.add_parser("replay", help="publish a CSV or JSONL file of events")
    replay.add_argument("path", type=Path)
    args = parser.parse_args(argv)
    settings = get_settings()
    ensure_topics(settings)
    if args.command == "feed":
        run_feed(args.duration)
    elif args.command == "replay":
        run_replay(args.path)


if __name__ == "__main__":
    main()
