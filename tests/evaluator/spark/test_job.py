"""The streaming job: malformed records reach the dead-letter topic; alerts fire and resolve once."""

from __future__ import annotations

import json
import time

import pytest
import redis
from kafka import KafkaProducer

from core.catalog_log import Appended, CatalogLog
from core.redis_schema import (
    CATALOG_READ_VERSION,
    RedisKeys,
    admission_waiting,
    admission_waiting_by_shard,
    per_shard,
    shard_clocks,
)
from core.settings import Settings
from core.stream_names import TRADES
from devstack.patience import deadline
from evaluator.catalog import Catalog, CatalogChange
from evaluator.spark.job import build_query
from evaluator.spec import SubscriptionSpec
from ingest.kafka import ensure_topics
from ingest.model import Event
from ingest.publisher import EventPublisher
from subscriptions.language import parse_condition
from subscriptions.service import publish_catalog as publish
from tests.evaluator.spark.queries import stop_query
from tests.ingest.test_publisher import read_topic

pytestmark = pytest.mark.spark


def recent_base() -> int:
    """A whole hour an hour ago: test events are dated in the past, as events may not run ahead of the clock."""
    return (int(time.time() * 1000) // 3_600_000 - 1) * 3_600_000


def publish_busy_key(settings: Settings, base: int) -> None:
    """Three events of key ``A`` in the pane at ``base`` and a heartbeat past it: ``COUNT(*) OVER 5s >= 2`` fires."""
    with EventPublisher(settings) as publisher:
        for i in range(3):
            publisher.publish(Event(key="A", ts=base + i * 100, price=10, volume=1))
        publisher.heartbeat(base + 4_000)


def publish_catalog(settings: Settings, *specs: SubscriptionSpec, version: int = 1) -> None:
    assert publish(redis.Redis.from_url(settings.redis_url), RedisKeys(settings), Catalog(version, specs))


def transitions(settings: Settings) -> list[dict]:
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    return [json.loads(fields["alert"]) for _, fields in client.xrange(RedisKeys(settings).alerts_stream)]


def wait(query, predicate, timeout_s: float = 90) -> None:
    until = deadline(timeout_s)
    while time.monotonic() < until:
        query.processAllAvailable()
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError("condition not reached")


def test_fire_resolve_and_dead_letters(spark, settings: Settings) -> None:
    ensure_topics(settings)
    publish_catalog(
        settings,
        SubscriptionSpec(7, parse_condition("COUNT(*) OVER 5s >= 3"), frozenset({"K1", "K2"})),
        SubscriptionSpec(8, parse_condition("MAX(price) OVER 5s > 100")),
    )
    raw = KafkaProducer(bootstrap_servers=settings.kafka_bootstrap)
    raw.send(settings.events_topic, key=b"K1", value=b'{"key": "K1", "ts": "yesterday"}')
    raw.send(settings.events_topic, key=b"K1", value=b"\xff\xfe not json")
    raw.flush()
    base = recent_base()
    query = build_query(spark, settings)
    try:
        with EventPublisher(settings) as publisher:
            for i in range(4):
                publisher.publish(Event(key="K1", ts=base + i * 200, price=50, volume=1))
            publisher.publish(Event(key="K2", ts=base, price=150, volume=1))
            publisher.publish(Event(key="K3", ts=base, price=150, volume=1))
            publisher.heartbeat(base + 4_000)
        wait(query, lambda: len(transitions(settings)) >= 3)
        fired = {(t["subscription_id"], t["key"]) for t in transitions(settings) if t["state"] == "firing"}
        assert fired == {(7, "K1"), (8, "K2"), (8, "K3")}
        firing_set = redis.Redis.from_url(settings.redis_url).hkeys(RedisKeys(settings).firing(8))
        assert sorted(firing_set) == [b"K2", b"K3"]

        with EventPublisher(settings) as publisher:  # time passes with no events: every window drains
            publisher.heartbeat(base + 20_000)
        wait(query, lambda: sum(t["state"] == "resolved" for t in transitions(settings)) >= 3)
    finally:
        stop_query(query, settings)
    got = transitions(settings)
    assert len(got) == 6 and len({t["alert_id"] for t in got}) == 6
    resolved = [t for t in got if t["state"] == "resolved"]
    assert all(t["evaluated_at"] - t["window_start"] == 5_000 for t in resolved)
    assert redis.Redis.from_url(settings.redis_url).hlen(RedisKeys(settings).firing(8)) == 0

    dead = [json.loads(v) for v in read_topic(settings, settings.dead_letter_topic)]
    assert len(dead) == 2
    assert any("ts" in d["reason"] for d in dead) and any("not UTF-8" in d["reason"] for d in dead)
    assert all(d["source"].startswith(f"{settings.events_topic}[") for d in dead)


def test_sink_is_idempotent(settings: Settings) -> None:
    from evaluator.spark.sink import RedisAlertSink

    sink = RedisAlertSink(settings)
    row = {"alert_id": "abc", "subscription_id": 1, "key": "K", "state": "firing", "value": 1.0,
           "window_start": 0, "window_end": 10, "evaluated_at": 10}
    assert sink.write([row]) == 1
    assert sink.write([row]) == 0, "a replayed batch must add nothing"
    assert len(transitions(settings)) == 1


def test_catalog_changes_apply_within_a_trigger_and_late_events_are_counted(spark, settings: Settings) -> None:
    settings = settings.model_copy(update={"max_window_ms": 10_000})
    ensure_topics(settings)
    publish_catalog(settings, SubscriptionSpec(1, parse_condition("COUNT(*) OVER 5s >= 2")))
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    stats = RedisKeys(settings).evaluator_stats
    base = recent_base()
    query = build_query(spark, settings)
    try:
        publish_busy_key(settings, base)
        wait(query, lambda: {(t["subscription_id"], t["state"]) for t in transitions(settings)} == {(1, "firing")})

        # Without restarting the query: subscription 1 goes away (no resolution), 2 arrives and fires at once,
        # in one diff of the change log, as the web app publishes them.
        change = CatalogChange(2, (SubscriptionSpec(2, parse_condition("SUM(volume) OVER 5s >= 3")),), (1,))
        log = CatalogLog(redis.Redis.from_url(settings.redis_url), RedisKeys(settings))
        assert log.append(2, change.encode())[0] is Appended.APPENDED
        time.sleep(0.5)  # the workers re-read the version at most every 0.2 s
        with EventPublisher(settings) as publisher:
            publisher.heartbeat(base + 5_000)
        wait(query, lambda: any(t["subscription_id"] == 2 for t in transitions(settings)))

        with EventPublisher(settings) as publisher:  # older than every window still to come
            publisher.publish(Event(key="A", ts=base - 60_000, price=10, volume=1))
            publisher.heartbeat(base + 6_000)
        wait(query, lambda: int(client.hget(stats, "late_events_dropped") or 0) == 1)
    finally:
        stop_query(query, settings)
    got = [(t["subscription_id"], t["key"], t["state"], t["evaluated_at"]) for t in transitions(settings)]
    assert got[0][:3] == (1, "A", "firing")
    assert (2, "A", "firing") in {g[:3] for g in got}
    assert [g for g in got if g[0] == 1] == [got[0]], "a removed subscription is forgotten without a transition"
    fired_2 = next(g[3] for g in got if g[0] == 2)
    assert fired_2 <= base + 3_000 + settings.pane_ms, "the new subscription was evaluated at the next boundary"


def test_condition_preview_is_answered_by_every_shard(spark, settings: Settings) -> None:
    import threading

    from web.conditions import _ask_and_gather

    ensure_topics(settings)
    publish_catalog(settings)  # no subscriptions: a preview needs none
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    base = recent_base()
    query = build_query(spark, settings)
    stop = threading.Event()

    def heartbeats() -> None:  # a live feed's heartbeats: every shard runs every micro-batch
        with EventPublisher(settings) as publisher:
            while not stop.wait(0.3):
                publisher.heartbeat(base + 4_000)

    beating = threading.Thread(target=heartbeats, daemon=True)
    try:
        with EventPublisher(settings) as publisher:
            for i in range(5):
                publisher.publish(Event(key="A", ts=base + i * 200, price=10 + i, volume=100))
            publisher.publish(Event(key="B", ts=base, price=50, volume=1))
            publisher.heartbeat(base + 4_000)
        shards = settings.spark_shuffle_partitions

        def clocks() -> list[int]:  # a shard that never had a key of its own has no boundary yet
            stats = client.hgetall(RedisKeys(settings).evaluator_stats)
            return shard_clocks(stats)

        wait(query, lambda: len(clocks()) == shards and max(clocks()) >= base + 2_000)
        beating.start()
        busy = _ask_and_gather(parse_condition("COUNT(*) OVER 5s >= 3"), None, settings, client)
        assert busy["complete"] and busy["answered"] == shards == busy["shards"]
        assert busy["evaluated_at"] == base + 2_000 and busy["watched"] == 2 and busy["total"] == 1
        assert busy["matches"] == [{"key": "A", "value": 5.0}]
        median = _ask_and_gather(parse_condition("MEDIAN(price) OVER 5s BETWEEN 12 AND 50"), ["A", "B", "C"],
                                 settings, client)
        assert {m["key"]: m["value"] for m in median["matches"]} == {"B": 50.0, "A": 12.0}
        assert median["watched"] == 3  # a listed key is watched with or without data (C: NO DATA would fire)
        assert client.hlen(RedisKeys(settings).previews) == 0, "answered requests are removed"
    finally:
        stop.set()
        stop_query(query, settings)


def compilations(spark) -> int:
    """Classes Spark's code generator has compiled in this JVM (Janino; every one the JIT compiles again)."""
    return int(spark._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME().getCount())


def test_a_batch_compiles_no_new_code(spark, settings: Settings) -> None:
    """The query's plan is the same every batch, so its generated code is compiled once: the batch's processing clock
    comes in the source's offsets, not from ``current_timestamp()``, whose value Spark wrote into the generated code
    as a new literal every batch (two new classes a batch to compile, then for the JIT: half a core on a small-batch
    drain, docs/benchmarks.md)."""
    ensure_topics(settings)
    publish_catalog(settings, SubscriptionSpec(7, parse_condition("COUNT(*) OVER 5s >= 3")))
    base = recent_base()
    query = build_query(spark, settings)
    try:
        def batch(i: int) -> None:
            before = int(query.lastProgress["batchId"]) if query.lastProgress else -1
            with EventPublisher(settings) as publisher:
                publisher.publish(Event(key="A", ts=base + i * 1_000, price=1, volume=1))
                publisher.heartbeat(base + i * 1_000 + 500)
            wait(query, lambda: query.lastProgress is not None and int(query.lastProgress["batchId"]) > before)

        for i in range(2):  # the first batches compile the plan's code
            batch(i)
        compiled, first = compilations(spark), int(query.lastProgress["batchId"])
        for i in range(2, 6):
            batch(i)
        assert int(query.lastProgress["batchId"]) >= first + 4
        assert compilations(spark) == compiled
    finally:
        stop_query(query, settings)


def test_a_burst_of_new_subscriptions_is_admitted_over_batches(spark, settings: Settings) -> None:
    """Each shard admits one new subscription a batch (a budget of one first transition): the four are admitted
    over four batches, each fires once for every key, and the waiting count goes up, is seen, and goes to 0; the
    shards' sets of waiting ids (what a subscription's page reads) hold as many as they count, then none."""
    from evaluator.spark.__main__ import ADMISSION_WAITING, _publish_progress  # the driver's metrics
    from web.admission import admission_status

    def statuses() -> list:
        return [admission_status(client, keys, TRADES, sid) for sid in range(1, 5)]

    settings = settings.model_copy(update={"evaluator_admission_transitions": 1})
    ensure_topics(settings)
    publish_catalog(settings, *(SubscriptionSpec(sid, parse_condition("COUNT(*) OVER 1m >= 1")) for sid in range(1, 5)),
                    version=7)
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    keys = RedisKeys(settings)
    base = recent_base()
    query = build_query(spark, settings)
    try:
        with EventPublisher(settings) as publisher:
            for key in ("K1", "K2", "K3", "K4"):
                publisher.publish(Event(key=key, ts=base, price=10, volume=1))
            publisher.heartbeat(base + 4_000)  # past the allowed delay: the pane at base is evaluated
        wait(query, lambda: transitions(settings))
        query.processAllAvailable()  # no batch runs while the counts and the sets are read
        _publish_progress(query, client, keys, -1)
        assert ADMISSION_WAITING.labels(stream="trades")._value.get() > 0
        counted = admission_waiting(client.hgetall(keys.evaluator_stats))[TRADES]
        early = statuses()
        assert counted > 0 and sum(s.waiting_shards for s in early) == counted, early
        fired = {t["subscription_id"] for t in transitions(settings)}
        assert all(s.shards == settings.spark_shuffle_partitions for s in early)
        assert all(early[sid - 1].waiting for sid in range(1, 5) if sid not in fired), (fired, early)
        for second in range(5, 30):
            if {t["subscription_id"] for t in transitions(settings)} == {1, 2, 3, 4} and not admission_waiting(
                    client.hgetall(keys.evaluator_stats))[TRADES]:
                break
            with EventPublisher(settings) as publisher:  # a batch each: each shard admits the next
                publisher.heartbeat(base + second * 1_000)
            query.processAllAvailable()
        _publish_progress(query, client, keys, -1)
    finally:
        stop_query(query, settings)
    got = transitions(settings)
    assert sorted((t["subscription_id"], t["key"]) for t in got) == [(s, k) for s in range(1, 5)
                                                                     for k in ("K1", "K2", "K3", "K4")]
    assert all(t["state"] == "firing" for t in got)
    assert len({t["evaluated_at"] for t in got}) >= 4, "admitted over (at least) four batches"
    assert ADMISSION_WAITING.labels(stream="trades")._value.get() == 0
    assert int(client.hget(keys.evaluator_stats, "subscriptions_admitted")) == 4 * settings.spark_shuffle_partitions
    assert not any(s.waiting for s in statuses())
    shards = admission_waiting_by_shard(client.hgetall(keys.evaluator_stats))[TRADES]
    assert len(shards) == settings.spark_shuffle_partitions
    assert not any(client.exists(keys.admission_waiting(TRADES, shard)) for shard in shards)
    read = per_shard(client.hgetall(keys.evaluator_stats), CATALOG_READ_VERSION)[TRADES]  # a page's "changed after"
    assert read == dict.fromkeys(shards, "7"), read
    assert admission_status(client, keys, TRADES, 1, changed_at=7).unread_shards == 0
    assert admission_status(client, keys, TRADES, 1, changed_at=8).unread_shards == len(shards)
