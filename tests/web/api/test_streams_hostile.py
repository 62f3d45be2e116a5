"""Hostile publishing (real web app, Tansu, the database): what a 202 promises must hold for the evaluator too."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from fastapi.testclient import TestClient

from core.settings import Settings
from ingest.kafka import ensure_topics
from tests.ingest.test_publisher import events_on, read_topic
from tests.users import api_client, new_user
from tests.web.api.test_streams import HOSTS, _publish, _token, limited, own_broker, stalled_producer  # noqa: F401 - fixtures


@pytest.fixture
def publisher(settings: Settings) -> Iterator[TestClient]:
    """A publisher token's client on ``trades`` (its tests are marked database_plays_no_part)."""
    ensure_topics(settings)
    _, token = new_user(settings, role="operator")
    with api_client(settings, token) as operator, api_client(settings, _token(operator, "trades")) as client:
        yield client


@pytest.mark.database_plays_no_part
def test_a_record_ahead_of_the_clock_is_refused_not_accepted_then_dropped(publisher: TestClient,
                                                                         settings: Settings) -> None:
    """The evaluator dead-letters events more than max_future_skew_ms ahead: a 202 must not count them accepted."""
    now = int(time.time() * 1000)
    ok = {"key": "A", "ts": now, "price": 1, "volume": 1}
    ahead = {**ok, "key": "B", "ts": now + settings.max_future_skew_ms + 3_600_000}
    far = {**ok, "key": "C", "ts": 253_402_300_799_999}
    escaped = '{"key": "\\u0044", "ts": ' + str(far["ts"]) + ', "price": 1, "volume": 1}'  # the per-record path
    answer = _publish(publisher, "trades", [ok, ahead, far, escaped], ndjson=True)
    assert answer.status_code == 202, answer.text
    body = answer.json()
    assert body["accepted"] == 1, body
    assert [r["index"] for r in body["rejected"]] == [1, 2, 3]
    assert all(r["reason"].startswith("ts: ") and "ahead of the server's clock" in r["reason"]
               for r in body["rejected"]), body
    assert [e["key"] for e in events_on(settings, settings.events_topic)] == ["A"]


@pytest.mark.database_plays_no_part
def test_a_full_producer_refuses_before_judging_the_batch(own_broker: tuple[Settings, object]) -> None:  # noqa: F811
    """Backpressure must relieve the process: a request it will refuse costs no parsing or validation.

    (Judging 10,000 records takes a CPU core 0.2-0.5 s; while Kafka is away every retry paid it for its 429.)
    A broken body tells the order: refused (429) before it is parsed (422).
    """
    with stalled_producer(own_broker) as stalled:  # the first batch fills the producer
        broken = stalled.client.post("/api/streams/trades/events", content=b"[" + b"1," * 1_000 + b"nope]",
                                     headers={**stalled.publisher, "Content-Type": "application/json"})
        assert broken.status_code == 429, broken.text
        assert broken.headers["Retry-After"] == "1"
        stalled.waiting.join()
        assert stalled.first[0].status_code == 503


def test_an_array_over_the_record_limit_is_refused_without_parsing_it_all(
        limited: tuple[TestClient, TestClient]) -> None:  # noqa: F811
    """A 1 MiB array of 500,000 tiny elements took half a core-second to split before its 413: stop at the limit.

    A broken element past the limit tells the order: 413 at the limit, before the parser reaches it (422).
    """
    _, publisher = limited
    answer = publisher.post("/api/streams/trades/events", content=b"[" + b"1," * 5 + b"nope]",
                            headers={"Content-Type": "application/json"})
    assert answer.status_code == 413, answer.text
    assert "at most 3 per request" in answer.json()["detail"]


@pytest.mark.database_plays_no_part
def test_a_lone_surrogate_in_a_repeated_field_name_costs_that_record_only(publisher: TestClient,
                                                                         settings: Settings) -> None:
    """The reason names the field; a field name that is a lone surrogate (``"\\udc00"``) made the reason
    unencodable, so building its dead letter raised and the whole batch got a 500."""
    ok = {"key": "A", "ts": 1, "price": 1, "volume": 1}
    answer = _publish(publisher, "trades", [ok, '{"\\udc00": 1, "\\udc00": 2}'], ndjson=True)
    assert answer.status_code == 202, answer.text
    assert answer.json() == {"accepted": 1, "rejected": [{"index": 1,
                                                          "reason": "\\udc00: field given more than once"}]}
    [letter] = [json.loads(v) for v in read_topic(settings, settings.dead_letter_topic)]
    assert letter["reason"] == "\\udc00: field given more than once"
    long = "f" * 5_000  # the reason quotes the name: cut like every other reason
    [refused] = _publish(publisher, "trades", [f'{{"{long}": 1, "{long}": 2}}'], ndjson=True).json()["rejected"]
    assert refused["reason"].startswith("fff") and len(refused["reason"]) <= 1_000


# -- slow and unauthenticated bodies, against a real uvicorn -----------------------------------------------------


def _raw(url: str, head: bytes, body: bytes = b"", wait_s: float = 10.0) -> tuple[bytes, float]:
    """Send ``head`` and ``body`` on a raw connection and stall; (the answer's first bytes, seconds until it came)."""
    import socket

    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=wait_s) as conn:
        started = time.monotonic()
        conn.sendall(head + body)
        try:
            answer = conn.recv(65536)
        except TimeoutError:
            answer = b""
        return answer, time.monotonic() - started


def _head(token: str, length: int) -> bytes:
    return (f"POST /api/streams/trades/events HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n").encode()


def test_a_bad_token_is_refused_before_the_body_is_read(settings: Settings) -> None:
    """The body-size middleware read (and held) up to 1 MiB of every body before any route looked at the token:
    an unknown token had its 900 KB buffered, and one that never sent its body held the connection for good."""
    from tests.web.test_publishing_hostile import _server

    ensure_topics(settings)
    with _server(settings) as (_, url, _publishers):
        answer, took = _raw(url, _head("tcp_not-a-token", 900_000))  # the headers only: no body ever comes
        assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
        assert took < 5, took
        answer, _ = _raw(url, _head("tcp_not-a-token", 900_000), b"[" * 1_000)
        assert answer.startswith(b"HTTP/1.1 401"), answer[:200]


@pytest.mark.database_plays_no_part
def test_a_body_slower_than_the_body_timeout_gets_a_408_and_the_connection_closed(settings: Settings) -> None:
    """No bound on how long a body could take: a slow-loris client held connections and buffers without end."""
    import socket

    from tests.web.test_publishing_hostile import RECORD, _server

    settings = settings.model_copy(update={"request_body_timeout_s": 1.0, "publish_token_max_requests": 50})
    ensure_topics(settings)
    with _server(settings) as (_, url, [publisher]):
        token = publisher["Authorization"].removeprefix("Bearer ")
        host, port = url.removeprefix("http://").split(":")
        loris = [socket.create_connection((host, int(port)), timeout=10) for _ in range(20)]
        try:
            for conn in loris:
                conn.sendall(_head(token, 1_000) + b"[")  # 1 byte of 1,000, then nothing
            started = time.monotonic()
            answers = [conn.recv(65536) for conn in loris]
            took = time.monotonic() - started
            assert all(a.startswith(b"HTTP/1.1 408") for a in answers), {a[:100] for a in answers}
            assert took < 6, took
            for conn in loris:  # closed by the server once the answer is out (the rest of the body is never read)
                while conn.recv(65536):
                    pass
        finally:
            for conn in loris:
                conn.close()
        # The whole body counts, not each piece: trickling a byte at a time is cut off at the bound too.
        with socket.create_connection((host, int(port)), timeout=10) as conn:
            conn.sendall(_head(token, 1_000))
            started = time.monotonic()
            for _ in range(40):
                try:
                    conn.sendall(b" ")
                except OSError:
                    break
                time.sleep(0.1)
            assert conn.recv(65536).startswith(b"HTTP/1.1 408")
            assert time.monotonic() - started < 5
        with httpx.Client(base_url=url, timeout=30) as client:  # a body in time is served as before
            answer = client.post("/api/streams/trades/events", json=[RECORD], headers=publisher)
            assert answer.status_code == 202, answer.text


@contextmanager
def hosts_declared(settings: Settings, **limits: float) -> Iterator[tuple[Settings, TestClient]]:
    """Settings with ``limits`` and the ``hosts`` stream declared, and an operator's client (its tests are marked
    database_plays_no_part)."""
    settings = settings.model_copy(update={**limits, "stream_topic_prefix": f"{settings.events_topic}.stream."})
    ensure_topics(settings)
    _, token = new_user(settings, role="operator")
    with api_client(settings, token) as operator:
        assert operator.post("/api/streams", json=HOSTS).status_code == 201
        yield settings, operator


@pytest.mark.database_plays_no_part
def test_a_new_dimension_value_with_every_record_is_refused_beyond_the_series_limit(
        settings: Settings) -> None:
    """A publisher naming a new region with every record (a cell per event, core.series_limit): beyond
    stream_max_series the records of new series are rejects with the reason, not accepted and dead-lettered later
    by the evaluator; records of series already admitted go on being accepted."""
    with hosts_declared(settings, stream_max_series=3, publish_token_series_share=1.0) as (
            settings, operator), api_client(settings, _token(operator, "hosts")) as publisher:
        regular = {"host": "web-1", "time": "2026-11-26T10:00:00Z", "cpu": 40, "region": "eu"}
        assert _publish(publisher, "hosts", [regular]).json() == {"accepted": 1, "rejected": []}
        hostile = [{**regular, "cpu": 99, "region": f"r{i}"} for i in range(10)]
        body = _publish(publisher, "hosts", [*hostile, regular], ndjson=True).json()
        assert body["accepted"] == 3, "the regular series and the two new ones the limit has room for"
        assert [r["index"] for r in body["rejected"]] == list(range(2, 10))
        assert all(r["reason"].startswith("series: a new series (key 'web-1', dimensions {'region': 'r")
                   and "TOCSIN_STREAM_MAX_SERIES" in r["reason"] for r in body["rejected"]), body
        assert _publish(publisher, "hosts", [regular, hostile[0]]).json() == {"accepted": 2, "rejected": []}
    on_topic = events_on(settings, f"{settings.stream_topic_prefix}hosts")
    assert sorted(e["region"] for e in on_topic) == ["eu", "eu", "eu", "r0", "r0", "r1"]
    dead = [json.loads(v) for v in read_topic(settings, settings.dead_letter_topic)]
    assert sorted(d["source"] for d in dead) == sorted(f"stream hosts: HTTP record {i}" for i in range(2, 10))


@pytest.mark.database_plays_no_part
def test_a_flooding_publisher_token_fills_its_share_and_the_other_collectors_go_on(
        settings: Settings) -> None:
    """Two collectors share ``hosts``; one goes wild and names a new region with every record. It keeps at most
    publish_token_series_share of the stream's series (its records beyond are rejects with the reason), so the
    other collector's new hosts are still accepted; before, the flood filled the stream's limit and the other
    collector's new series were refused for as long as the flood kept them active."""
    with hosts_declared(settings, stream_max_series=6, publish_token_series_share=0.5) as (
            settings, operator):
        wild, calm = _token(operator, "hosts"), _token(operator, "hosts")
        with api_client(settings, wild) as flooding, api_client(settings, calm) as collector:
            flood = [{"host": "web-1", "time": "2026-11-26T10:00:00Z", "cpu": 99, "region": f"r{i}"} for i in range(10)]
            body = _publish(flooding, "hosts", flood, ndjson=True).json()
            assert body["accepted"] == 3, body
            assert [r["index"] for r in body["rejected"]] == list(range(3, 10))
            assert all("new to this publisher token beyond the 3 active series one token may have in stream 'hosts'"
                       in r["reason"] and "TOCSIN_PUBLISH_TOKEN_SERIES_SHARE" in r["reason"]
                       for r in body["rejected"]), body
            calm_hosts = [{"host": f"db-{i}", "time": "2026-11-26T10:00:01Z", "cpu": 20, "region": "eu"}
                          for i in range(3)]
            assert _publish(collector, "hosts", calm_hosts).json() == {"accepted": 3, "rejected": []}
            assert _publish(flooding, "hosts", flood[:3]).json() == {"accepted": 3, "rejected": []}, "its own go on"
            late = {"host": "db-9", "time": "2026-11-26T10:00:02Z", "cpu": 20, "region": "eu"}
            refused = _publish(collector, "hosts", [late]).json()["rejected"]
            assert len(refused) == 1 and "TOCSIN_STREAM_MAX_SERIES" in refused[0]["reason"], "the stream is full"
    on_topic = events_on(settings, f"{settings.stream_topic_prefix}hosts")
    assert sorted(e["key"] for e in on_topic) == ["db-0", "db-1", "db-2", *["web-1"] * 6]
