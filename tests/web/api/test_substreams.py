"""Subscriptions name a stream (issue 15 item 3): conditions over its attributes, filtered by its dimensions and keys.

Real components: the web app, Tansu (the stream's topic), Redis (the catalog log) and the database (SQLite and
PostgreSQL, tests/web/api/conftest.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from fastapi.testclient import TestClient

from core.catalog_log import CatalogLog
from core.redis_schema import RedisKeys
from core.settings import Settings
from evaluator.catalog import CatalogChange
from evaluator.spec import Condition, SubscriptionSpec
from ingest.kafka import ensure_topics
from subscriptions.db import session_factory
from subscriptions.models import Subscription
from subscriptions.service import subscription_spec
from tests.users import api_client, new_user

HOSTS = {"name": "hosts", "key_field": "host", "time_field": "time",
         "attributes": [{"name": "cpu", "unit": "%", "min": 0, "max": 100}, {"name": "mem", "required": False}],
         "dimensions": [{"name": "region"}, {"name": "dc", "max_length": 8}], "partitions": 1}


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """Stream topics of this test's own (the broker is shared by the test session)."""
    return settings.model_copy(update={"stream_topic_prefix": f"{settings.events_topic}.stream."})


@pytest.fixture
def clients(settings: Settings) -> Iterator[tuple[TestClient, TestClient]]:
    """An operator who has declared ``hosts``, and a subscriber."""
    ensure_topics(settings)
    _, operator_token = new_user(settings, role="operator")
    _, user_token = new_user(settings)
    with api_client(settings, operator_token) as operator, api_client(settings, user_token) as user:
        created = operator.post("/api/streams", json=HOSTS)
        assert created.status_code == 201, created.text
        yield operator, user


def _errors(response) -> dict[str, str]:
    assert response.status_code == 422, response.text
    return {".".join(str(p) for p in e["loc"][1:]): e["msg"] for e in response.json()["detail"]}


def test_a_subscription_on_a_stream_is_stored_and_published(
        clients: tuple[TestClient, TestClient], settings: Settings) -> None:
    _, user = clients
    log = CatalogLog(redis.Redis.from_url(settings.redis_url), RedisKeys(settings))
    before = log.read(after=0).version
    made = user.post("/api/subscriptions", json={
        "name": "hot web hosts", "stream": "hosts", "keys": ["web-1", "web-2", "web-3"],
        "condition": "avg(CPU) over 1m > 90 where key in ('web-2', 'web-1', 'web-9')"})
    assert made.status_code == 201, made.text
    body = made.json()
    assert body["stream"] == "hosts"
    assert body["condition"] == "AVG(cpu) OVER 1m > 90"
    assert body["keys"] == ["web-1", "web-2"]  # the keys field and key IN: the keys in both
    assert user.get(f"/api/subscriptions/{body['id']}").json()["stream"] == "hosts"
    assert user.get(f"/api/subscriptions/{body['id']}/alerts").json()["stream"] == "hosts"  # history per stream
    assert user.get(f"/api/subscriptions/{body['id']}/firing").json()["stream"] == "hosts"

    after = log.read(after=before)
    [spec] = CatalogChange.decode(after.entries[-1][1]).upserts  # what the evaluator is told
    assert spec.condition.stream == "hosts" and spec.condition.where == () and spec.condition.key_prefix is None
    assert spec.keys == frozenset({"web-1", "web-2"})
    assert spec.applies_to("web-1") and not spec.applies_to("db-1")
    with session_factory(settings.database_url)() as session:
        row = session.get(Subscription, body["id"])
        assert row is not None
        assert subscription_spec(row) == SubscriptionSpec(body["id"], spec.condition, spec.keys)

    edited = user.put(f"/api/subscriptions/{body['id']}", json={
        "name": "any volume", "condition": "SUM(volume) OVER 1m > 5"})  # back to the default stream
    assert edited.status_code == 200, edited.text
    assert edited.json()["stream"] == "trades" and edited.json()["keys"] is None
    [spec] = CatalogChange.decode(log.read(after=after.version).entries[-1][1]).upserts
    assert spec.condition == Condition.from_dict({"aggregate": "SUM", "attribute": "volume", "window_ms": 60_000,
                                                  "low": 5.0})
    assert "stream" not in spec.condition.to_dict()  # trades conditions read as they always did


def test_filters_prefixes_and_optional_attributes_are_stored_and_published_with_their_view(
        clients: tuple[TestClient, TestClient], settings: Settings) -> None:
    """Dimension filters, key prefixes and aggregates of an optional attribute are evaluated (views,
    evaluator/views.py): accepted, and published with what makes their view."""
    _, user = clients
    body = {"name": "x", "stream": "hosts"}
    for condition in ("AVG(cpu) OVER 1m > 90 WHERE region IN ('eu', 'eu-west')",
                      "COUNT(*) OVER 1m > 9 WHERE key STARTS WITH 'web-'", "AVG(mem) OVER 1m > 9"):
        checked = user.post("/api/conditions/check", json={"stream": "hosts", "condition": condition})
        assert checked.status_code == 200, checked.text
        made = user.post("/api/subscriptions", json={**body, "condition": condition})
        assert made.status_code == 201, made.text
    log = CatalogLog(redis.Redis.from_url(settings.redis_url), RedisKeys(settings))
    published = [spec.condition for entry in log.read(after=0).entries
                 for spec in CatalogChange.decode(entry[1]).upserts]
    assert [(c.where, c.key_prefix, c.stream) for c in published] == [
        ((("region", ("eu", "eu-west")),), None, "hosts"), ((), "web-", "hosts"), ((), None, "hosts")]


def test_unknown_streams_attributes_and_dimensions_are_422_on_their_field(
        clients: tuple[TestClient, TestClient]) -> None:
    _, user = clients
    body = {"name": "x", "stream": "hosts", "condition": "AVG(cpu) OVER 1m > 90"}
    assert _errors(user.post("/api/subscriptions", json={**body, "stream": "nope"})) == {
        "stream": "no stream named 'nope'; the streams are hosts, trades"}
    assert "String should match pattern" in _errors(user.post("/api/subscriptions",
                                                              json={**body, "stream": "Bad Name"}))["stream"]
    assert _errors(user.post("/api/subscriptions", json={**body, "condition": "SUM(volume) OVER 1m > 1"})) == {
        "condition": "unknown attribute 'volume'; stream hosts has cpu, mem (at column 5)"}
    assert _errors(user.post("/api/subscriptions", json={**body, "condition": "AVG(cpu) OVER 1m > 9 WHERE zone = 'a'"})
                   ) == {"condition": "unknown dimension 'zone'; stream hosts has dimensions: region, dc (and key) "
                                      "(at column 28)"}
    assert _errors(user.post("/api/subscriptions", json={**body, "stream": "trades"})) == {
        "condition": "unknown attribute 'cpu'; events carry price, volume (at column 5)"}
    # the syntax is checked with the other fields, before the stream is read
    both = _errors(user.post("/api/subscriptions", json={**body, "name": "", "condition": "AVG(cpu) OVER 1m > 9 "
                                                                                          "WHERE dc IN ()"}))
    assert both["condition"].startswith("Value error, IN needs at least one value") and "name" in both
    assert _errors(user.post("/api/subscriptions", json={**body, "keys": ["db-1"],
                                                         "condition": "AVG(cpu) OVER 1m > 9 WHERE key = 'web-1'"})
                   ) == {"keys": "key IN (...) and the subscription's keys have no key in common: it would "
                                      "watch nothing (a subscription watches the keys in both)"}
    assert user.get("/api/subscriptions").json() == []


def test_conditions_are_checked_and_previewed_on_their_stream(clients: tuple[TestClient, TestClient]) -> None:
    _, user = clients
    streams = {s["name"]: s for s in user.get("/api/conditions/streams").json()}  # subscribers may read them
    assert [a["name"] for a in streams["hosts"]["attributes"]] == ["cpu", "mem"]
    assert streams["hosts"]["dimensions"] == ["region", "dc"] and streams["trades"]["dimensions"] == []
    for example in streams["hosts"]["examples"]:  # the form's examples are valid on their stream
        assert user.post("/api/conditions/check", json={"stream": "hosts", "condition": example}).status_code == 200

    checked = user.post("/api/conditions/check", json={
        "stream": "hosts", "condition": "MAX(cpu) OVER 1m > 1 WHERE key IN ('a', 'b')"})
    assert checked.status_code == 200, checked.text
    assert checked.json()["canonical"] == "MAX(cpu) OVER 1m > 1"
    assert checked.json()["keys"] == ["a", "b"] and checked.json()["stream"] == "hosts"
    assert _errors(user.post("/api/conditions/check", json={"condition": "MAX(cpu) OVER 1m > 1"})) == {
        "condition": "unknown attribute 'cpu'; events carry price, volume (at column 5)"}
    assert _errors(user.post("/api/conditions/preview", json={"stream": "nope", "condition": "COUNT(*) OVER 1m > 1"})
                   ) == {"stream": "no stream named 'nope'; the streams are hosts, trades"}
    preview = user.post("/api/conditions/preview", json={"stream": "hosts", "keys": ["a", "c"],
                                                         "condition": "COUNT(*) OVER 1m > 1 WHERE key IN ('a', 'b')"})
    assert preview.status_code == 200, preview.text  # no evaluator runs here: it says so
    assert preview.json()["stream"] == "hosts" and preview.json()["shards"] == 0


def test_removing_an_attribute_a_subscription_uses_is_refused(clients: tuple[TestClient, TestClient]) -> None:
    """(Dimension filters are refused until the evaluator evaluates them; fields_used covers them, see
    tests/subscriptions.)"""
    operator, user = clients
    made = user.post("/api/subscriptions", json={"name": "mem", "stream": "hosts",
                                                 "condition": "SUM(mem) OVER 1m > 9"})
    assert made.status_code == 201, made.text
    label = f"#{made.json()['id']} mem"
    schema = operator.get("/api/streams/hosts").json()["schema"]
    without_mem = {**schema, "attributes": [a for a in schema["attributes"] if a["name"] != "mem"]}
    refused = operator.put("/api/streams/hosts", json=without_mem)
    assert refused.status_code == 409, refused.text
    assert refused.json()["subscriptions"] == [label] and "mem" in refused.json()["detail"]
    without_dc = {**schema, "dimensions": [d for d in schema["dimensions"] if d["name"] != "dc"]}
    assert operator.put("/api/streams/hosts", json=without_dc).status_code == 200  # dc is used by nobody
    assert operator.delete("/api/streams/hosts").status_code == 409  # the stream is used
