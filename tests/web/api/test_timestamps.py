"""Every date and time in an API response has one form, ISO 8601 in UTC ending in ``Z``, on both databases: a
resource's ``created_at`` had a ``Z`` when it was created and none once read back from SQLite."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from core.settings import Settings
from ingest.kafka import ensure_topics

UTC_Z = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,6})?Z")
STREAM = {"name": "rooms", "key_field": "room", "time_field": "time", "time_format": "iso8601",
          "attributes": [{"name": "temp", "unit": "C"}], "partitions": 1}


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """Stream topics of this test's own (the broker is shared by the test session)."""
    return settings.model_copy(update={"stream_topic_prefix": f"{settings.events_topic}.stream."})


def _times(value: Any, path: str = "") -> dict[str, str]:
    """Every date-time field (``…_at``, ``…_until``, ``until``) with a value, by its path in the response."""
    found: dict[str, str] = {}
    if isinstance(value, dict):
        for name, inner in value.items():
            if (name.endswith(("_at", "_until")) or name == "until") and inner is not None:
                found[f"{path}.{name}"] = inner
            else:
                found.update(_times(inner, f"{path}.{name}"))
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            found.update(_times(inner, f"{path}[{i}]"))
    return found


def _ok(response: Any) -> Any:
    assert response.status_code in (200, 201), response.text
    return response.json()


def test_every_datetime_is_utc_with_a_z(api: TestClient, settings: Settings) -> None:
    ensure_topics(settings)
    endpoint = _ok(api.post("/api/endpoints", json={"kind": "webhook", "target": "https://hooks.example.com/x"}))
    subscription = _ok(api.post("/api/subscriptions", json={"name": "s", "condition": "COUNT(*) OVER 1m > 5",
                                                            "endpoint_ids": [endpoint["id"]]}))
    silence_body = {"matchers": [{"name": "key", "op": "=", "value": "AAPL"}], "comment": "maintenance",
                    "duration_s": 3600}
    start = (datetime.now(UTC) + timedelta(days=1)).replace(microsecond=0, tzinfo=None)  # naive: read as UTC
    responses = {
        "endpoint": endpoint,
        "subscription": subscription,
        # an offset other than UTC's, and none at all (read as UTC): both come back in UTC with a Z
        "muted": _ok(api.post(f"/api/subscriptions/{subscription['id']}/mute",
                              json={"until": "2030-01-01T09:00:00+02:00"})),
        "silence": _ok(api.post("/api/silences", json={**silence_body, "starts_at": start.isoformat()})),
        "token": _ok(api.post("/api/tokens", json={"name": "ci"})),
        "invitation": _ok(api.post("/api/invitations", json={})),
        "stream": _ok(api.post("/api/streams", json=STREAM)),
        "publisher token": _ok(api.post("/api/publisher-tokens", json={"name": "collector", "streams": ["rooms"]})),
    }
    for path in ("/api/endpoints", "/api/subscriptions", f"/api/subscriptions/{subscription['id']}", "/api/silences",
                 "/api/tokens", "/api/streams", "/api/streams/rooms", "/api/publisher-tokens", "/api/auth/me",
                 f"/api/endpoints/{endpoint['id']}"):
        responses[path] = _ok(api.get(path))  # read back from the database: SQLite's are naive
    for name, body in responses.items():
        times = _times(body)
        assert times, f"{name}: no date-time field found in {body}"
        for field, text in times.items():
            assert UTC_Z.fullmatch(text), f"{name}{field} = {text!r}"
    assert responses["muted"]["policy"]["muted_until"] == "2030-01-01T07:00:00Z"
    assert responses["silence"]["starts_at"] == f"{start.isoformat()}Z"
    listed = next(s for s in responses["/api/subscriptions"] if s["id"] == subscription["id"])
    assert listed["created_at"] == subscription["created_at"]  # the same moment, in the same form
