"""The Slack channel against a local receiver that checks Slack's documented incoming-webhook shape."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from core.settings import Settings
from devstack.receiver import WebhookReceiver
from notifier.channels import EndpointView
from notifier.channels.slack import SlackChannel
from notifier.notification import Notification
from subscriptions.templating import sample_notification
from tests.notifier.receivers import ShapeChecked, slack_errors

SETTINGS = Settings(webhook_allow_hosts=["127.0.0.1"], webhook_total_timeout_s=5)


@pytest.fixture
def slack() -> Iterator[tuple[WebhookReceiver, ShapeChecked]]:
    answer = ShapeChecked(slack_errors, status=200)
    receiver = WebhookReceiver(answer=answer)
    yield receiver, answer
    receiver.close()


def _endpoint(url: str, template: str | None = None) -> EndpointView:
    return EndpointView("slack", url, None, owner_id=1, generation="g", id=7, template=template)


def _notification(**changes: object) -> Notification:
    return Notification.from_json({**sample_notification(), **changes})


def test_the_default_message_has_slacks_shape_and_lists_the_alerts(slack) -> None:
    receiver, answer = slack
    attempt = SlackChannel(SETTINGS).send(_notification(), _endpoint(receiver.url))
    assert attempt.ok and attempt.status_code == 200 and attempt.error is None
    [got] = receiver.received
    assert not answer.rejected and set(got.json) == {"text", "blocks"}
    assert got.json["text"].startswith("*FIRING: High volume (AAPL, MSFT)*")
    assert "• *AAPL*: 2.514e+06" in got.json["text"] and "`SUM(volume) OVER 5m &gt; 2e6`" in got.json["text"]
    assert [b["type"] for b in got.json["blocks"]] == ["section", "context"]
    context = got.json["blocks"][1]["elements"][0]["text"]
    assert context == "Tocsin · notification sample-firing · sequences AAPL 7, MSFT 3"
    assert got.headers["Content-Type"] == "application/json"


def test_a_template_renders_the_text_and_a_key_cannot_mention_the_channel(slack) -> None:
    receiver, answer = slack
    hostile = _notification(alerts=[{**sample_notification()["alerts"][0], "key": "<!channel> <http://evil|x>"}])
    template = "<!here> {{ state|upper }}: {% for a in alerts %}{{ a.key }} at {{ a.value|number }}{% endfor %}"
    assert SlackChannel(SETTINGS).send(hostile, _endpoint(receiver.url, template)).ok
    [got] = receiver.received
    # The author's own mention stays; the key's mention and link are escaped, as Slack documents.
    assert got.json["text"] == "<!here> FIRING: &lt;!channel&gt; &lt;http://evil|x&gt; at 2.514e+06"
    assert got.json["blocks"][0]["text"]["text"] == got.json["text"] and not answer.rejected


def test_a_template_failing_at_send_time_sends_the_default_and_records_why(slack) -> None:
    receiver, _ = slack
    attempt = SlackChannel(SETTINGS).send(_notification(), _endpoint(receiver.url, "{{ alerts[5].key }}"))
    assert attempt.ok  # the alert is not lost
    assert attempt.error and "message template failed" in attempt.error and "the default message was sent" in attempt.error
    assert receiver.received[0].json["text"].startswith("*FIRING: High volume")


def test_a_long_message_is_cut_within_slacks_limits(slack) -> None:
    receiver, answer = slack
    many = [{**sample_notification()["alerts"][0], "key": f"K{i:04}" + "x" * 200} for i in range(40)]
    assert SlackChannel(SETTINGS).send(_notification(alerts=many), _endpoint(receiver.url)).ok
    [got] = receiver.received
    assert not answer.rejected and "… and 30 more" in got.json["text"]
    assert len(got.json["blocks"][0]["text"]["text"]) <= 3000


@pytest.mark.parametrize(("status", "retryable"), [(429, True), (500, True), (404, False), (400, False)])
def test_slacks_refusals_are_classified(status: int, retryable: bool) -> None:
    receiver = WebhookReceiver(fail_first=1, fail_status=status, retry_after="7" if status == 429 else None)
    try:
        attempt = SlackChannel(SETTINGS).send(_notification(), _endpoint(receiver.url))
    finally:
        receiver.close()
    assert not attempt.ok and attempt.retryable is retryable and attempt.status_code == status
    assert attempt.retry_after_s == (7.0 if status == 429 else None)


def test_the_ssrf_guard_covers_slack_endpoints() -> None:
    attempt = SlackChannel(Settings(webhook_allow_hosts=[])).send(_notification(), _endpoint("http://127.0.0.1:9/x"))
    assert not attempt.ok and not attempt.retryable and "non-public" in (attempt.error or "")


def unknown_resolution() -> dict:
    """The sample resolution, AAPL's sent without a record of its firing (a Redis node lost the policy state)."""
    resolved = sample_notification("resolved")
    return {**resolved, "alerts": [{**resolved["alerts"][0], "state_unknown": True}, resolved["alerts"][1]]}


@pytest.mark.parametrize("template", [None, "{{ state }}: {{ keys|join(', ') }}"])
def test_a_resolution_without_a_record_of_its_firing_says_so_whatever_the_template(slack, template) -> None:
    receiver, answer = slack
    assert SlackChannel(SETTINGS).send(Notification.from_json(unknown_resolution()), _endpoint(receiver.url, template)).ok
    [got] = receiver.received
    context = got.json["blocks"][1]["elements"][0]["text"]
    assert context == "Tocsin · notification sample-resolved · sequences AAPL 8, MSFT 4 · firing not on record: AAPL"
    assert not answer.rejected
