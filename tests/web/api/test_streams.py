"""Streams over the API: operators declare them, publisher tokens publish to them, records land on their topics.

Real components throughout: the web app, Tansu, the database (SQLite and PostgreSQL).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi.testclient import TestClient

from core.settings import Settings
from devstack.patience import patient
from ingest.kafka import ensure_topics, topic_end_offsets
from tests.ingest.test_publisher import events_on, read_topic
from tests.users import api_client, new_user

HOSTS = {"name": "hosts", "key_field": "host", "time_field": "time", "time_format": "iso8601",
         "attributes": [{"name": "cpu", "unit": "%", "min": 0, "max": 100}, {"name": "mem", "unit": "bytes", "required": False}],
         "dimensions": [{"name": "region"}], "partitions": 2}


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """Stream topics of this test's own (the broker is shared by the test session)."""
    return settings.model_copy(update={"stream_topic_prefix": f"{settings.events_topic}.stream."})


@pytest.fixture
def operator(settings: Settings) -> Iterator[TestClient]:
    ensure_topics(settings)  # the trades stream's topic (and the dead-letter topic), as the local runner makes them
    _, token = new_user(settings, role="operator")
    with api_client(settings, token) as client:
        yield client


def _publisher(settings: Settings, token: str) -> TestClient:
    client = api_client(settings, token)
    return client


def _token(operator: TestClient, *streams: str) -> str:
    response = operator.post("/api/publisher-tokens", json={"name": "collector", "streams": list(streams)})
    assert response.status_code == 201, response.text
    assert response.json()["streams"] == list(streams)
    return response.json()["token"]


def _ndjson(records: list[dict | str]) -> bytes:
    return "\n".join(r if isinstance(r, str) else json.dumps(r) for r in records).encode()


def _publish(client: TestClient, stream: str, records: list, ndjson: bool = False):
    if ndjson:
        return client.post(f"/api/streams/{stream}/events", content=_ndjson(records),
                           headers={"Content-Type": "application/x-ndjson"})
    return client.post(f"/api/streams/{stream}/events", json=records)


def test_two_streams_with_different_schemas_published_and_read_back(operator: TestClient, settings: Settings) -> None:
    created = operator.post("/api/streams", json=HOSTS)
    assert created.status_code == 201, created.text
    hosts = created.json()
    assert hosts["topic"] == f"{settings.stream_topic_prefix}hosts" and hosts["version"] == 1
    assert hosts["schema"]["retention_ms"] == settings.stream_default_retention_ms
    assert sorted(topic_end_offsets(settings, hosts["topic"])) == [0, 1]  # the topic, with its partitions
    assert [s["name"] for s in operator.get("/api/streams").json()] == ["hosts", "trades"]
    trades = operator.get("/api/streams/trades").json()
    assert trades["topic"] == settings.events_topic
    assert [a["name"] for a in trades["schema"]["attributes"]] == ["price", "volume"]
    assert operator.get("/api/streams/nope").status_code == 404

    with _publisher(settings, _token(operator, "trades", "hosts")) as publisher:
        trade = {"key": "AAPL", "ts": 1_700_000_000_000, "price": 190.5, "volume": 100}
        host = {"host": "web-1", "time": "2026-01-02T09:30:00.250+01:00", "cpu": 42.5, "mem": 1e9, "region": "eu"}
        answer = _publish(publisher, "trades", [trade, {**trade, "key": "MSFT", "price": 410}])
        assert answer.status_code == 202, answer.text
        assert answer.json() == {"accepted": 2, "rejected": []}
        answer = _publish(publisher, "hosts", [host, {"host": "db-1", "time": "2026-01-02T08:00:00Z", "cpu": 7}],
                          ndjson=True)
        assert answer.json() == {"accepted": 2, "rejected": []}
        # Valid for trades, not for hosts: rejected with the reason and dead-lettered; the rest of the batch stays.
        answer = _publish(publisher, "hosts", [trade, host], ndjson=True)
        assert answer.status_code == 202
        [rejected] = answer.json()["rejected"]
        assert answer.json()["accepted"] == 1 and rejected["index"] == 0
        assert "host: Field required" in rejected["reason"] and "key: Extra inputs are not permitted" in \
            rejected["reason"]
        answer = _publish(publisher, "trades", [host])
        assert answer.json()["accepted"] == 0 and "key: Field required" in answer.json()["rejected"][0]["reason"]

    on_trades = sorted(events_on(settings, settings.events_topic), key=lambda e: e["key"])
    assert on_trades == [trade, {**trade, "key": "MSFT", "price": 410}]  # the wire form is the Event's
    on_hosts = sorted(events_on(settings, hosts["topic"]), key=lambda e: e["key"])
    assert on_hosts == [
        {"key": "db-1", "ts": 1_767_340_800_000, "cpu": 7, "mem": None, "region": None},
        {"key": "web-1", "ts": 1_767_342_600_250, "cpu": 42.5, "mem": 1e9, "region": "eu"},
        {"key": "web-1", "ts": 1_767_342_600_250, "cpu": 42.5, "mem": 1e9, "region": "eu"},
    ]
    dead = [json.loads(v) for v in read_topic(settings, settings.dead_letter_topic)]
    assert sorted(d["source"] for d in dead) == ["stream hosts: HTTP record 0", "stream trades: HTTP record 0"]
    letter = next(d for d in dead if d["source"].startswith("stream hosts"))
    assert "host: Field required" in letter["reason"] and json.loads(letter["raw"]) == trade


def test_http_publishing_moves_every_partition_of_the_stream_by_heartbeats(operator: TestClient,
                                                                          settings: Settings) -> None:
    """One key lands on one partition; the others' clocks would never move and no window of the stream would
    close. After each stored batch every partition gets a heartbeat at the batch's newest time, paced to one
    round per TOCSIN_PUBLISH_HEARTBEAT_MS, and the newest time a paced round held back still goes out."""
    created = operator.post("/api/streams", json={**HOSTS, "name": "paced", "partitions": 3})
    assert created.status_code == 201, created.text
    topic = created.json()["topic"]
    record = {"host": "web-1", "time": "2026-01-02T09:30:00Z", "cpu": 1}
    with _publisher(settings, _token(operator, "paced")) as publisher:
        assert _publish(publisher, "paced", [record, {**record, "time": "2026-01-02T09:30:02Z"}]).status_code == 202
        assert _publish(publisher, "paced", [{**record, "time": "2026-01-02T09:30:05Z"}]).status_code == 202
        first, last = 1_767_346_202_000, 1_767_346_205_000

        def beats() -> dict[int, list[int]]:
            found: dict[int, list[int]] = {}
            for value in read_topic(settings, topic):
                beat = json.loads(value)
                if beat.get("kind") == "heartbeat":
                    found.setdefault(beat["partition"], []).append(beat["ts"])
            return found

        deadline = time.monotonic() + patient(10)
        while beats() != {p: [first, last] for p in range(3)} and time.monotonic() < deadline:
            time.sleep(0.2)
        # each partition: the first batch's newest time at once, the second's (paced) after the interval
        assert beats() == {p: [first, last] for p in range(3)}
    assert [e["ts"] for e in events_on(settings, topic)] == [1_767_346_200_000, first, last]


def test_a_publisher_token_publishes_to_its_streams_only_and_reads_nothing(operator: TestClient,
                                                                           settings: Settings) -> None:
    assert operator.post("/api/streams", json=HOSTS).status_code == 201
    token = _token(operator, "hosts")
    record = {"host": "h", "time": "2026-01-02T09:30:00Z", "cpu": 1, "mem": 2, "region": "r"}
    with _publisher(settings, token) as publisher:
        assert _publish(publisher, "hosts", [record]).json()["accepted"] == 1
        refused = _publish(publisher, "trades", [{"key": "A", "ts": 1, "price": 1, "volume": 1}])
        assert refused.status_code == 403 and "'trades'" in refused.json()["detail"]
        for path in ("/api/streams", "/api/streams/hosts", "/api/subscriptions", "/api/endpoints",
                     "/api/publisher-tokens", "/api/auth/me", "/api/dead-letters"):
            answer = publisher.get(path)
            assert answer.status_code == 401, (path, answer.text)
            assert "publisher token may only publish" in answer.json()["detail"]
        assert publisher.post("/api/streams", json={**HOSTS, "name": "other"}).status_code == 401
    _, user_token = new_user(settings)
    with api_client(settings, user_token) as user:  # an API token is not a publisher token
        assert _publish(user, "hosts", [record]).status_code == 403
        assert user.get("/api/streams").status_code == 403  # operators only
        assert user.post("/api/publisher-tokens", json={"name": "x", "streams": ["hosts"]}).status_code == 403
    with api_client(settings) as anonymous:
        assert _publish(anonymous, "hosts", [record]).status_code == 401
    with _publisher(settings, "tcp_not-a-token") as forged:
        assert _publish(forged, "hosts", [record]).status_code == 401
    [row] = operator.get("/api/publisher-tokens").json()
    assert row["prefix"] == token[:10] and row["last_used_at"] is not None and "token" not in row
    assert operator.delete(f"/api/publisher-tokens/{row['id']}").status_code == 204
    with _publisher(settings, token) as revoked:
        assert _publish(revoked, "hosts", [record]).status_code == 401


def test_schema_evolution_add_live_and_refuse_removing_a_used_attribute(operator: TestClient,
                                                                        settings: Settings) -> None:
    assert operator.post("/api/streams", json=HOSTS).status_code == 201
    assert operator.post("/api/streams", json=HOSTS).status_code == 409
    subscription = operator.post("/api/subscriptions", json={"name": "hot", "stream": "hosts",
                                                             "condition": "AVG(cpu) OVER 1m > 90"})
    assert subscription.status_code == 201, subscription.text
    sid = subscription.json()["id"]
    hosts = operator.get("/api/streams/hosts").json()["schema"]
    record = {"host": "web-1", "time": "2026-01-02T09:30:00Z", "cpu": 5}
    with _publisher(settings, _token(operator, "hosts")) as publisher:
        with_disk = {**record, "disk": 2.5}
        assert "disk: Extra inputs are not permitted" in _publish(publisher, "hosts", [with_disk]).json()[
            "rejected"][0]["reason"]

        added = operator.put("/api/streams/hosts", json={
            **hosts, "attributes": [*hosts["attributes"], {"name": "disk", "unit": "%", "required": False}]})
        assert added.status_code == 200, added.text
        assert added.json()["version"] == 2
        # The change applies to the next request: the new attribute is accepted, older producers still are.
        assert _publish(publisher, "hosts", [with_disk, record]).json() == {"accepted": 2, "rejected": []}

    required = operator.put("/api/streams/hosts", json={
        **hosts, "attributes": [*hosts["attributes"], {"name": "bid", "required": True}]})
    assert required.status_code == 409 and "must be optional" in required.json()["detail"]
    removed = operator.put("/api/streams/hosts", json={**hosts, "attributes": hosts["attributes"][1:]})
    assert removed.status_code == 409
    assert removed.json()["subscriptions"] == [f"#{sid} hot"]
    assert "cpu" in removed.json()["detail"]
    altered = operator.put("/api/streams/hosts", json={
        **hosts, "attributes": [{"name": "cpu", "min": 10}, hosts["attributes"][1]]})
    assert altered.status_code == 409 and altered.json()["subscriptions"] == [f"#{sid} hot"]
    unused = operator.put("/api/streams/hosts", json={  # mem is used by no subscription
        **hosts, "attributes": [hosts["attributes"][0], {"name": "mem", "unit": "GB", "required": False}]})
    assert unused.status_code == 200 and unused.json()["version"] == 3
    moved = operator.put("/api/streams/hosts", json={**hosts, "key_field": "name"})
    assert moved.status_code == 409 and "key_field cannot change" in moved.json()["detail"]
    kept = operator.put("/api/streams/hosts", json={  # what the body leaves out stays as declared
        "name": "hosts", "attributes": [*hosts["attributes"], {"name": "load", "required": False}]})
    assert kept.status_code == 200, kept.text
    assert kept.json()["schema"]["key_field"] == "host" and kept.json()["schema"]["partitions"] == 2
    assert kept.json()["schema"]["dimensions"] == [{"name": "region", "max_length": 256, "required": False}]
    assert operator.put("/api/streams/hosts", json={**HOSTS, "name": "other"}).status_code == 409
    assert operator.delete("/api/streams/hosts").status_code == 409  # the subscription uses it
    assert operator.delete(f"/api/subscriptions/{sid}").status_code == 204
    assert operator.delete("/api/streams/hosts").status_code == 204
    assert operator.get("/api/streams/hosts").status_code == 404

    # trades is the evaluator's built-in path: its schema is fixed, and it cannot be deleted
    trades = operator.get("/api/streams/trades").json()["schema"]
    for attributes in ([*trades["attributes"], {"name": "vwap", "required": False}], trades["attributes"][:1]):
        refused = operator.put("/api/streams/trades", json={**trades, "attributes": attributes})
        assert refused.status_code == 409 and "schema is fixed" in refused.json()["detail"]
    assert operator.put("/api/streams/trades", json=trades).status_code == 200  # the same schema: no change
    assert operator.delete("/api/streams/trades").status_code == 409


def test_declarations_are_validated_field_by_field(operator: TestClient) -> None:
    for body, message in (
        ({**HOSTS, "name": "Bad Name"}, "String should match pattern"),
        ({**HOSTS, "attributes": []}, "at least 1 item"),
        ({**HOSTS, "attributes": [{"name": "cpu", "min": 5, "max": 1}]}, "min 5 is above max 1"),
        ({**HOSTS, "attributes": [{"name": "cpu", "colour": "red"}]}, "Extra inputs are not permitted"),
        ({**HOSTS, "dimensions": [{"name": "cpu"}]}, "cpu given more than once"),
        ({**HOSTS, "attributes": [{"name": "key"}]}, "may not use them"),
        ({**HOSTS, "time_format": "rfc822"}, "Input should be 'epoch_ms' or 'iso8601'"),
        ({**HOSTS, "partitions": 0}, "greater than or equal to 1"),
    ):
        answer = operator.post("/api/streams", json=body)
        assert answer.status_code == 422, (body, answer.text)
        assert message in json.dumps(answer.json()), (message, answer.text)


@pytest.fixture
def limited(settings: Settings) -> Iterator[tuple[TestClient, TestClient]]:
    """(operator, publisher on trades) with a three-record limit and a small body limit."""
    settings = settings.model_copy(update={"publish_max_records": 3, "request_max_bytes": 2_048})
    ensure_topics(settings)
    _, token = new_user(settings, role="operator")
    with api_client(settings, token) as operator, _publisher(settings, _token(operator, "trades")) as publisher:
        yield operator, publisher


def test_request_limits_and_malformed_batches(limited: tuple[TestClient, TestClient]) -> None:
    _, publisher = limited
    record = {"key": "A", "ts": 1, "price": 1, "volume": 1}
    assert _publish(publisher, "trades", [record] * 3, ndjson=True).json()["accepted"] == 3
    too_many = _publish(publisher, "trades", [record] * 4)
    assert too_many.status_code == 413 and "at most 3 per request" in too_many.json()["detail"]
    assert _publish(publisher, "trades", [json.dumps(record) + " " * 3_000]).status_code == 413  # body limit
    answer = publisher.post("/api/streams/trades/events", content=b'[{"key":"A"}, nope]',
                            headers={"Content-Type": "application/json"})
    assert answer.status_code == 422 and "record 1: not JSON" in answer.json()["detail"]
    answer = publisher.post("/api/streams/trades/events", json=record)
    assert answer.status_code == 422 and "expected a JSON array" in answer.json()["detail"]
    answer = publisher.post("/api/streams/trades/events", content=b"key,ts\n", headers={"Content-Type": "text/csv"})
    assert answer.status_code == 415
    # NDJSON lines are judged one by one: a line that is not JSON costs that line only.
    answer = _publish(publisher, "trades", [record, "not json", ""], ndjson=True)
    assert answer.json() == {"accepted": 1, "rejected": [{"index": 1, "reason": "not JSON: Expecting value at "
                                                                               "position 0"}]}
    assert _publish(publisher, "trades", [], ndjson=True).json() == {"accepted": 0, "rejected": []}
    assert _publish(publisher, "trades", []).json() == {"accepted": 0, "rejected": []}


@pytest.fixture
def own_broker(settings: Settings, tmp_path) -> Iterator[tuple[Settings, object]]:
    """Settings on a Tansu broker of this test's own (the test stops it), with a tiny producer queue."""
    from devstack.services import free_port, start_tansu

    port = free_port()
    broker = start_tansu("127.0.0.1", port, tmp_path / "tansu.log")
    try:
        yield settings.model_copy(update={"kafka_bootstrap": f"127.0.0.1:{port}", "publish_queue_max_messages": 2,
                                          "publish_delivery_timeout_ms": 2_000, "kafka_request_timeout_ms": 2_000}), \
            broker
    finally:
        broker.stop()


@dataclass
class Stalled:
    """A live web app whose Kafka stopped with a batch of two records in flight, unacknowledged."""

    client: Any  # httpx.Client, signed in as an operator
    publisher: dict[str, str]  # the publisher token's header
    producer: Any  # the app's StreamProducer
    waiting: threading.Thread  # the request holding the batch (answers 503 once the delivery timeout passes)
    first: list  # its response, once it answered


RECORD = {"key": "A", "ts": 1, "price": 1, "volume": 1}


@contextmanager
def stalled_producer(own_broker: tuple[Settings, object], publish_first: bool = False) -> Iterator[Stalled]:
    """Serve the app on ``own_broker``, stop the broker (after one acknowledged batch if ``publish_first``) and
    send a batch of two that stays in flight: the state backpressure is about."""
    import httpx

    from tests.servers import serving
    from web.app import create_app

    settings, broker = own_broker
    ensure_topics(settings)
    _, token = new_user(settings, role="operator")
    app = create_app(settings)
    with serving(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        client.headers["Authorization"] = f"Bearer {token}"
        created = client.post("/api/publisher-tokens", json={"name": "p", "streams": ["trades"]})
        publisher = {"Authorization": f"Bearer {created.json()['token']}"}
        if publish_first:
            assert client.post("/api/streams/trades/events", json=[RECORD], headers=publisher).status_code == 202
        broker.stop()  # type: ignore[attr-defined]  # nothing is acknowledged from now on
        first: list[httpx.Response] = []
        waiting = threading.Thread(target=lambda: first.append(
            client.post("/api/streams/trades/events", json=[RECORD, RECORD], headers=publisher)))
        waiting.start()
        producer = None
        while producer is None or producer.in_flight[0] == 0:  # the batch is in flight, unacknowledged
            producer = app.state.stream_producer
            waiting.join(0.01)
            assert waiting.is_alive(), first[0].text
        yield Stalled(client, publisher, producer, waiting, first)


@pytest.mark.database_plays_no_part
def test_backpressure_answers_429_with_retry_after(own_broker: tuple[Settings, object]) -> None:
    with stalled_producer(own_broker, publish_first=True) as stalled:
        client, publisher, producer, waiting, first = (stalled.client, stalled.publisher, stalled.producer,
                                                       stalled.waiting, stalled.first)
        busy = client.post("/api/streams/trades/events", json=[RECORD], headers=publisher)
        assert busy.status_code == 429 and busy.headers["Retry-After"] == "1"
        assert "retry after 1 s" in busy.json()["detail"]
        waiting.join()
        [late] = first
        assert late.status_code == 503 and late.headers["Retry-After"] == "1"  # not acknowledged within the timeout
        assert "did not acknowledge 2 of 2 records" in late.json()["detail"]
        assert producer.in_flight == (0, 0)  # released: the next batch is admitted again
        down = client.post("/api/streams", json=HOSTS)  # no topic, no stream
        assert down.status_code == 503 and "Kafka" in down.json()["detail"]
        assert client.get("/api/streams/hosts").status_code == 404
