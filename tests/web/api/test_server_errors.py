"""API inputs that used to answer 500, on SQLite and PostgreSQL: each is a 4xx with a message now."""

from __future__ import annotations

from core.settings import Settings
from tests.users import api_client, new_user

HUGE_ID = 2**63
DEEP = "(" * 230 + "COUNT(*)" + ")" * 230 + " OVER 1m > 1"


def test_deep_parentheses_are_a_422(settings: Settings) -> None:
    _, token = new_user(settings)
    with api_client(settings, token) as api:
        for path, body in [("/api/conditions/check", {"condition": DEEP}),
                           ("/api/subscriptions", {"name": "x", "condition": DEEP})]:
            response = api.post(path, json=body)
            assert response.status_code == 422, (path, response.text)
            assert "nest" in response.text


def test_huge_ids_are_not_found_or_refused(settings: Settings) -> None:
    _, token = new_user(settings)
    with api_client(settings, token) as api:
        for method, path, body in [
            ("GET", f"/api/subscriptions/{HUGE_ID}", None), ("DELETE", f"/api/subscriptions/{HUGE_ID}", None),
            ("PUT", f"/api/subscriptions/{HUGE_ID}", {"name": "x", "condition": "COUNT(*) OVER 1m > 1"}),
            ("GET", f"/api/endpoints/{HUGE_ID}", None), ("POST", f"/api/endpoints/{HUGE_ID}/test", None),
            ("DELETE", f"/api/tokens/{HUGE_ID}", None),
            ("POST", "/api/subscriptions", {"name": "x", "condition": "COUNT(*) OVER 1m > 1",
                                            "endpoint_ids": [HUGE_ID]}),
            ("GET", f"/api/subscriptions/{-HUGE_ID - 1}", None),
        ]:
            response = api.request(method, path, json=body)
            assert response.status_code in (404, 422), (method, path, response.status_code, response.text)


def test_an_invalid_cursor_is_a_422(settings: Settings) -> None:
    _, token = new_user(settings)
    with api_client(settings, token) as api:
        sid = api.post("/api/subscriptions", json={"name": "x", "condition": "COUNT(*) OVER 1m > 1"}).json()["id"]
        for cursor in ["99999999999999999999999-0", "1-99999999999999999999999"]:
            response = api.get(f"/api/subscriptions/{sid}/alerts", params={"before": cursor})
            assert response.status_code == 422, (cursor, response.text)
