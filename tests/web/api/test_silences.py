"""The silences API: validation with field-level errors, per-user isolation, states and idempotent expiry."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient

from core.settings import Settings
from tests.users import api_client, new_user


def _subscription(api: TestClient, name: str = "vol") -> int:
    response = api.post("/api/subscriptions", json={"name": name, "condition": "SUM(volume) OVER 1m > 100"})
    assert response.status_code == 201, response.text
    return response.json()["id"]


def _silence(api: TestClient, **body: object) -> dict:
    body = {"matchers": [{"name": "key", "op": "=", "value": "AAPL"}], "comment": "maintenance",
            "duration_s": 3600, **body}
    response = api.post("/api/silences", json=body)
    assert response.status_code == 201, response.text
    return response.json()


def _error(response) -> tuple[list, str]:
    assert response.status_code == 422, response.text
    [detail] = response.json()["detail"]
    return detail["loc"], detail["msg"]


def test_create_get_list_and_expire(api: TestClient) -> None:
    sid = _subscription(api)
    created = _silence(api, matchers=[{"name": "subscription", "op": "=", "value": str(sid)},
                                      {"name": "key", "op": "=~", "value": "AA.*"}])
    assert created["state"] == "active" and created["comment"] == "maintenance"
    assert created["matchers"][1] == {"name": "key", "op": "=~", "value": "AA.*"}
    starts, ends = datetime.fromisoformat(created["starts_at"]), datetime.fromisoformat(created["ends_at"])
    assert ends - starts == timedelta(hours=1) and abs(starts - datetime.now(UTC)) < timedelta(minutes=1)
    assert api.get(f"/api/silences/{created['id']}").json() == created

    later = _silence(api, duration_s=None, starts_at=(datetime.now(UTC) + timedelta(hours=1)).isoformat(),
                     ends_at=(datetime.now(UTC) + timedelta(hours=2)).isoformat())
    assert later["state"] == "pending"
    assert [s["id"] for s in api.get("/api/silences").json()] == [later["id"], created["id"]]  # newest first
    assert [s["id"] for s in api.get("/api/silences?state=pending").json()] == [later["id"]]
    assert [s["id"] for s in api.get("/api/silences?state=active").json()] == [created["id"]]
    assert api.get("/api/silences?state=expired").json() == []
    assert api.get("/api/silences?state=bogus").status_code == 422

    expired = api.post(f"/api/silences/{created['id']}/expire")
    assert expired.status_code == 200 and expired.json()["state"] == "expired" and expired.json()["expired_at"]
    again = api.post(f"/api/silences/{created['id']}/expire")  # idempotent: nothing changes
    assert again.status_code == 200 and again.json() == expired.json()
    assert [s["id"] for s in api.get("/api/silences?state=expired").json()] == [created["id"]]
    assert [s["id"] for s in api.get("/api/silences?state=active").json()] == []


def test_a_start_in_the_past_is_now(api: TestClient) -> None:
    created = _silence(api, starts_at=(datetime.now(UTC) - timedelta(days=3)).isoformat(), duration_s=60)
    assert abs(datetime.fromisoformat(created["starts_at"]) - datetime.now(UTC)) < timedelta(minutes=1)
    assert created["state"] == "active"


@pytest.mark.database_plays_no_part
@pytest.mark.parametrize(
    ("change", "loc", "message"),
    [
        ({"comment": "   "}, ["body", "comment"], "needs a comment"),
        ({"comment": None}, ["body", "comment"], "valid string"),
        ({"matchers": []}, ["body", "matchers"], "at least 1 item"),
        ({"matchers": [{"name": "key", "op": "=", "value": "A"}] * 17}, ["body", "matchers"], "at most 16 items"),
        ({"matchers": [{"name": "key", "op": "=~", "value": "(AAPL"}]}, ["body", "matchers", 0],
         "not a valid RE2 regular expression: missing )"),
        ({"matchers": [{"name": "key", "op": "=~", "value": r"(a)\1"}]}, ["body", "matchers", 0], "RE2"),
        ({"matchers": [{"name": "key", "op": "=~", "value": "a" * 257}]}, ["body", "matchers", 0, "value"],
         "at most 256 characters"),
        ({"matchers": [{"name": "host", "op": "=", "value": "x"}]}, ["body", "matchers", 0, "name"],
         "'key', 'subscription' or 'subscription_name'"),
        ({"matchers": [{"name": "key", "op": "~", "value": "x"}]}, ["body", "matchers", 0, "op"], "'='"),
        ({"matchers": [{"name": "subscription", "op": "=", "value": "vol"}]}, ["body", "matchers", 0],
         "matched by its id"),
        ({"matchers": [{"name": "subscription", "op": "!=", "value": "9" * 20}]}, ["body", "matchers", 0],
         "matched by its id (1 to 2147483647)"),
        ({"matchers": [{"name": "subscription", "op": "=", "value": "999999"}]}, ["body", "matchers"],
         "no subscription of yours has the id 999999"),
        ({"duration_s": None}, ["body"], "either ends_at or duration_s"),
        ({"ends_at": "2030-01-01T00:00:00Z"}, ["body"], "either ends_at or duration_s"),
        ({"duration_s": 0}, ["body", "duration_s"], "greater than or equal to 1"),
        ({"duration_s": 31 * 86_400}, ["body", "duration_s"], "at most 30 days"),
        ({"duration_s": None, "ends_at": "2020-01-01T00:00:00Z"}, ["body", "ends_at"], "must be after starts_at"),
        ({"duration_s": None, "starts_at": "2100-01-02T00:00:00Z", "ends_at": "2100-01-01T00:00:00Z"},
         ["body", "starts_at"], "at most 30 days (TOCSIN_SILENCE_MAX_DURATION_S) from now"),
        ({"duration_s": None, "ends_at": (datetime.now(UTC) + timedelta(days=40)).isoformat()}, ["body", "ends_at"],
         "at most 30 days (TOCSIN_SILENCE_MAX_DURATION_S) after starts_at"),
    ],
)
def test_invalid_silences_are_refused_on_their_field(api: TestClient, change: dict, loc: list, message: str) -> None:
    body = {"matchers": [{"name": "key", "op": "=", "value": "AAPL"}], "comment": "why", "duration_s": 600, **change}
    got_loc, got_message = _error(api.post("/api/silences", json=body))
    assert got_loc == loc and message in got_message, (got_loc, got_message)
    assert api.get("/api/silences").json() == []


def test_one_users_silences_are_invisible_and_untouchable_to_another(settings: Settings, api: TestClient) -> None:
    mine = _silence(api)
    with api_client(settings, new_user(settings)[1]) as other:
        assert other.get("/api/silences").json() == []
        assert other.get(f"/api/silences/{mine['id']}").status_code == 404
        assert other.post(f"/api/silences/{mine['id']}/expire").status_code == 404
        other_sub = _subscription(other, "theirs")
    # nor can a silence name another user's subscription
    _, message = _error(api.post("/api/silences", json={
        "matchers": [{"name": "subscription", "op": "=", "value": str(other_sub)}], "comment": "x", "duration_s": 60}))
    assert f"no subscription of yours has the id {other_sub}" in message
    assert api.get(f"/api/silences/{mine['id']}").json()["state"] == "active"
    with api_client(settings) as anonymous:
        assert anonymous.get("/api/silences").status_code == 401


def test_at_most_so_many_pending_or_active_silences_per_user(settings: Settings) -> None:
    limited = settings.model_copy(update={"user_max_silences": 2})
    with api_client(limited, new_user(limited)[1]) as api:
        first, _ = _silence(api), _silence(api)
        refused = api.post("/api/silences", json={"matchers": [{"name": "key", "value": "X"}], "comment": "c",
                                                  "duration_s": 60})
        assert refused.status_code == 403 and "at most 2 pending or active silences" in refused.json()["detail"]
        api.post(f"/api/silences/{first['id']}/expire")  # an expired one no longer counts
        assert _silence(api)["state"] == "active"
