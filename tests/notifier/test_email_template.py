"""An e-mail endpoint's template is the plain-text body (and shows in the HTML part); a failing one is replaced."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from core.settings import Settings
from devstack.mailsink import MailSink
from notifier.channels import EndpointView
from notifier.channels.email import EmailChannel
from notifier.notification import Notification
from subscriptions.templating import sample_notification


@pytest.fixture
def sink() -> Iterator[MailSink]:
    mail = MailSink()
    yield mail
    mail.close()


def _send(sink: MailSink, template: str | None):
    settings = Settings(smtp_port=sink.bound_port)
    endpoint = EndpointView("email", "ops@example.com", None, owner_id=1, generation="g", id=3, template=template)
    return EmailChannel(settings).send(Notification.from_json(sample_notification()), endpoint)


def test_the_template_is_the_body_and_its_html_part_is_escaped(sink: MailSink) -> None:
    attempt = _send(sink, "{{ title }}\n{% for a in alerts %}<{{ a.key }}>\n{% endfor %}")
    assert attempt.ok and attempt.error is None
    [message] = sink.wait_for(1)
    assert message["Subject"] == "[Tocsin] FIRING: High volume (AAPL, MSFT)"
    assert message.get_body(("plain",)).get_content().splitlines() == ["FIRING: High volume (AAPL, MSFT)", "<AAPL>", "<MSFT>"]
    assert "&lt;AAPL&gt;" in message.get_body(("html",)).get_content()


def test_a_failing_template_sends_the_default_body_and_records_why(sink: MailSink) -> None:
    attempt = _send(sink, "{{ nope }}")
    assert attempt.ok and "message template failed" in (attempt.error or "")
    [message] = sink.wait_for(1)
    assert "Subscription: High volume (#1)" in message.get_body(("plain",)).get_content()
