"""The HTTP API: CRUD, field-level validation errors, and the catalog published to the evaluator."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis
from fastapi.testclient import TestClient

from evaluator.catalog import Catalog
from infra.redis_schema import RedisKeys
from infra.settings import Settings
from web.app import create_app


@pytest.fixture
def api(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as client:
        yield client


def published(settings: Settings) -> Catalog:
    raw = redis.Redis.from_url(settings.redis_url).get(RedisKeys(settings).catalog_snapshot)
    return Catalog.from_dict(json.loads(raw)) if raw else Catalog.empty()


def make_endpoint(api: TestClient) -> dict:
    response = api.post("/api/endpoints", json={"kind": "webhook", "target": "https://hooks.example.com/x"})
    assert response.status_code == 201
    return response.json()


def test_create_list_update_pause_delete(api: TestClient, settings: Settings) -> None:
    endpoint = make_endpoint(api)
    assert len(endpoint["secret"]) >= 32
    assert "secret" not in api.get("/api/endpoints").json()[0]
    body = {"name": "vol", "condition": "sum(volume) over 5m > 2e6", "keys": ["MSFT", "AAPL", "AAPL"],
            "endpoint_ids": [endpoint["id"]]}
    created = api.post("/api/subscriptions", json=body)
    assert created.status_code == 201, created.text
    sub = created.json()
    assert sub["condition"] == "SUM(volume) OVER 5m > 2000000"
    assert sub["keys"] == ["AAPL", "MSFT"]
    catalog = published(settings)
    assert [s.id for s in catalog.subscriptions] == [sub["id"]] and catalog.version >= 1

    updated = api.put(f"/api/subscriptions/{sub['id']}", json={**body, "condition": "COUNT(*) OVER 1m >= 10", "keys": None})
    assert updated.status_code == 200 and updated.json()["keys"] is None
    assert published(settings).subscriptions[0].condition.window_ms == 60_000
    assert published(settings).version > catalog.version

    assert api.post(f"/api/subscriptions/{sub['id']}/pause").json()["active"] is False
    assert published(settings).subscriptions == ()
    assert api.post(f"/api/subscriptions/{sub['id']}/resume").json()["active"] is True
    assert len(published(settings).subscriptions) == 1

    assert api.get(f"/api/subscriptions/{sub['id']}/firing").json() == {"subscription_id": sub["id"], "firing": {}}
    assert api.delete(f"/api/subscriptions/{sub['id']}").status_code == 204
    assert api.get(f"/api/subscriptions/{sub['id']}").status_code == 404
    assert published(settings).subscriptions == ()


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ({"name": "x", "condition": "SUM(vol) OVER 5m > 1"}, "condition", "unknown attribute 'vol'"),
        ({"name": "x", "condition": "SUM(volume) OVER 1500ms > 1"}, "condition", "multiple of 1s"),
        ({"name": "x", "condition": "SUM(volume) OVER 4h > 1"}, "condition", "at most 3h"),
        ({"name": "", "condition": "SUM(volume) OVER 5m > 1"}, "name", "at least 1 character"),
        ({"name": "x", "condition": "SUM(volume) OVER 5m > 1", "keys": ["bad key"]}, "keys", "pattern"),
        ({"name": "x", "condition": "SUM(volume) OVER 5m > 1", "colour": "red"}, "colour", "Extra inputs"),
    ],
)
def test_validation_errors_are_422_with_field_locations(api: TestClient, body: dict, field: str, message: str) -> None:
    response = api.post("/api/subscriptions", json=body)
    assert response.status_code == 422
    errors = response.json()["detail"]
    assert any(field in map(str, e["loc"]) and message in e["msg"] for e in errors), errors


def test_unknown_endpoint_and_subscription_are_404(api: TestClient) -> None:
    response = api.post("/api/subscriptions", json={"name": "x", "condition": "SUM(volume) OVER 5m > 1",
                                                    "endpoint_ids": [999]})
    assert response.status_code == 404 and "999" in response.json()["detail"]
    assert api.put("/api/subscriptions/5", json={"name": "x", "condition": "SUM(volume) OVER 5m > 1"}).status_code == 404
    assert api.post("/api/endpoints", json={"kind": "webhook", "target": "not a url"}).status_code == 422


def test_health_and_metrics(api: TestClient) -> None:
    assert api.get("/healthz").json() == {"status": "ok"}
    ready = api.get("/readyz")
    assert ready.status_code == 200 and ready.json()["checks"] == {"database": "ok", "redis": "ok"}
    assert "python_info" in api.get("/metrics").text
    assert "Subscriptions" in api.get("/").text


def test_catalog_publication_never_goes_backwards(api: TestClient, settings: Settings) -> None:
    from subscriptions.db import session_factory
    from subscriptions.service import SubscriptionService

    api.post("/api/subscriptions", json={"name": "x", "condition": "SUM(volume) OVER 5m > 1"})
    current = published(settings)
    with session_factory(settings.database_url)() as session:
        service = SubscriptionService(session, settings, redis.Redis.from_url(settings.redis_url))
        assert not service.publish(Catalog(current.version - 1, ()))
    assert published(settings) == current
