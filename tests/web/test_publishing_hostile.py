"""The publishing producer's admission counts what Kafka holds: bytes, not characters (real librdkafka)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from core.settings import Settings
from devstack.patience import patient
from devstack.services import free_port
from ingest.kafka import ensure_topics
from tests.ingest.test_publisher import events_on
from tests.users import new_user
from web.publishing import StreamProducer


def test_in_flight_bytes_are_utf8_bytes_not_characters(settings: Settings) -> None:
    """A dimension of emoji is 4 bytes a character: counted as 1, the in-flight byte bound held 4x its setting."""
    settings = settings.model_copy(update={"kafka_bootstrap": f"127.0.0.1:{free_port()}",  # nobody: nothing acked
                                           "publish_delivery_timeout_ms": 1_000})
    producer = StreamProducer(settings)
    loop = asyncio.new_event_loop()
    try:
        values = ['{"key":"a","ts":1,"cpu":1,"region":"' + "\U0001f600" * 100 + '"}'] * 3
        letters = [b'{"reason":"x"}']
        delivery = producer.send(loop, loop.create_future(), "t", ["a"] * 3, values, "dead", letters)
        assert delivery is not None
        assert producer.in_flight == (4, sum(len(v.encode()) for v in values) + len(letters[0]))
        loop.run_until_complete(delivery.done)  # failed after the delivery timeout, and released
        assert (delivery.failed, delivery.dead_failed) == (3, 1) and producer.in_flight == (0, 0)
    finally:
        producer.close()
        loop.close()


# -- over a real server (uvicorn in a thread, Tansu) -------------------------------------------------------------


RECORD = {"key": "A", "ts": 1, "price": 1, "volume": 1}


@contextmanager
def _server(settings: Settings, streams: int = 1) -> Iterator[tuple[Any, str, list[dict[str, str]]]]:
    """(the app, its base URL, ``streams`` publisher tokens' headers on ``trades``) behind a real uvicorn."""
    from tests.servers import serving
    from web.app import create_app

    _, token = new_user(settings, role="operator")
    app = create_app(settings)
    with serving(app) as url, httpx.Client(base_url=url, timeout=60) as operator:
        operator.headers["Authorization"] = f"Bearer {token}"
        publishers = []
        for n in range(streams):
            created = operator.post("/api/publisher-tokens", json={"name": f"p{n}", "streams": ["trades"]})
            assert created.status_code == 201, created.text
            publishers.append({"Authorization": f"Bearer {created.json()['token']}"})
        yield app, url, publishers


def test_a_dead_letter_topic_kafka_refuses_does_not_make_stored_records_look_unstored(settings: Settings) -> None:
    """The good records were acknowledged, the rejects' dead letters were not (Kafka refused the topic): the
    request answered 503 "publish the batch again", so every retry stored the good records once more.

    (Tansu creates a missing topic on the first produce, so a merely absent dead-letter topic does not fail
    here; a Kafka with ``auto.create.topics.enable=false`` fails it as this refused one, after the metadata wait.)
    """
    settings = settings.model_copy(update={"dead_letter_topic": f"{settings.dead_letter_topic}/refused!",
                                           "publish_delivery_timeout_ms": 3_000})
    ensure_topics(settings, {settings.events_topic: settings.event_partitions})  # no dead-letter topic
    with _server(settings) as (_, url, [publisher]), httpx.Client(base_url=url, timeout=60) as client:
        answer = client.post("/api/streams/trades/events", headers=publisher,
                             json=[RECORD, {**RECORD, "price": -1}, {**RECORD, "key": "B"}])
    assert answer.status_code == 202, answer.text
    body = answer.json()
    assert body["accepted"] == 2 and [r["index"] for r in body["rejected"]] == [1]
    assert body["dead_letter_error"].startswith("1 of 1 rejects could not be dead-lettered"), body
    assert sorted(e["key"] for e in events_on(settings, settings.events_topic)) == ["A", "B"]


@pytest.fixture
def stopped_broker(settings: Settings, tmp_path: Path) -> Iterator[tuple[Settings, Any]]:
    """Settings on a Tansu of this test's own, with its topics (the test stops it: nothing is acknowledged)."""
    from devstack.services import start_tansu

    port = free_port()
    broker = start_tansu("127.0.0.1", port, tmp_path / "tansu.log")
    try:
        settings = settings.model_copy(update={"kafka_bootstrap": f"127.0.0.1:{port}", "publish_queue_max_messages": 4,
                                               "publish_token_share": 0.5, "publish_delivery_timeout_ms": 3_000,
                                               "kafka_request_timeout_ms": 2_000})
        ensure_topics(settings)
        yield settings, broker
    finally:
        broker.stop()


def _in_background(client: httpx.Client, headers: dict[str, str], records: list) -> tuple[threading.Thread, list]:
    answers: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: answers.append(
        client.post("/api/streams/trades/events", json=records, headers=headers)))
    thread.start()
    return thread, answers


def _until(predicate: Callable[[], bool], what: str, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + patient(timeout_s)
    while not predicate():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.01)


def test_one_flooding_publisher_is_refused_its_excess_and_the_others_are_admitted(
        stopped_broker: tuple[Settings, Any]) -> None:
    """Admission was per process: one token holding the in-flight budget got every other publisher a 429."""
    settings, broker = stopped_broker
    with _server(settings, streams=2) as (app, url, [flood, other]), \
            httpx.Client(base_url=url, timeout=60) as client:
        broker.stop()  # nothing is acknowledged from now on: what is admitted stays in flight
        first, first_answer = _in_background(client, flood, [RECORD, RECORD])
        _until(lambda: app.state.stream_producer is not None and app.state.stream_producer.in_flight[0] == 2,
               "the flood's first batch in flight")
        excess = client.post("/api/streams/trades/events", json=[RECORD, RECORD], headers=flood)
        assert excess.status_code == 429, excess.text  # its share (half of 4 records) is taken
        assert excess.headers["Retry-After"] == "1" and "share" in excess.json()["detail"]
        second, second_answer = _in_background(client, other, [RECORD, RECORD])
        _until(lambda: app.state.stream_producer.in_flight[0] == 4 or not second.is_alive(), "the other admitted")
        assert second.is_alive(), second_answer[0].text  # admitted and waiting for Kafka, not refused
        first.join()
        second.join()
    # The broker is down, so both admitted batches end in 503 (not acknowledged), never in a 429.
    assert [first_answer[0].status_code, second_answer[0].status_code] == [503, 503]


def test_a_flooding_publisher_cannot_queue_more_than_its_concurrent_requests(
        stopped_broker: tuple[Settings, Any]) -> None:
    """Requests of one token waiting to be judged queue ahead of everyone's: a token has a few at a time."""
    settings, broker = stopped_broker
    settings = settings.model_copy(update={"publish_token_max_requests": 2, "publish_queue_max_messages": 100,
                                           "publish_token_share": 1.0})
    with _server(settings, streams=2) as (app, url, [flood, other]), \
            httpx.Client(base_url=url, timeout=60) as client:
        broker.stop()
        held = [_in_background(client, flood, [RECORD]) for _ in range(2)]
        _until(lambda: app.state.stream_producer is not None and app.state.stream_producer.in_flight[0] == 2,
               "two of the flood's requests in flight")
        excess = client.post("/api/streams/trades/events", json=[RECORD], headers=flood)
        assert excess.status_code == 429 and "requests at a time" in excess.json()["detail"], excess.text
        third, answer = _in_background(client, other, [RECORD])
        _until(lambda: app.state.stream_producer.in_flight[0] == 3 or not third.is_alive(), "the other admitted")
        assert third.is_alive(), answer[0].text
        for thread, _ in [*held, (third, answer)]:
            thread.join()


@pytest.mark.slow  # a 64-client flood for ~30 s of two cores
def test_the_ui_answers_while_publishing_is_saturated(settings: Settings) -> None:
    """Judging batches ran on the thread pool of the UI's sync endpoints, and each publish request held a database
    connection until Kafka acknowledged its batch: a flood of 64 took the whole connection pool (5 + 10), so pages
    and publishes waited 30 s for one and failed with a 500 (QueuePool limit reached). Publishing has its own
    bounded executor now and holds a connection only while it checks the token; pages answer meanwhile."""
    settings = settings.model_copy(update={"publish_token_max_requests": 1_000, "publish_token_share": 1.0,
                                           "publish_threads": 2})
    ensure_topics(settings)
    # Every other record refused: the per-record path, the costly one (0.1-0.2 s of a core per batch).
    body = "\n".join(json.dumps({**RECORD, "key": f"K{i % 100}", "price": i if i % 2 else -1})
                     for i in range(10_000)).encode()
    stop = threading.Event()
    published: list[int] = []

    def flood(url: str, headers: dict[str, str]) -> None:
        with httpx.Client(base_url=url, timeout=120) as client:
            while not stop.is_set():
                answer = client.post("/api/streams/trades/events", content=body,
                                     headers={**headers, "Content-Type": "application/x-ndjson"})
                published.append(answer.status_code)

    _, token = new_user(settings)
    with _server(settings) as (_, url, [publisher]), httpx.Client(base_url=url, timeout=120) as ui:
        ui.headers["Authorization"] = f"Bearer {token}"
        threads = [threading.Thread(target=flood, args=(url, publisher)) for _ in range(64)]
        for thread in threads:
            thread.start()
        try:
            _until(lambda: len(published) >= 64, "the flood to be under way", timeout_s=120)
            where = _publishing_threads(samples=100)
            waits = []
            for page in ["/login", "/api/subscriptions", "/api/endpoints"] * 2:  # sync; the last two read the database
                started = time.monotonic()
                assert ui.get(page).status_code == 200
                waits.append(time.monotonic() - started)
        finally:
            stop.set()
            for thread in threads:
                thread.join()
    assert published.count(202) >= 64 and set(published) <= {202, 429}  # published, or refused under backpressure
    print(f"UI waits under the flood: {[round(w, 3) for w in waits]} s; {len(published)} batches published; "
          f"threads seen publishing: {where}")
    assert where["shared pool"] == 0 and where["publishing executor"] > 0, where
    assert max(waits) < 2.0, waits


PUBLISHING_WORK = frozenset({"_judge", "_check_publisher", "send", "_publisher_stream"})


def _publishing_threads(samples: int) -> dict[str, int]:
    """How often a thread was seen judging, checking a token or producing: on the publishing executor's threads,
    or on others (the pool of sync endpoints, where the UI's pages run)."""
    import sys

    names = {}
    seen = {"publishing executor": 0, "shared pool": 0}
    for _ in range(samples):
        names.update({t.ident: t.name for t in threading.enumerate()})
        for ident, frame in sys._current_frames().items():  # the stacks of the server's threads
            stack = []
            while frame is not None:  # the server's code only (the flood's clients call httpx's ``send``)
                if frame.f_code.co_filename.endswith(("web/api/streams.py", "web/publishing.py")):
                    stack.append(frame.f_code.co_name)
                frame = frame.f_back
            if PUBLISHING_WORK.intersection(stack):
                seen["publishing executor" if names.get(ident, "").startswith("publish") else "shared pool"] += 1
        time.sleep(0.02)
    return seen


def test_a_redis_that_does_not_answer_leaves_the_series_limit_to_the_evaluator(settings: Settings) -> None:
    """Publishing must not stop with Redis: the batch is judged without the series check (the evaluator's parser
    holds the limit alone), within the request's short Redis timeout."""
    from core.redis_client import make_redis
    from core.series_limit import SeriesLimit
    from core.streams import RecordLimits, StreamValidator, trades_schema
    from web.publishing import within_series_limit

    nobody = settings.model_copy(update={"redis_url": f"redis://127.0.0.1:{free_port()}/0", "stream_max_series": 1})
    limit = SeriesLimit(make_redis(nobody, socket_timeout=0.5, socket_connect_timeout=0.5), nobody)
    records = [json.dumps({**RECORD, "key": k}) for k in ("A", "B", "C")]
    schema = trades_schema(settings)
    batch = StreamValidator(schema, RecordLimits.of(settings)).validate(records)
    assert within_series_limit(batch, records, schema, limit) is batch
    assert batch.accepted == 3
