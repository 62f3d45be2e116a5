"""The endpoints page: the new kinds, the template field with its checks, and the live preview (HTTP and a browser)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from playwright.sync_api import Page, expect

from core.settings import Settings
from tests.servers import serving
from tests.users import PASSWORD, api_client, new_user, sign_in
from tests.web.test_ui import browser, page  # noqa: F401 - the shared Chromium fixtures
from web.app import create_app

HTML = {"accept": "text/html"}
SLACK = "https://hooks.slack.com/services/T0/B0/x"


def test_the_form_takes_kinds_secrets_and_templates_and_shows_errors_on_the_field(settings: Settings) -> None:
    user, _ = new_user(settings)
    with api_client(settings) as client:
        sign_in(client, user.email)
        form = client.get("/endpoints", headers=HTML).text
        for label in ("Slack", "Microsoft Teams", "PagerDuty"):
            assert f">{label}</option>" in form
        assert "<code>alerts</code>" in form and "ms_time" in form  # the documented variables and filters

        refused = client.post("/endpoints", data={"kind": "slack", "target": SLACK,
                                                   "template": "ok\n{{ title|center(9) }}"})
        assert refused.status_code == 422
        assert 'data-field="template">line 2: no filter named &#39;center&#39;</p>' in refused.text
        assert "ok\n{{ title|center(9) }}</textarea>" in refused.text  # kept for the user to fix

        missing_key = client.post("/endpoints", data={"kind": "pagerduty", "target": "https://events.pagerduty.com/v2/enqueue"})
        assert missing_key.status_code == 422 and "need their routing key" in missing_key.text
        made = client.post("/endpoints", data={"kind": "pagerduty", "target": "https://events.pagerduty.com/v2/enqueue",
                                                "secret": "0123456789abcdef0123456789abcdef"})
        assert made.status_code == 200 and "0123456789abcdef" not in made.text  # no secret flash for a routing key

        created = client.post("/endpoints", data={"kind": "slack", "target": SLACK, "template": "*{{ state }}*"})
        eid = max(int(i) for i in re.findall(r'data-endpoint="(\d+)"', created.text))
        bad = client.post(f"/endpoints/{eid}/template", data={"template": "{% for a in alerts recursive %}{% endfor %}"})
        assert bad.status_code == 422 and "recursive loops are not available" in bad.text
        assert client.post(f"/endpoints/{eid}/template", data={"template": "{{ keys|join }}"}).status_code == 200
        assert "{{ keys|join }}</textarea>" in client.get("/endpoints", headers=HTML).text

        shown = client.post("/endpoints/template-preview", data={"kind": "slack", "template": "<{{ alert.key }}>",
                                                                 "state": "resolved"})
        assert shown.status_code == 200 and '<pre class="message">&lt;AAPL&gt;</pre>' in shown.text
        failing = client.post("/endpoints/template-preview", data={"kind": "teams", "template": "\n{{ nope }}"})
        assert 'data-ok="false"' in failing.text and "line 2: UndefinedError" in failing.text


def test_the_form_refuses_deep_or_function_printing_templates_on_the_field(settings: Settings) -> None:
    user, _ = new_user(settings)
    with api_client(settings) as client:
        sign_in(client, user.email)
        for template, reason in (("{{ " + "not " * 990 + "1 }}", "expressions nested too deep"),
                                 ("{{ " + "[" * 1500 + "]" * 1500 + " }}", "expressions nested too deep"),
                                 ("{{ ''.format }}", "attribute &#39;format&#39; of &#39;str&#39; object is unsafe")):
            refused = client.post("/endpoints", data={"kind": "slack", "target": SLACK, "template": template})
            assert refused.status_code == 422 and reason in refused.text, refused.text[-500:]
            shown = client.post("/endpoints/template-preview", data={"kind": "slack", "template": template})
            assert shown.status_code == 200 and 'data-ok="false"' in shown.text and reason in shown.text


@pytest.fixture
def server(settings: Settings) -> Iterator[str]:
    with serving(create_app(settings)) as url:
        yield url


def test_in_a_browser_the_preview_follows_the_template_and_a_slack_endpoint_is_added(
        server: str, page: Page, settings: Settings) -> None:  # noqa: F811 - the fixture imported above
    user, _ = new_user(settings)
    page.goto(server + "/login")
    page.get_by_label("E-mail").fill(user.email)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("link", name="Endpoints").click()

    page.locator("form.form select[name=kind]").select_option("slack")
    page.get_by_label("URL or address").fill(SLACK)
    template = page.get_by_label("Message template (optional")
    template.fill("{{ title }}\n{% for a in alerts %}• {{ a.key }}: {{ a.value|number }}\n{% endfor %}")
    page.get_by_role("button", name="Preview message").click()
    expect(page.locator("#template-preview-new pre.message")).to_have_text(
        "FIRING: High volume (AAPL, MSFT)\n• AAPL: 2.514e+06\n• MSFT: 2.0715e+06")

    template.fill("{{ title }}\n{{ alert.secret_stuff")
    template.press("End")
    template.type(" }}")  # typing previews by itself, after a pause
    expect(page.locator("#template-preview-new .error")).to_contain_text("line 2:")

    template.fill("*{{ state|upper }}* {{ keys|join(', ') }}")
    page.get_by_role("button", name="Add endpoint").click()
    row = page.locator("tr[data-endpoint]")
    expect(row).to_have_count(1)
    expect(row).to_contain_text("Slack")
    page.get_by_text("Message template (custom)").click()
    page.locator(".template-form select[name=state]").select_option("resolved")
    page.locator(".template-form").get_by_role("button", name="Preview").click()
    expect(page.locator(".template-form pre.message")).to_have_text("*RESOLVED* AAPL, MSFT")
