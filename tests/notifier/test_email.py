"""Alert e-mail through a real SMTP server (aiosmtpd): content, STARTTLS, SMTPS, auth, failures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.settings import Settings
from devstack.mailsink import MailSink, self_signed_certificate
from devstack.services import free_port
from notifier.channels.email import render, send_email
from notifier.notification import build_notification, notification_id

ALERTS = [
    {"alert_id": "a1", "key": "AAPL", "state": "firing", "value": 2_500_000.0, "window_start": 1_700_000_000_000,
     "window_end": 1_700_000_300_000, "evaluated_at": 1_700_000_300_000, "sequence": 4},
    {"alert_id": "a2", "key": "<MSFT>", "state": "firing", "value": 3_100_000.0, "window_start": 1_700_000_000_000,
     "window_end": 1_700_000_300_000, "evaluated_at": 1_700_000_300_000, "sequence": 12},
]
SUBSCRIPTION = {"id": 7, "name": "Heavy volume", "condition": "SUM(volume) OVER 5m > 2e6"}


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return self_signed_certificate(tmp_path_factory.mktemp("tls"))


def _notification() -> dict:
    return build_notification(SUBSCRIPTION, ALERTS, notification_id(["a1", "a2"]))


def _settings(sink: MailSink, **options: object) -> Settings:
    return Settings(smtp_host="127.0.0.1", smtp_port=sink.bound_port, smtp_from="Tocsin <alerts@example.com>",
                    smtp_timeout_s=5, **options)


def test_alert_email_arrives_with_text_and_html_parts() -> None:
    sink = MailSink()
    try:
        settings = _settings(sink)
        attempt = send_email(render(_notification(), settings.smtp_from, "ops@example.com", 3), settings)
        assert attempt.ok and attempt.status_code == 250
        [message] = sink.wait_for(1)
    finally:
        sink.close()
    assert message["To"] == "ops@example.com"
    assert message["From"] == "Tocsin <alerts@example.com>"
    assert message["Subject"] == "[Tocsin] FIRING: Heavy volume (<MSFT>, AAPL)"
    assert message["X-Tocsin-Notification"] == _notification()["notification_id"]
    assert json.loads(message["X-Tocsin-Sequence"]) == {"<MSFT>": 12, "AAPL": 4}  # each key's place in its order
    assert _notification()["notification_id"] in message["Message-ID"]
    text = message.get_body(("plain",)).get_content()
    html = message.get_body(("html",)).get_content()
    assert "SUM(volume) OVER 5m > 2e6" in text and "AAPL: 2.5e+06" in text and "2023-11-14 22:13:20 UTC" in text
    assert "<td>AAPL</td>" in html and "&lt;MSFT&gt;" in html and "<MSFT>" not in html  # keys are escaped


def test_a_resolution_without_a_record_of_its_firing_is_marked_in_a_header_and_the_body() -> None:
    resolved = [{**ALERTS[0], "state": "resolved", "value": None, "state_unknown": True},
                {**ALERTS[1], "state": "resolved", "value": None}]
    notification = build_notification(SUBSCRIPTION, resolved, notification_id(["a1", "a2"]))
    message = render(notification, "alerts@example.com", "ops@example.com", 3)
    assert json.loads(message["X-Tocsin-State-Unknown"]) == ["AAPL"]
    text = message.get_body(("plain",)).get_content()
    html = message.get_body(("html",)).get_content()
    [aapl] = [line for line in text.splitlines() if line.startswith("- AAPL")]
    [msft] = [line for line in text.splitlines() if line.startswith("- <MSFT>")]
    assert "firing not on record" in aapl and "firing not on record" not in msft
    assert html.count("firing not on record") == 1
    assert "X-Tocsin-State-Unknown" not in render(_notification(), "alerts@example.com", "ops@example.com", 3)


def test_starttls_with_login(certificate: tuple[Path, Path]) -> None:
    sink = MailSink(certificate=certificate, login=("alerts", "pa55word"))
    try:
        settings = _settings(sink, smtp_starttls=True, smtp_ca_file=certificate[0], smtp_username="alerts",
                             smtp_password="pa55word")
        assert send_email(render(_notification(), settings.smtp_from, "ops@example.com", 3), settings).ok
        assert len(sink.wait_for(1)) == 1

        wrong = settings.model_copy(update={"smtp_password": None})
        refused = send_email(render(_notification(), settings.smtp_from, "ops@example.com", 3), wrong)
        assert not refused.ok and not refused.retryable and refused.status_code == 535  # a permanent refusal

        plain = settings.model_copy(update={"smtp_starttls": False})
        refused = send_email(render(_notification(), settings.smtp_from, "ops@example.com", 3), plain)
        assert not refused.ok and not refused.retryable and "AUTH" in refused.error  # offered only over TLS
    finally:
        sink.close()
    assert len(sink.messages) == 1


def test_implicit_tls_verifies_the_server(certificate: tuple[Path, Path]) -> None:
    sink = MailSink(certificate=certificate, implicit_tls=True)
    try:
        settings = _settings(sink, smtp_ssl=True, smtp_ca_file=certificate[0])
        assert send_email(render(_notification(), settings.smtp_from, "ops@example.com", 3), settings).ok
        untrusted = send_email(render(_notification(), settings.smtp_from, "ops@example.com", 3),
                               settings.model_copy(update={"smtp_ca_file": None}))
        assert not untrusted.ok and "CERTIFICATE_VERIFY_FAILED" in untrusted.error
    finally:
        sink.close()


def test_unreachable_server_is_worth_retrying() -> None:
    settings = Settings(smtp_host="127.0.0.1", smtp_port=free_port(), smtp_timeout_s=2)
    attempt = send_email(render(_notification(), settings.smtp_from, "ops@example.com", 3), settings)
    assert not attempt.ok and attempt.retryable and attempt.status_code is None
