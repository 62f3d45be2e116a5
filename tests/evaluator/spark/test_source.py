"""The Kafka Python data source reads every record exactly once, on Tansu's quirks too."""

from __future__ import annotations

import gc
import hashlib
import pickle
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from kafka import KafkaProducer
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from core.redis_schema import RedisKeys
from core.settings import Settings
from evaluator.spark.job import source_options
from evaluator.spark.source import CLOCK, KafkaSlice, KafkaStreamReader, partition_offsets, split_limit, stop_file
from ingest.kafka import LogEndProbe, ensure_topics, topic_end_offsets
from tests.topics import delete_topic

pytestmark = pytest.mark.spark

NOW_MS = 1_800_000_000_000  # a batch's processing clock, as the driver sets it in the offsets


def produce(settings: Settings, per_partition: dict[int, int], tag: str) -> int:
    """Produce records, ending with one multi-record batch per partition (the ListOffsets trap)."""
    producer = KafkaProducer(bootstrap_servers=settings.kafka_bootstrap, linger_ms=200, batch_size=1 << 20)
    total = 0
    for partition, count in per_partition.items():
        for i in range(count):
            producer.send(settings.events_topic, value=f"{tag}-{partition}-{i}".encode(), partition=partition)
            if i % 7 == 0:
                producer.flush()  # several batches, the last holds several records
            total += 1
    producer.flush()
    producer.close()
    return total


@pytest.fixture(autouse=True)
def log_end_clients_closed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test's readers' log-end clients are closed when it ends, as a query's ``stop()`` closes its own: none is
    left to reconnect (and log errors) once the session's broker stops."""
    from evaluator.spark import source

    made: list[LogEndProbe] = []

    def made_here(*args: Any, **kwargs: Any) -> LogEndProbe:
        made.append(LogEndProbe(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(source, "LogEndProbe", made_here)
    yield
    for probe in made:
        probe.close()


def reader(settings: Settings, **extra: str) -> KafkaStreamReader:
    return KafkaStreamReader({"bootstrap": settings.kafka_bootstrap, "topic": settings.events_topic, **extra})


def rows(src: KafkaStreamReader, part) -> list[tuple]:
    """The records ``read`` yields for one slice (as Arrow batches), one tuple per record."""
    return [tuple(r.values()) for batch in src.read(part) for r in batch.to_pylist()]


@dataclass(frozen=True)
class Consumed:
    """One ``consume()`` call of a slice reader: records asked for, records got, seconds it took."""

    asked: int
    got: int
    seconds: float


def spy_on_consume(monkeypatch: pytest.MonkeyPatch) -> list[Consumed]:
    """Every ``consume()`` of the readers the source makes from now on (its pool emptied, so none from before)."""
    from evaluator.spark import source

    calls: list[Consumed] = []

    class Spy:
        def __init__(self, consumer) -> None:
            self.consumer = consumer

        def consume(self, num_messages: int, timeout: float) -> list:
            started = time.monotonic()
            got = self.consumer.consume(num_messages=num_messages, timeout=timeout)
            calls.append(Consumed(num_messages, len(got), time.monotonic() - started))
            return got

        def __getattr__(self, name: str):
            return getattr(self.consumer, name)

    real = source.new_reader
    monkeypatch.setattr(source, "new_reader", lambda *options: Spy(real(*options)))
    monkeypatch.setattr(source, "_CONSUMERS", source._ConsumerPool())
    return calls


def test_log_end_is_past_the_final_multi_record_batch(settings: Settings) -> None:
    ensure_topics(settings)
    produce(settings, {0: 20, 1: 9, 2: 0}, "a")
    assert topic_end_offsets(settings, settings.events_topic) == {0: 20, 1: 9, 2: 0}
    src = reader(settings)
    start = src.initialOffset()
    assert start == {"0": 0, "1": 0, "2": 0}
    end = src.latestOffset(start, ReadAllAvailable())
    assert partition_offsets(end) == {"0": 20, "1": 9, "2": 0}
    got = [row for part in src.partitions(start, end) for row in rows(src, part)]
    assert sorted((r[1], r[2]) for r in got) == sorted([(0, i) for i in range(20)] + [(1, i) for i in range(9)])
    client = src._probe._consumer  # one client asks before every batch, for the query's life
    produce(settings, {0: 3, 2: 11}, "b")
    again = src.latestOffset(end, ReadAllAvailable())
    assert partition_offsets(again) == {"0": 23, "1": 9, "2": 11} and src._probe._consumer is client
    assert pickle.loads(pickle.dumps(src))._probe is None  # tasks read with a pickled reader: a client is no state
    src.stop()  # the query ended
    assert src._probe is None


def test_a_batch_s_clock_is_chosen_with_its_offsets_and_a_replay_reads_the_same(settings: Settings,
                                                                                   cpython_gc: None) -> None:
    """The processing clock (docs/clock.md) travels in the offsets Spark checkpoints, not as ``current_timestamp()``
    in the query, whose new literal every batch made Spark compile new code every batch."""
    ensure_topics(settings)
    produce(settings, {0: 5, 1: 2}, "clock")
    src = reader(settings)
    start = src.initialOffset()
    before = time.time()
    end = src.latestOffset(start, ReadAllAvailable())
    assert before * 1000 - 1 <= end[CLOCK] <= time.time() * 1000
    first = [row for part in src.partitions(start, end) for row in rows(src, part)]
    assert len(first) == 7 and {row[-1] for row in first} == {end[CLOCK]}  # now: the last column
    assert gc.get_freeze_count() > 0  # a read ends with its worker's heap frozen (core.gc_policy)
    time.sleep(0.01)
    replayed = [row for part in src.partitions(start, end) for row in rows(src, part)]
    assert replayed == first  # a batch re-run after a failure: the same rows, the same clock
    assert src.latestOffset(end, ReadAllAvailable()) is end  # nothing new: no batch, though time moved on
    legacy = src.partitions(start, partition_offsets(end))  # offsets checkpointed before the clock was kept there
    assert all(before * 1000 <= part.clock <= time.time() * 1000 for part in legacy)


def test_a_stop_file_holds_back_new_batches_the_job_s_for_every_stream_a_stream_s_for_its_own(settings: Settings) -> None:
    """How a query is stopped between batches (``evaluator.spark.graceful``): while a stop file exists the source
    offers nothing new, so once the batch under way ends, no other starts."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    ensure_topics(settings)
    produce(settings, {0: 3}, "stop")
    trades, hosts = (KafkaStreamReader(source_options(settings, stream=name)) for name in ("trades", "hosts"))
    start = trades.initialOffset()
    stop_file(settings, "hosts").touch()  # the supervisor stops the hosts stream's query
    assert hosts.latestOffset(start, ReadAllAvailable()) is start
    assert partition_offsets(trades.latestOffset(start, ReadAllAvailable())) != partition_offsets(start)
    stop_file(settings).touch()  # the job stops
    assert trades.latestOffset(start, ReadAllAvailable()) is start
    stop_file(settings).unlink()
    stop_file(settings, "hosts").unlink()
    assert partition_offsets(hosts.latestOffset(start, ReadAllAvailable())) != partition_offsets(start)


def test_read_limit_is_respected_and_fair() -> None:
    start = {"0": 0, "1": 5, "2": 0}
    end = {"0": 100, "1": 8, "2": 50, "3": 10}
    capped = split_limit(start, end, 30)
    assert sum(capped[p] - start.get(p, 0) for p in capped) == 30
    assert all(start.get(p, 0) <= capped[p] <= end[p] for p in end)
    assert capped["1"] == 8  # the small backlog is drained, not starved
    assert split_limit(start, end, 10_000) == {**start, **end}


def test_a_backlog_drains_in_batches_of_the_cap_with_nothing_lost_or_read_twice(settings: Settings) -> None:
    """Spark's loop over the driver side: each batch is what is available up to the settings' cap."""
    ensure_topics(settings)
    total = produce(settings, {0: 130, 1: 61, 2: 9}, "backlog")
    cap = 45
    src = KafkaStreamReader(source_options(settings.model_copy(update={"source_max_records_per_trigger": cap})))
    assert src.getDefaultReadLimit() == ReadMaxRows(cap)
    start, sizes, got = src.initialOffset(), [], []
    while (end := src.latestOffset(start, src.getDefaultReadLimit())) != start:
        batch = [row for part in src.partitions(start, end) for row in rows(src, part)]
        sizes.append(len(batch))
        got += batch
        start = end
    assert sizes == [cap] * (total // cap) + [total % cap]  # full batches while a backlog lasts, then the rest
    assert sorted((r[1], r[2]) for r in got) == sorted(
        [(0, i) for i in range(130)] + [(1, i) for i in range(61)] + [(2, i) for i in range(9)])
    stats = redis.Redis.from_url(settings.redis_url).hgetall(RedisKeys(settings).evaluator_stats)
    assert int(stats[b"read_rows"]) == total and float(stats[b"read_ms_total"]) > 0  # the per-stage profile
    produce(settings, {1: 3}, "live")  # caught up: the next batch is what arrived, however small
    assert sum(p.end - p.start for p in src.partitions(start, src.latestOffset(start, src.getDefaultReadLimit()))) == 3


def test_the_default_cap_admits_a_backlog_in_large_batches() -> None:
    """Large enough that a batch's fixed cost is amortised, bounded so a long backlog never becomes one batch."""
    defaults = {name: field.default for name, field in Settings.model_fields.items()}
    cap = defaults["source_max_records_per_trigger"]
    assert cap is not None and 50_000 <= cap <= 1_000_000
    assert defaults["trigger_interval"] == "1 second"


def _read_all(spark, settings: Settings, checkpoint: str, trigger: dict, sink: str) -> StreamingQuery:
    stream = (
        spark.readStream.format("tocsin_kafka")
        .option("bootstrap", settings.kafka_bootstrap)
        .option("topic", settings.events_topic)
        .option("maxRecordsPerTrigger", "25")
        .load()
        .selectExpr("partition", "offset", "cast(value as string) as value")
    )
    query = stream.writeStream.format("parquet").option("path", sink).option("checkpointLocation", checkpoint)
    query = query.trigger(**trigger).start()
    return query


# processingTime is how the evaluator runs; availableNow (a batch job over the topic: no evaluator path uses it) in
# CI only, to keep the default suite short.
@pytest.mark.parametrize("mode", [pytest.param("availableNow", marks=pytest.mark.slow), "processingTime"])
def test_spark_reads_each_record_exactly_once_across_restarts(spark, settings: Settings, tmp_path, mode: str) -> None:
    ensure_topics(settings)
    first = produce(settings, {0: 40, 1: 23, 2: 17}, "first")
    checkpoint, sink = str(tmp_path / "checkpoint"), str(tmp_path / "sink")

    def run_until(expected: int, new: int) -> None:
        if mode == "availableNow":
            query = _read_all(spark, settings, checkpoint, {"availableNow": True}, sink)
            query.awaitTermination(120)
        else:
            query = _read_all(spark, settings, checkpoint, {"processingTime": "200 milliseconds"}, sink)
            try:
                for _ in range(600):
                    query.processAllAvailable()
                    if spark.read.parquet(sink).count() >= expected:
                        break
            finally:
                query.stop()
        assert query.exception() is None
        read = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
        assert max(read) <= 25, read  # maxRecordsPerTrigger holds, for availableNow too
        assert sum(read) == new, read  # the backlog drained in several capped batches, each record once

    run_until(first, first)
    got = spark.read.parquet(sink)
    assert got.count() == first
    assert got.select("partition", "offset").distinct().count() == first

    second = produce(settings, {0: 5, 1: 11, 2: 31}, "second")
    run_until(first + second, second)  # restart from the checkpoint
    got = spark.read.parquet(sink)
    pairs = got.select("partition", "offset").distinct().count()
    assert got.count() == first + second, "a record was read twice or lost across the restart"
    assert pairs == first + second
    assert got.filter("value like 'second-%'").count() == second


def test_latest_starting_offsets_skip_history(settings: Settings) -> None:
    ensure_topics(settings)
    produce(settings, {0: 3, 1: 2, 2: 1}, "old")
    src = reader(settings, startingOffsets="latest")
    assert src.initialOffset() == {"0": 3, "1": 2, "2": 1}
    capped = src.latestOffset(src.initialOffset(), ReadMaxRows(10))
    assert capped == {"0": 3, "1": 2, "2": 1}


def test_oversized_records_enter_spark_as_their_start_length_and_digest(settings: Settings) -> None:
    ensure_topics(settings)
    big, small = b"\x00junk\xff" * 20_000, b'{"key": "A"}'
    producer = KafkaProducer(bootstrap_servers=settings.kafka_bootstrap)
    for value in (big, small, None):
        producer.send(settings.events_topic, key=b"k", value=value, partition=0)
    producer.flush()
    producer.close()
    src = reader(settings, maxRecordBytes="1000", keepBytes="64")
    start = src.initialOffset()
    got = [row for part in src.partitions(start, src.latestOffset(start, ReadAllAvailable())) for row in rows(src, part)]
    assert [row[5:-1] for row in got] == [
        (big[:64], len(big), hashlib.sha256(big).hexdigest()), (small, len(small), None), (None, None, None)]


def test_a_pooled_consumer_reads_each_slice_exactly_and_a_broken_one_is_not_reused(settings: Settings) -> None:
    from evaluator.spark import source

    ensure_topics(settings)
    produce(settings, {0: 30}, "pool")
    src = reader(settings)

    def offsets(start: int, end: int) -> list[int]:
        return [r[2] for r in rows(src, KafkaSlice(settings.events_topic, 0, start, end, NOW_MS))]

    assert offsets(10, 30) == list(range(10, 30))
    [(_, pooled)] = source._CONSUMERS._idle[src._consumer_options()]
    assert offsets(0, 12) == list(range(12)), "seeking back on a reused consumer"
    assert offsets(12, 13) == [12]
    [(_, again)] = source._CONSUMERS._idle[src._consumer_options()]
    assert again is pooled, "the worker's consumer is reused, not rebuilt"

    abandoned = src.read(KafkaSlice(settings.events_topic, 0, 0, 30, NOW_MS))
    next(abandoned)
    abandoned.close()  # a read given up half-way: its consumer's state is unknown
    assert source._CONSUMERS._idle[src._consumer_options()] == []
    assert offsets(5, 9) == [5, 6, 7, 8]
    [(_, fresh)] = source._CONSUMERS._idle[src._consumer_options()]
    assert fresh is not pooled

    source._CONSUMERS.close()  # before a broker goes away: no consumer left to reconnect to it
    assert source._CONSUMERS._idle == {}
    with pytest.raises(RuntimeError, match="closed"):
        fresh.consume(num_messages=1, timeout=0)
    assert offsets(0, 2) == [0, 1]  # the next read makes a new one


def test_a_query_started_after_its_topic_was_created_again_reads_with_consumers_of_its_own(settings: Settings) -> None:
    """librdkafka 2.16 crashed the process (SIGSEGV) when a consumer that had read a topic was assigned it again after
    the topic was deleted and created anew (a stream deleted and declared again). Python workers outlive queries, and
    their pool handed the new query's slices the old query's consumers: each query start has pool keys of its own."""
    from evaluator.spark import source

    ensure_topics(settings)
    produce(settings, {0: 12}, "before")
    before = KafkaStreamReader(source_options(settings))
    assert len(rows(before, KafkaSlice(settings.events_topic, 0, 0, 12, NOW_MS))) == 12
    assert source._CONSUMERS._idle[before._consumer_options()], "pooled for the query's next slices"
    delete_topic(settings)
    ensure_topics(settings)
    produce(settings, {0: 5}, "after")
    after = KafkaStreamReader(source_options(settings))  # the stream's query, started again
    assert [r[5] for r in rows(after, KafkaSlice(settings.events_topic, 0, 0, 5, NOW_MS))] == [
        f"after-0-{i}".encode() for i in range(5)]
    source._CONSUMERS.close()


def test_a_slice_never_asks_librdkafka_for_more_records_than_it_holds(settings: Settings,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """consume() waits until it has the number of records asked for or its timeout: asking a 3-record slice for
    5,000 held every slice read 200 ms (a live 1,000 events/s batch spent ~1 s of its tasks reading 1,000 records)."""

    ensure_topics(settings)
    produce(settings, {0: 10}, "asked")
    calls = spy_on_consume(monkeypatch)
    assert [r[2] for r in rows(reader(settings), KafkaSlice(settings.events_topic, 0, 4, 7, NOW_MS))] == [4, 5, 6]
    asked = [call.asked for call in calls]
    assert asked and all(n <= 3 for n in asked), asked


def test_a_reused_consumer_reads_the_next_slice_of_a_backlog_without_stalling(settings: Settings,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A pooled consumer that stopped inside a backlog had prefetched past its slice; librdkafka then postponed the
    partition's next fetch by ``fetch.queue.backoff.ms`` (1 s by default), so the next slice it read waited a
    second for its first record: half the slices of a backlog drain, which ran at ~65 % of its speed."""
    from confluent_kafka import Producer

    from evaluator.spark import source

    ensure_topics(settings)
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, "linger.ms": 50})
    for i in range(150_000):  # more than librdkafka's default queue ahead (queued.min.messages: 100,000)
        producer.produce(settings.events_topic, value=b"%08d" % i, partition=0)
        if i % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0
    calls = spy_on_consume(monkeypatch)
    src = reader(settings)
    for start in (0, 20_000):
        calls.clear()
        got = [o for batch in src.read(KafkaSlice(settings.events_topic, 0, start, start + 20_000, NOW_MS))
               for o in batch.column("offset").to_pylist()]
        assert got == list(range(start, start + 20_000))
    # The second slice, on the reused consumer: the postponed fetch showed as five empty 200 ms waits (1 s); a
    # slow broker under load may cost one or two
    empty = [round(call.seconds, 3) for call in calls if call.got == 0]
    assert len(empty) <= 2, f"the reused consumer's slice waited through {len(empty)} empty fetches: {empty} s"
    for _, consumer in source._CONSUMERS._idle.pop(src._consumer_options()):
        consumer.close()


def test_a_slice_of_large_records_is_handed_to_spark_in_bounded_batches(settings: Settings,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches were bounded by records only: 50,000 records of the largest admitted size (64 KiB) would make one
    3.2 GB Arrow batch in a worker, a publisher's way to exhaust it. Now by bytes too, whichever comes first."""
    from evaluator.spark import source

    ensure_topics(settings)
    producer = KafkaProducer(bootstrap_servers=settings.kafka_bootstrap)
    for i in range(30):
        producer.send(settings.events_topic, key=b"k", value=bytes([i]) * 30_000, partition=0)
    producer.flush()
    producer.close()
    monkeypatch.setattr(source, "ARROW_BATCH_BYTES", 100_000)
    batches = list(reader(settings).read(KafkaSlice(settings.events_topic, 0, 0, 30, NOW_MS)))
    held = [sum(len(v) + len(k) for v, k in zip(b.column("value").to_pylist(), b.column("key").to_pylist(),
                                                strict=True)) for b in batches]
    assert max(held) < 100_000 + 30_001, held  # a batch ends at the record that reaches the bound
    assert len(batches) >= 8, held
    assert [o for b in batches for o in b.column("offset").to_pylist()] == list(range(30))
