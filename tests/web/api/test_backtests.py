"""The backtest API's refusals: field-level 422s for the condition and the range, 409 beyond an account's active
backtests, 404 for another account's, and cancelling a queued one (no worker runs here: jobs stay queued)."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from core.settings import Settings
from tests.users import api_client, new_user


def iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat()


def detail_fields(response) -> dict:
    body = response.json()
    return {tuple(e["loc"])[-1]: e["msg"] for e in body["detail"]} if isinstance(body["detail"], list) else body


def test_refusals_name_the_field_and_a_queued_backtest_can_be_cancelled(api, settings: Settings) -> None:
    now = time.time()
    ok = {"condition": "SUM(volume) OVER 5m > 2e6", "start": iso(now - 3600)}
    bad_condition = api.post("/api/backtests", json={**ok, "condition": "SUM(vol) OVER 5m > 1"})
    assert bad_condition.status_code == 422 and "unknown attribute 'vol'" in bad_condition.text
    assert "condition" in bad_condition.text
    for change, field, words in (
        ({"start": iso(now - 8 * 86_400)}, "start", "retention"),
        ({"end": iso(now + 3600)}, "end", "end by now"),
        ({"start": iso(now - 60), "end": iso(now - 120)}, "start", "start before it ends"),
        ({"condition": None}, "condition", "give a condition"),
    ):
        refused = api.post("/api/backtests", json={**ok, **change})
        assert refused.status_code == 422, (change, refused.text)
        assert field in refused.text and words in refused.text, refused.text
    started = api.post("/api/backtests", json=ok)
    assert started.status_code == 202 and started.json()["state"] == "queued"
    job = started.json()["id"]
    again = api.post("/api/backtests", json=ok)
    assert again.status_code == 409 and "already has 1 backtest" in again.text
    _, token = new_user(settings)
    with api_client(settings, token) as other:
        assert other.get(f"/api/backtests/{job}").status_code == 404
        assert other.delete(f"/api/backtests/{job}").status_code == 404
    assert api.get("/api/backtests/not-an-id").status_code == 422
    cancelled = api.delete(f"/api/backtests/{job}")
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
    assert api.post("/api/backtests", json=ok).status_code == 202


def test_a_saved_subscriptions_backtest_takes_its_condition_keys_and_policy(api) -> None:
    created = api.post("/api/subscriptions", json={"name": "vol", "condition": "SUM(volume) OVER 1m > 5",
                                                   "keys": ["AAPL"], "policy": {"cooldown_s": 600}})
    assert created.status_code == 201, created.text
    started = api.post("/api/backtests", json={"subscription_id": created.json()["id"], "start": iso(time.time() - 600)})
    assert started.status_code == 202, started.text
    request = started.json()["request"]
    assert request["condition"] == "SUM(volume) OVER 1m > 5" and request["keys"] == ["AAPL"]
    assert request["policy"]["cooldown_s"] == 600 and request["subscription_id"] == created.json()["id"]
    assert api.post("/api/backtests", json={"subscription_id": 999_999, "start": iso(time.time() - 600)}
                    ).status_code == 404
