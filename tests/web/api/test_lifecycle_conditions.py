"""Lifecycle clauses through the HTTP API: created and published to the evaluator as written, refused with the
field and the column when wrong, and read back in plain words by the live check."""

from __future__ import annotations

from fastapi.testclient import TestClient

from core.settings import Settings
from evaluator.lifecycle import Lifecycle
from tests.web.api.test_api import published


def test_subscriptions_with_lifecycle_clauses_are_created_and_published(api: TestClient, settings: Settings) -> None:
    body = {"name": "held", "condition": "sum(volume) over 5m > 2e6 for 2m keep firing for 5m"}
    created = api.post("/api/subscriptions", json=body)
    assert created.status_code == 201, created.text
    assert created.json()["condition"] == "SUM(volume) OVER 5m > 2000000 FOR 2m KEEP FIRING FOR 5m"
    crossing = api.post("/api/subscriptions", json={"name": "x", "condition": "LAST(price) OVER 1m CROSSES 100 DAMPEN 10m"})
    assert crossing.status_code == 201, crossing.text
    by_id = {s.id: s.condition.lifecycle for s in published(settings).subscriptions}
    assert by_id[created.json()["id"]] == Lifecycle(for_ms=120_000, keep_firing_ms=300_000)
    assert by_id[crossing.json()["id"]] == Lifecycle(dampen_ms=600_000, crossing="either")


def test_lifecycle_errors_are_422_on_the_condition_with_the_column(api: TestClient) -> None:
    response = api.post("/api/subscriptions", json={"name": "x", "condition": "SUM(volume) OVER 5m > 2e6 RESOLVE BELOW 3e6"})
    assert response.status_code == 422
    [error] = response.json()["detail"]
    assert error["loc"][-1] == "condition"
    assert "must be at or below the firing range" in error["msg"] and "column 27" in error["msg"]


def test_the_live_check_explains_the_clauses(api: TestClient) -> None:
    checked = api.post("/api/conditions/check", json={"condition": "COUNT(*) OVER 1m > 100 RESOLVE BELOW 80 DAMPEN 30m"})
    assert checked.status_code == 200, checked.text
    assert checked.json()["canonical"] == "COUNT(*) OVER 1m > 100 RESOLVE BELOW 80 DAMPEN 30m"
    assert "resolves only when the value falls below 80" in checked.json()["explanation"]
    wrong = api.post("/api/conditions/check", json={"condition": "LAST(price) OVER 1m CROSSES ABOVE 1 FOR 2m"})
    assert wrong.status_code == 422 and "column 37" in wrong.text
