"""Alert e-mail: a plain-text and an HTML part, sent over SMTP with optional TLS and auth.

SMTP reply codes classify failures like HTTP statuses do for webhooks: 4xx and
network trouble are transient and retried, 5xx are permanent.
"""

from __future__ import annotations

import html
import json
import re
import smtplib
import ssl
import time
from datetime import UTC, datetime
from email.message import EmailMessage
from email.utils import formatdate, make_msgid
from functools import lru_cache
from pathlib import Path
from typing import ClassVar

from jinja2 import Environment, FileSystemLoader, select_autoescape

from core.settings import Settings
from notifier.attempt import Attempt
from notifier.channels import EndpointView, register
from notifier.notification import Notification, summary
from notifier.rendering import message, noted, sequences, unknown_states
from subscriptions.channel_kinds import EndpointKind
from subscriptions.schemas import EMAIL_ADDRESS

SUBJECT_PREFIX = "[Tocsin]"
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _ms_time(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _value(value: float | None) -> str:
    return "-" if value is None else f"{value:,.6g}"


@lru_cache(maxsize=1)
def _templates() -> Environment:
    env = Environment(
        loader=FileSystemLoader(Path(__file__).parents[1] / "templates"),  # notifier/templates
        autoescape=select_autoescape(["html"]),
        trim_blocks=False,
    )
    env.filters["ms_time"] = _ms_time
    env.filters["value"] = _value
    return env


def header_text(value: str) -> str:
    """A header value from free text: control characters (CR/LF above all) become spaces.

    ``email`` refuses header values with line breaks (they would inject headers),
    and a name or key is data, not headers: it is shown, flattened.
    """
    return " ".join(_CONTROL.sub(" ", value).split())


def render(notification: dict, sender: str, recipient: str, endpoint_id: int, body: str | None = None) -> EmailMessage:
    """The message; ``body`` (an endpoint template's text) replaces the default plain text and shows in the HTML."""
    title = summary(notification)
    message = EmailMessage()
    message["Subject"] = header_text(f"{SUBJECT_PREFIX} {title}")
    message["From"] = sender
    message["To"] = recipient
    message["Date"] = formatdate(localtime=False)
    # Deterministic, so a receiving system can drop a redelivered copy.
    message["Message-ID"] = make_msgid(idstring=f"{notification['notification_id']}.{endpoint_id}", domain="tocsin")
    message["X-Tocsin-Notification"] = notification["notification_id"]
    if numbered := sequences(notification):  # JSON, key -> sequence: ASCII, no line breaks
        message["X-Tocsin-Sequence"] = json.dumps(numbered, separators=(",", ":"))
    if unknown := unknown_states(notification):  # JSON, the keys resolved without a record of their firing
        message["X-Tocsin-State-Unknown"] = json.dumps(unknown, separators=(",", ":"))
    env = _templates()
    if body is not None:
        message.set_content(body)
        message.add_alternative(f'<pre style="font: inherit; white-space: pre-wrap">{html.escape(body)}</pre>',
                                subtype="html")
        return message
    message.set_content(env.get_template("email.txt").render(n=notification, title=title))
    message.add_alternative(env.get_template("email.html").render(n=notification, title=title), subtype="html")
    return message


def _tls_context(settings: Settings) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(settings.smtp_ca_file) if settings.smtp_ca_file else None)


def send_email(message: EmailMessage, settings: Settings) -> Attempt:
    started = time.perf_counter()

    def failed(retryable: bool, error: str, code: int | None = None) -> Attempt:
        return Attempt(False, retryable, (time.perf_counter() - started) * 1000, code, error)

    try:
        client: smtplib.SMTP
        if settings.smtp_ssl:
            client = smtplib.SMTP_SSL(settings.smtp_host, settings.smtp_port, timeout=settings.smtp_timeout_s,
                                      context=_tls_context(settings))
        else:
            client = smtplib.SMTP(settings.smtp_host, settings.smtp_port, timeout=settings.smtp_timeout_s)
        with client:
            if settings.smtp_starttls and not settings.smtp_ssl:
                client.starttls(context=_tls_context(settings))
            if settings.smtp_username:
                password = settings.smtp_password.get_secret_value() if settings.smtp_password else ""
                client.login(settings.smtp_username, password)
            refused = client.send_message(message)
    except smtplib.SMTPRecipientsRefused as exc:
        codes = [code for code, _ in exc.recipients.values()]
        return failed(all(400 <= c < 500 for c in codes), f"recipients refused: {exc.recipients}", max(codes))
    except smtplib.SMTPResponseException as exc:
        reply = exc.smtp_error.decode(errors="replace") if isinstance(exc.smtp_error, bytes) else str(exc.smtp_error)
        return failed(400 <= exc.smtp_code < 500, f"SMTP {exc.smtp_code}: {reply}", exc.smtp_code)
    except smtplib.SMTPNotSupportedError as exc:  # e.g. AUTH without TLS: a configuration to fix, not a blip
        return failed(False, f"{type(exc).__name__}: {exc}")
    except (smtplib.SMTPException, OSError) as exc:  # disconnects, timeouts, refused connections, TLS errors
        return failed(True, f"{type(exc).__name__}: {exc}")
    if refused:  # only some recipients refused; we send to one, so this is defensive
        return failed(True, f"recipients refused: {refused}")
    return Attempt(True, False, (time.perf_counter() - started) * 1000, 250)


def check_address(target: str) -> str:
    if not EMAIL_ADDRESS.match(target):
        raise ValueError("must be one e-mail address, like ops@example.com")
    return target


class EmailChannel:
    """The notification as a plain-text and HTML message to one address, over the configured SMTP server."""

    kind: ClassVar[EndpointKind] = EndpointKind(
        name="email", label="e-mail", check_target=check_address, has_secret=False, position=20,
        placeholder="ops@example.com",
        help="One e-mail address. Each notification arrives as one message (plain text and HTML).",
        template_use="the message body (plain text)", template_escape="text",
    )

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    @classmethod
    def payload_preview(cls, notification: dict, template: str | None, settings: Settings) -> dict:
        """The subject and plain-text body of ``notification`` (the endpoints page's preview)."""
        text = message(notification, template, settings, "text", lambda _values: "") if template else None
        email = render(notification, settings.smtp_from, "ops@example.com", 0, text.text if text else None)
        body = email.get_body(("plain",))
        return {"subject": email["Subject"], "body": body.get_content() if body is not None else ""}

    @classmethod
    def longest_attempt_s(cls, settings: Settings) -> float:
        return 2 * settings.smtp_timeout_s  # the timeout bounds each socket operation, not the whole: twice it

    def send(self, notification: Notification, endpoint: EndpointView) -> Attempt:
        data = notification.to_json()
        text = message(data, endpoint.template, self.settings, "text", lambda _values: "") if endpoint.template else None
        body = text.text if text is not None and text.error is None else None  # a failed template: the default
        email = render(data, self.settings.smtp_from, endpoint.target, endpoint.id, body)
        return noted(send_email(email, self.settings), text.error if text is not None else None)


register(EmailChannel)
