"""Slack, Teams and PagerDuty endpoints and message templates through the API (both databases)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from core.settings import Settings
from subscriptions.db import session_factory
from subscriptions.models import Endpoint
from subscriptions.vault import reveal

ROUTING_KEY = "0123456789abcdef0123456789abcdef"
EVENTS = "https://events.pagerduty.com/v2/enqueue"


def test_the_kinds_come_from_the_registry_with_their_help_and_template_use(api: TestClient) -> None:
    kinds = {k["name"]: k for k in api.get("/api/endpoints/kinds").json()}
    assert list(kinds) == ["webhook", "email", "slack", "teams", "pagerduty"]
    assert kinds["pagerduty"]["secret_required"] and kinds["pagerduty"]["secret_label"] == "routing key"
    assert kinds["slack"]["template_use"].startswith("the message text") and kinds["webhook"]["template_use"] is None
    assert all(k["help"] for k in kinds.values())


def test_a_pagerduty_endpoint_needs_its_routing_key_which_is_sealed_and_never_shown(api: TestClient,
                                                                                  settings: Settings) -> None:
    missing = api.post("/api/endpoints", json={"kind": "pagerduty", "target": EVENTS})
    assert missing.status_code == 422
    assert missing.json()["detail"][0]["loc"] == ["body", "secret"] and "need their routing key" in missing.text
    created = api.post("/api/endpoints", json={"kind": "pagerduty", "target": EVENTS, "secret": ROUTING_KEY})
    assert created.status_code == 201 and created.json()["secret"] is None
    assert ROUTING_KEY not in api.get(f"/api/endpoints/{created.json()['id']}").text
    with session_factory(settings.database_url)() as session:
        stored = session.get(Endpoint, created.json()["id"])
        assert stored is not None and ROUTING_KEY not in (stored.secret_encrypted or "")
        assert reveal(settings, stored.secret_encrypted or "") == ROUTING_KEY
    rotate = api.post(f"/api/endpoints/{created.json()['id']}/rotate-secret")
    assert rotate.status_code == 422  # a generated key would not be PagerDuty's


def test_templates_are_checked_when_saved_with_the_field_and_line(api: TestClient) -> None:
    refused = api.post("/api/endpoints", json={"kind": "slack", "target": "https://hooks.slack.com/services/x",
                                               "template": "{{ title }}\n{% for a in alerts %}{% for b in alerts %}"
                                                           "\n{% for c in alerts %}{% endfor %}{% endfor %}{% endfor %}"})
    assert refused.status_code == 422
    [error] = refused.json()["detail"]
    assert error["loc"] == ["body", "template"] and error["msg"] == "line 3: loops nested 3 deep: at most 2"
    unknown = api.post("/api/endpoints", json={"kind": "teams", "target": "https://x.example/hook",
                                               "template": "ok\n\n{{ alert.nothing }}"})
    assert unknown.status_code == 422 and unknown.json()["detail"][0]["msg"].startswith("line 3: ")
    webhook = api.post("/api/endpoints", json={"kind": "webhook", "target": "https://x.example/hook",
                                               "template": "{{ title }}"})
    assert webhook.status_code == 422 and "webhook endpoints take no message template" in webhook.text


def test_a_template_is_stored_changed_and_cleared(api: TestClient) -> None:
    created = api.post("/api/endpoints", json={"kind": "slack", "target": "https://hooks.slack.com/services/x",
                                               "template": "{{ title }}"})
    assert created.status_code == 201 and created.json()["template"] == "{{ title }}"
    eid = created.json()["id"]
    changed = api.patch(f"/api/endpoints/{eid}", json={"template": "*{{ state }}* {{ keys|join(', ') }}"})
    assert changed.status_code == 200 and changed.json()["template"] == "*{{ state }}* {{ keys|join(', ') }}"
    bad = api.patch(f"/api/endpoints/{eid}", json={"template": "{{ title|center(99) }}"})
    assert bad.status_code == 422 and "no filter named 'center'" in bad.text
    assert api.get(f"/api/endpoints/{eid}").json()["template"] == "*{{ state }}* {{ keys|join(', ') }}"
    cleared = api.patch(f"/api/endpoints/{eid}", json={"template": "  "})
    assert cleared.status_code == 200 and cleared.json()["template"] is None


@pytest.mark.database_plays_no_part
@pytest.mark.parametrize(("kind", "template", "state", "text"), [
    ("slack", "{{ state|upper }} {{ subscription.name }} <{{ alert.key }}>", "resolved", "RESOLVED High volume <AAPL>"),
    ("pagerduty", "{{ alert.key }} is {{ alert.value|number }}", "firing", "AAPL is 2.514e+06"),
    ("email", "{{ title }}", "firing", "FIRING: High volume (AAPL, MSFT)"),
])
def test_the_preview_renders_a_sample_as_the_kind_sends_it(api: TestClient, kind: str, template: str, state: str,
                                                            text: str) -> None:
    shown = api.post("/api/endpoints/preview-template", json={"kind": kind, "template": template, "state": state})
    assert shown.status_code == 200, shown.text
    assert shown.json()["ok"] and shown.json()["text"] == text and shown.json()["payload"]


def test_the_preview_reports_a_failing_template_with_its_line(api: TestClient) -> None:
    shown = api.post("/api/endpoints/preview-template",
                     json={"kind": "teams", "template": "a\n{% for i in range(5000) %}{% endfor %}"})
    assert shown.status_code == 200
    assert shown.json() == {"ok": False, "text": None, "line": 2, "payload": None,
                            "error": "SecurityError: range of 5,000 numbers: at most 1,000"}
    default = api.post("/api/endpoints/preview-template", json={"kind": "teams"}).json()
    assert default["ok"] and default["payload"]["attachments"][0]["content"]["type"] == "AdaptiveCard"


HOSTILE_TEMPLATES = {  # each under the 4,000-character limit
    "{{ " + "[" * 1500 + "]" * 1500 + " }}": "nested too deep",
    "{{ " + "(" * 1300 + "1" + ")" * 1300 + " }}": "nested too deep",
    "{{ " + "not " * 990 + "1 }}": "nested too deep",
    "{{ 1" + "|abs" * 990 + " }}": "nested too deep",
    "{{ ''.format }}": "attribute 'format' of 'str' object is unsafe",
    "{{ range }}": "range can only be called",
}


def test_deep_or_function_printing_templates_are_refused_on_the_field_never_a_500(api: TestClient) -> None:
    slack = {"kind": "slack", "target": "https://hooks.slack.com/services/x"}
    kept = api.post("/api/endpoints", json={**slack, "template": "{{ title }}"}).json()["id"]
    for template, reason in HOSTILE_TEMPLATES.items():
        refused = api.post("/api/endpoints", json={**slack, "template": template})
        assert refused.status_code == 422, (template[:20], refused.text)
        [error] = refused.json()["detail"]
        assert error["loc"] == ["body", "template"] and reason in error["msg"], error
        changed = api.patch(f"/api/endpoints/{kept}", json={"template": template})
        assert changed.status_code == 422 and reason in changed.text
        shown = api.post("/api/endpoints/preview-template", json={"kind": "slack", "template": template})
        assert shown.status_code == 200 and not shown.json()["ok"] and reason in shown.json()["error"]
    assert api.get(f"/api/endpoints/{kept}").json()["template"] == "{{ title }}"
