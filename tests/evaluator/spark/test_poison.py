"""Poison records and forged time on the real broker through the real job: nothing stops or bends evaluation.

Between the valid events of a stream go every kind of bad record we could think of, events and a
heartbeat dated in the future on every partition. The job must keep running, put each bad record in
the dead-letter topic with its reason, count the refusals, and raise exactly the alerts of the
stream without the bad records (the brute-force oracle's).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import redis

from core.redis_schema import RedisKeys
from core.settings import Settings
from ingest.kafka import ensure_topics
from ingest.model import Event, Heartbeat
from ingest.publisher import EventPublisher
from tests.evaluator.oracle import oracle
from tests.evaluator.spark.queries import stop_query
from tests.evaluator.spark.test_job import publish_catalog, transitions
from tests.evaluator.streams import (
    BASE,
    HORIZON,
    SPECS,
    alert_set,
    evaluated_everything,
    for_run,
    generated_stream,
    wait_until,
)
from tests.ingest.test_publisher import read_topic
from web.ops import sample_once
from web.watchdog import open_incidents

pytestmark = pytest.mark.spark

YEAR_3000 = 32_503_680_000_000


def poison(ts: int) -> list[tuple[bytes | None, str]]:
    """(record, what its dead letter's reason says): each would crash, silence or bend evaluation if let in."""
    def event(body: str) -> bytes:
        return (f'{{"key": "K01", "ts": {ts}, ' + body + "}").encode()

    return [
        (b"[" * 30_000 + b"]" * 30_000, "JSON nested 30000 deep"),
        (b'{"key": "K01", "ts": 99999999999999999999999, "price": 100, "volume": 1}', "ts: Input should be less"),
        (event('"price": 100, "volume": 1.7e308'), "volume: Input should be less than or equal to 1e+15"),
        (event('"price": 100, "volume": 1.6e308'), "volume: Input should be less than or equal to 1e+15"),
        (b"\x00junk\xff" * 33_334, "record: 200004 bytes, more than the 65536 allowed"),
        (event('"price": 100, "volume": 1').replace(b"K01", b"K01\xff"), "not UTF-8: byte 0xff"),
        (b'{"key": 5, "ts": true, "price": "100", "volume": [1]}', "key: Input should be a valid string"),
        (event('"price": 100, "volume": 1').replace(b'"K01"', b'""'), "key: String should have at least 1"),
        (event('"price": -100, "volume": 1'), "price: Input should be greater than or equal to 0"),
        (event('"price": NaN, "volume": 1'), "price: Input should be a finite number"),
        (event('"price": 100, "volume": 1e999'), "volume: Input should be a finite number"),
        (event('"price": 100, "volume": 1, "volume": 1e9'), "volume: field given more than once"),
        (event('"price": [' + "0, " * 15_000 + '0], "volume": 1'), "price: Input should be a valid number"),
        (None, "record: empty value"),
    ]


@pytest.mark.slow  # hostile input, ~25 s: run in CI
def test_poison_and_future_records_cost_only_themselves(spark, settings: Settings, tmp_path: Path) -> None:
    ensure_topics(settings)
    events = generated_stream(seed=7, n=900)
    run = for_run(settings, "poison", tmp_path).model_copy(update={"source_max_records_per_trigger": 300})
    partitions = range(settings.event_partitions)
    bad: list[tuple[bytes | None, str]] = []
    with EventPublisher(settings) as publisher:
        send = publisher.producer.send

        def publish_bad(record: bytes | None, reason: str, partition: int) -> None:
            send(settings.events_topic, key=b"K01", value=record, partition=partition)
            bad.append((record, reason))

        next_beat = BASE + 1_000
        for i, (key, ts, price, volume) in enumerate(events):
            publisher.publish(Event(key=key, ts=ts, price=price, volume=volume))
            if ts >= next_beat + 1_000:
                publisher.heartbeat(next_beat)
                next_beat += 1_000
            if i == 300:  # mid-stream, every partition: records that must not get in
                for n, (record, reason) in enumerate(poison(ts)):
                    publish_bad(record, reason, n % len(partitions))
            if i == 500:  # the future on every partition: events in the year 3000 and two hours ahead, a heartbeat
                for p in partitions:
                    future = Event(key="K00", ts=YEAR_3000 + p, price=100, volume=1e6)
                    publish_bad(future.to_json(), "ahead of the processing clock", p)
                    publish_bad(Heartbeat(partition=p, ts=YEAR_3000).to_json(), "heartbeat time", p)
                publish_bad(Event(key="K03", ts=ts + 3 * 3_600_000, price=100, volume=1e6).to_json(),
                            "ahead of the processing clock", 1)
        end = max(ts for _, ts, *_ in events) + 12_000
        publisher.heartbeat(end)
    last = (end - run.watermark_delay_ms) // run.pane_ms * run.pane_ms

    publish_catalog(run, *SPECS)
    from evaluator.spark.job import build_query

    query = build_query(spark, run)
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    watched = run.model_copy(update={"dashboard_sample_s": 0.3, "watchdog_min_records": 100})

    def done() -> bool:  # the dead man's switch samples and judges as the web app would, all along
        if query.lastProgress is not None:  # from the first batch's end: a slow machine's first batch is no outage
            sample_once(watched, client)
        return evaluated_everything(run, last, run.spark_shuffle_partitions)

    try:
        wait_until(done, query=query)
        assert query.isActive and query.exception() is None
        # several batches, the bad records among them (the sink writes a batch's clocks before Spark reports it)
        wait_until(lambda: query.lastProgress is not None and query.lastProgress["batchId"] >= 3, timeout_s=30,
                   query=query)
    finally:
        stop_query(query, run)

    expected = oracle(events, SPECS, last, run.pane_ms, HORIZON)
    got = alert_set(run)
    assert len(expected) > 50
    assert set(got) == expected, "the alerts are those of the stream without the bad records"
    assert len(got) == len(set(got)) == len(transitions(run))

    letters = [json.loads(v) for v in read_topic(settings, settings.dead_letter_topic)]
    assert all(len(json.dumps(letter)) < 64 * 1024 for letter in letters), "a dead letter always fits the topic"
    by_digest = {letter["raw_sha256"]: letter for letter in letters}
    for record, reason in bad:
        letter = by_digest.get(hashlib.sha256(record or b"").hexdigest())
        assert letter is not None, f"no dead letter for {(record or b'')[:60]!r}"
        assert reason in letter["reason"], (reason, letter["reason"])
        assert letter["raw_bytes"] == len(record or b"")
        assert letter["source"].startswith(f"{settings.events_topic}[")
    assert len(letters) == len(bad)

    stats = redis.Redis.from_url(settings.redis_url, decode_responses=True).hgetall(RedisKeys(run).evaluator_stats)
    assert int(stats["future_events_refused"]) == len(partitions) + 1
    assert int(stats["future_heartbeats_refused"]) == len(partitions)
    assert int(stats["dead_lettered"]) == len(bad)
    assert int(stats.get("invalid_events_dropped", 0)) == 0
    assert len(client.lrange(RedisKeys(watched).ops_samples, 0, -1)) >= 3
    assert open_incidents(client, watched) == {}, "refused future records and poison must not trip the switch"
