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


BAD_NAMES = ["line\nbreak", "carriage\rreturn", "tab\there", "right\u202eto-left", "zero\u200bwidth", "nul\x00",
             "line\u2028separator"]
STREAM = {"name": "gauges", "attributes": [{"name": "v"}]}


def test_names_with_control_or_format_characters_are_a_422_on_the_field(settings: Settings) -> None:
    """Every name field: subscriptions, API and publisher tokens, sign-in tokens, attribute units."""
    _, token = new_user(settings, role="operator")
    with api_client(settings, token) as api:
        assert api.post("/api/streams", json=STREAM).status_code == 201
        for bad in BAD_NAMES:
            for path, body, loc in [
                ("/api/subscriptions", {"name": bad, "condition": "COUNT(*) OVER 1m > 1"}, ["body", "name"]),
                ("/api/tokens", {"name": bad}, ["body", "name"]),
                ("/api/publisher-tokens", {"name": bad, "streams": ["gauges"]}, ["body", "name"]),
                ("/api/streams", {"name": "other", "attributes": [{"name": "v", "unit": bad}]},
                 ["body", "attributes", 0, "unit"]),
            ]:
                response = api.post(path, json=body)
                assert response.status_code == 422, (path, bad, response.text)
                [error] = response.json()["detail"]
                assert error["loc"] == loc and "control characters or Unicode format characters" in error["msg"], (path, bad, error)
        fine = "Ünïcode names ✓ (emoji 🚨, Ελληνικά)"
        assert api.post("/api/subscriptions", json={"name": fine, "condition": "COUNT(*) OVER 1m > 1"}).json()["name"] \
            == fine


def test_token_names_up_to_the_schema_limit_are_stored(settings: Settings) -> None:
    """200 characters (the schema's limit) fit every name column; PostgreSQL's VARCHAR(100) made 101-200 a 500."""
    _, token = new_user(settings, role="operator")
    with api_client(settings, token) as api:
        assert api.post("/api/streams", json=STREAM).status_code == 201
        for length in (101, 200):
            name = "n" * length
            made = [api.post("/api/tokens", json={"name": name}),
                    api.post("/api/publisher-tokens", json={"name": name, "streams": ["gauges"]})]
            assert [r.status_code for r in made] == [201, 201], [r.text for r in made]
            assert [r.json()["name"] for r in made] == [name, name]
        assert api.post("/api/tokens", json={"name": "n" * 201}).status_code == 422


def test_a_lone_surrogate_is_a_422_that_echoes_it_escaped(settings: Settings) -> None:
    """JSON may spell a lone surrogate (\\ud800), which UTF-8 cannot encode: the 422 that echoes the input was a 500."""
    _, token = new_user(settings)
    with api_client(settings, token) as api:
        for path, body in [("/api/subscriptions", '{"name": "a\\ud800", "condition": "COUNT(*) OVER 1m > 1"}'),
                           ("/api/endpoints", '{"kind": "webhook", "target": "http://127.0.0.1/\\udfff"}')]:
            response = api.post(path, content=body, headers={"content-type": "application/json"})
            assert response.status_code == 422, (path, response.text)
            assert response.json()["detail"][0]["type"] == "string_unicode"
