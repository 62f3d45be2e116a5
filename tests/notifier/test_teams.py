"""The Teams channel against a local receiver that checks the documented Adaptive Card envelope."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from core.settings import Settings
from devstack.receiver import WebhookReceiver
from notifier.channels import EndpointView
from notifier.channels.teams import CARD_VERSION, TeamsChannel
from notifier.notification import Notification
from subscriptions.templating import sample_notification
from tests.notifier.receivers import ADAPTIVE, ShapeChecked, teams_errors

SETTINGS = Settings(webhook_allow_hosts=["127.0.0.1"], webhook_total_timeout_s=5)


@pytest.fixture
def teams() -> Iterator[tuple[WebhookReceiver, ShapeChecked]]:
    answer = ShapeChecked(teams_errors, status=202)  # a Workflows webhook answers 202
    receiver = WebhookReceiver(answer=answer)
    yield receiver, answer
    receiver.close()


def _endpoint(url: str, template: str | None = None) -> EndpointView:
    return EndpointView("teams", url, None, owner_id=1, generation="g", id=8, template=template)


def _card(got: object) -> dict:
    return got.json["attachments"][0]["content"]  # type: ignore[attr-defined]


def shown(element: dict) -> list[str]:
    """The lines a Teams reader sees: a RichTextBlock's runs as written (no Markdown there); a TextBlock's
    Markdown as-is (a test asserting on it knows it is Markdown)."""
    if element["type"] == "RichTextBlock":
        return ["".join(run["text"] for run in element["inlines"])]
    if element["type"] == "Container":
        return [line for item in element["items"] for line in shown(item)]
    return [element["text"]]


def test_the_card_has_the_documented_envelope_title_text_and_alerts(teams) -> None:
    receiver, answer = teams
    attempt = TeamsChannel(SETTINGS).send(Notification.from_json(sample_notification("resolved")),
                                          _endpoint(receiver.url))
    assert attempt.ok and attempt.status_code == 202
    [got] = receiver.received
    assert not answer.rejected, answer.rejected
    assert got.json["type"] == "message" and got.json["attachments"][0]["contentType"] == ADAPTIVE
    card = _card(got)
    assert card["type"] == "AdaptiveCard" and card["version"] == CARD_VERSION
    title, condition, evaluated, alerts, context = card["body"]
    assert shown(title) == ["RESOLVED: High volume"] and title["inlines"][0]["color"] == "Good"
    assert shown(condition) == ["Condition: SUM(volume) OVER 5m > 2e6"]
    assert shown(evaluated) == ["Evaluated at 2026-01-01 00:00:00 UTC"]
    assert shown(alerts) == ["AAPL  2.514e+06 (resolved)", "MSFT  2.0715e+06 (resolved)"]
    assert shown(context) == ["Tocsin · notification sample-resolved · sequences AAPL 8, MSFT 4"]


def test_user_text_reads_exactly_as_written_with_no_markdown_or_backslashes(teams) -> None:
    """``COUNT\\(\\*\\)``: backslash escapes, which Teams clients can show literally. What a user wrote is now in
    RichTextBlocks, where Adaptive Cards interpret no Markdown, so it needs no escaping at all."""
    receiver, answer = teams
    alert = {**sample_notification()["alerts"][0], "key": "db_1*[x](y)<b>"}
    notification = {**sample_notification(), "alerts": [alert], "condition": "COUNT(*) > 5",
                    "subscription_name": "disk_full *now* [prod] <eu>"}
    assert TeamsChannel(SETTINGS).send(Notification.from_json(notification), _endpoint(receiver.url)).ok
    card = _card(receiver.received[0])
    assert not answer.rejected, answer.rejected
    assert [line for element in card["body"] for line in shown(element)] == [
        "FIRING: disk_full *now* [prod] <eu>",
        "Condition: COUNT(*) > 5",
        "Evaluated at 2026-01-01 00:00:00 UTC",
        "db_1*[x](y)<b>  2.514e+06 (firing)",
        "Tocsin · notification sample-firing · sequence 7",
    ]
    assert all(element["type"] != "TextBlock" for element in card["body"])  # nothing is read as Markdown
    assert "\\" not in json.dumps(card).replace("\\u00b7", "")  # not one backslash escape


def test_a_template_renders_the_text_block_with_values_markdown_escaped(teams) -> None:
    receiver, answer = teams
    alert = {**sample_notification()["alerts"][0], "key": "[click](http://evil.example)"}
    notification = Notification.from_json({**sample_notification(), "alerts": [alert],
                                           "condition": "COUNT(*) > 5 AND <x>"})
    template = ("**{{ alert.key }}** is {{ alert.value|number }} since {{ alert.window_start|ms_time }}: "
                "{{ subscription.condition }}")
    assert TeamsChannel(SETTINGS).send(notification, _endpoint(receiver.url, template)).ok
    text = _card(receiver.received[0])["body"][1]["text"]
    # only what Adaptive Cards' Markdown subset interprets (emphasis, links) is escaped: not ( ) < >
    assert text == r"**\[click\](http://evil.example)** is 2.514e+06 since 2025-12-31 23:55:00 UTC: COUNT(\*) > 5 AND <x>"
    assert not answer.rejected


def test_a_failing_template_falls_back_to_the_default_card(teams) -> None:
    receiver, answer = teams
    attempt = TeamsChannel(SETTINGS).send(Notification.from_json(sample_notification()),
                                          _endpoint(receiver.url, "{% for i in range(999) %}{% for j in range(999) %}"
                                                                  "{% endfor %}{% endfor %}"))
    assert attempt.ok and "loops ran over 10,000 iterations" in (attempt.error or "")
    assert shown(_card(receiver.received[0])["body"][1])[0].startswith("Condition:") and not answer.rejected


def test_a_throttled_teams_webhook_is_retried_after_its_retry_after() -> None:
    receiver = WebhookReceiver(fail_first=1, fail_status=429, retry_after="3")
    try:
        attempt = TeamsChannel(SETTINGS).send(Notification.from_json(sample_notification()), _endpoint(receiver.url))
    finally:
        receiver.close()
    assert not attempt.ok and attempt.retryable and attempt.retry_after_s == 3.0


def test_a_resolution_without_a_record_of_its_firing_says_so_in_the_cards_last_line(teams) -> None:
    receiver, answer = teams
    resolved = sample_notification("resolved")
    unknown = {**resolved, "alerts": [resolved["alerts"][0], {**resolved["alerts"][1], "state_unknown": True}]}
    assert TeamsChannel(SETTINGS).send(Notification.from_json(unknown), _endpoint(receiver.url)).ok
    [got] = receiver.received
    assert shown(_card(got)["body"][-1]) == [
        "Tocsin · notification sample-resolved · sequences AAPL 8, MSFT 4 · firing not on record: MSFT"]
    assert not answer.rejected, answer.rejected
