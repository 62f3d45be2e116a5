"""The HTTP API: CRUD, field-level validation errors, and the catalog published to the evaluator."""

from __future__ import annotations

import pytest
import redis
from fastapi.testclient import TestClient

from core.catalog_log import CatalogLog
from core.redis_schema import RedisKeys
from core.settings import Settings
from evaluator.catalog import Catalog
from evaluator.spark.catalog_source import caught_up
from tests.users import api_client, new_user, sign_in


def published(settings: Settings) -> Catalog:
    """The catalog a new evaluator reader sees (the snapshot, if any, and the changes after it)."""
    log = CatalogLog(redis.Redis.from_url(settings.redis_url), RedisKeys(settings))
    return caught_up(log, Catalog.empty(), settings.catalog_snapshot_every)


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

    assert api.get(f"/api/subscriptions/{sub['id']}/firing").json() == {
        "subscription_id": sub["id"], "stream": "trades", "firing": {},
        "admission": {"waiting_shards": 0, "shards": 0, "unread_shards": 0, "waiting": True}}  # no shard has run
    assert api.delete(f"/api/subscriptions/{sub['id']}").status_code == 204
    assert api.get(f"/api/subscriptions/{sub['id']}").status_code == 404
    assert published(settings).subscriptions == ()


@pytest.mark.database_plays_no_part
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


def test_health_and_metrics(api: TestClient, settings: Settings) -> None:
    from ingest.kafka import ensure_topics
    from tests.users import evaluator_running

    assert api.get("/healthz").json() == {"status": "ok"}
    missing_topic = api.get("/readyz")
    assert missing_topic.status_code == 503 and missing_topic.json()["checks"]["stream"].startswith("error")
    ensure_topics(settings)
    not_evaluating = api.get("/readyz")
    assert not_evaluating.status_code == 503 and not_evaluating.json()["checks"]["evaluator"].startswith("absent")
    evaluator_running(settings)
    ready = api.get("/readyz")
    assert ready.status_code == 200 and ready.json()["checks"] == {
        "database": "ok", "redis": "ok", "stream": "ok", "evaluator": "ok"}
    metrics = api.get("/metrics").text
    assert "python_info" in metrics
    assert 'tocsin_http_request_seconds_count{method="GET",route="/readyz",status="200"}' in metrics


def test_catalog_publication_never_goes_backwards(api: TestClient, settings: Settings) -> None:
    from subscriptions.db import session_factory
    from subscriptions.service import CatalogPublisher

    api.post("/api/subscriptions", json={"name": "x", "condition": "SUM(volume) OVER 5m > 1"})
    current = published(settings)
    with session_factory(settings.database_url)() as session:
        catalogs = CatalogPublisher(session, settings, redis.Redis.from_url(settings.redis_url))
        assert not catalogs.publish(Catalog(current.version - 1, ()))
    assert published(settings) == current


@pytest.mark.database_plays_no_part
@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ({"kind": "email", "target": "not-an-address"}, "target", "one e-mail address"),
        ({"kind": "email", "target": "a@b.com, c@d.com"}, "target", "one e-mail address"),
        ({"kind": "email", "target": "ops@example.com", "secret": "s" * 20}, "secret", "take no secret"),
        ({"kind": "webhook", "target": "ftp://example.com/x"}, "target", "http(s) URL"),
        ({"kind": "sms", "target": "+4412345"}, "kind", "'webhook', 'email', 'slack', 'teams' or 'pagerduty'"),
    ],
)
def test_endpoint_validation_errors_name_the_field(api: TestClient, body: dict, field: str, message: str) -> None:
    response = api.post("/api/endpoints", json=body)
    assert response.status_code == 422
    errors = response.json()["detail"]
    assert any(field in map(str, e["loc"]) and message in e["msg"] for e in errors), errors


def test_email_endpoint_and_alert_policy_round_trip(api: TestClient, settings: Settings) -> None:
    email = api.post("/api/endpoints", json={"kind": "email", "target": "ops@example.com"})
    assert email.status_code == 201 and email.json()["secret"] is None
    body = {"name": "x", "condition": "SUM(volume) OVER 5m > 1", "endpoint_ids": [email.json()["id"]],
            "policy": {"cooldown_s": 300, "renotify_s": 3600, "send_resolved": False, "group": False}}
    sub = api.post("/api/subscriptions", json=body).json()
    assert sub["policy"] == {**body["policy"], "muted_until": None}

    muted = api.post(f"/api/subscriptions/{sub['id']}/mute", json={"until": "2030-01-01T09:00:00Z"}).json()
    assert muted["policy"]["muted_until"].startswith("2030-01-01T09:00:00") and muted["policy"]["cooldown_s"] == 300
    assert api.post(f"/api/subscriptions/{sub['id']}/mute", json={"until": None}).json()["policy"]["muted_until"] is None

    bad = api.post("/api/subscriptions", json={**body, "policy": {"renotify_s": 5, "colour": "red"}})
    assert bad.status_code == 422
    assert {tuple(e["loc"]) for e in bad.json()["detail"]} == {("body", "policy", "renotify_s"),
                                                                ("body", "policy", "colour")}
    assert api.get(f"/api/subscriptions/{sub['id']}/deliveries").json() == {"subscription_id": sub["id"],
                                                                            "deliveries": []}
    assert api.get("/api/subscriptions/999/deliveries").status_code == 404


def test_dead_letters_are_listed_with_a_replay_button(api: TestClient, settings: Settings) -> None:
    from notifier.attempt import Attempt
    from notifier.deliveries import DeliveryRecords
    from notifier.notification import build_notification

    alert = {"alert_id": "a1", "key": "AAPL", "state": "firing", "value": 1.0, "window_start": 0,
             "window_end": 60_000, "evaluated_at": 60_000}
    notification = build_notification({"id": 1, "name": "Big volume", "condition": "c"}, [alert], "n1")
    records = DeliveryRecords(redis.Redis.from_url(settings.redis_url, decode_responses=True), RedisKeys(settings))
    records.dead(notification, 4, "webhook", Attempt(False, False, 12.0, 410, "HTTP 410"), 1)

    operator, _ = new_user(settings, role="operator")
    with api_client(settings) as browser:
        sign_in(browser, operator.email)
        page = browser.get("/ops/dead-letters").text
        assert "Big volume (#1)" in page and "HTTP 410" in page and '{"letter": "n1:4"}' in page
        [letter] = api.get("/api/dead-letters").json()
        assert letter["id"] == "n1:4" and letter["notification"]["alerts"][0]["key"] == "AAPL"
        assert api.delete("/api/dead-letters/n1:4").status_code == 204
        assert api.delete("/api/dead-letters/n1:4").status_code == 404
        assert "None: every delivery" in browser.get("/ops/dead-letters").text


def test_each_change_publishes_one_diff_and_reads_no_other_subscription(api: TestClient, settings: Settings,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from evaluator.catalog import CatalogChange
    from subscriptions.service import CatalogPublisher

    def whole_catalog(*_: object) -> Catalog:
        raise AssertionError("a change read every subscription")

    monkeypatch.setattr(CatalogPublisher, "catalog", whole_catalog)
    client = redis.Redis.from_url(settings.redis_url)
    keys = RedisKeys(settings)
    log = CatalogLog(client, keys)
    other = api.post("/api/subscriptions", json={"name": "o", "condition": "COUNT(*) OVER 1m >= 3"}).json()
    body = {"name": "x", "condition": "SUM(volume) OVER 5m > 1", "keys": ["AAPL"]}

    def change(method: str, path: str, **kwargs: object) -> CatalogChange:
        before = log.read(after=0)
        response = api.request(method, path, **kwargs)
        assert response.status_code < 300, response.text
        after = log.read(after=before.version)
        assert after.version == before.version + 1 and len(after.entries) == 1
        assert not client.exists(keys.catalog_snapshot), "a snapshot was published"
        return CatalogChange.decode(after.entries[0][1])

    created = change("POST", "/api/subscriptions", json=body)
    [spec] = created.upserts
    assert created.removals == () and spec.keys == frozenset({"AAPL"})
    sid = spec.id
    edited = change("PUT", f"/api/subscriptions/{sid}", json={**body, "keys": None})
    assert [s.keys for s in edited.upserts] == [None] and edited.upserts[0].id == sid
    assert change("POST", f"/api/subscriptions/{sid}/pause") == CatalogChange(edited.version + 1, (), (sid,))
    assert [s.id for s in change("POST", f"/api/subscriptions/{sid}/resume").upserts] == [sid]
    assert change("PUT", f"/api/subscriptions/{sid}", json={**body, "active": False}).removals == (sid,)
    assert change("DELETE", f"/api/subscriptions/{sid}").removals == (sid,)
    assert [s.id for s in published(settings).subscriptions] == [other["id"]]
