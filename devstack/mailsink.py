"""A real SMTP server (aiosmtpd) that keeps what it receives: for tests and the local platform.

Optionally it offers STARTTLS or implicit TLS with a certificate of its own and
requires a login, so the notifier's TLS and auth options are exercised for real.
Run as a module it prints each message's subject:
``python -m devstack.mailsink --port 1025``.
"""

from __future__ import annotations

import argparse
import email
import email.policy
import ssl
import subprocess
import threading
import time
from dataclasses import dataclass, field
from email.message import EmailMessage
from pathlib import Path

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session

from devstack.patience import deadline, patient


def self_signed_certificate(directory: Path, host: str = "127.0.0.1") -> tuple[Path, Path]:
    """A throw-away certificate for ``host`` (and localhost), made with the openssl command."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / "smtp-cert.pem", directory / "smtp-key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-keyout", str(key),
         "-out", str(cert), "-subj", "/CN=localhost", "-addext", f"subjectAltName=IP:{host},DNS:localhost"],
        check=True, capture_output=True,
    )
    return cert, key


@dataclass
class MailSink:
    host: str = "127.0.0.1"
    port: int = 0
    certificate: tuple[Path, Path] | None = None  # (cert, key) to offer TLS
    implicit_tls: bool = False  # SMTPS instead of STARTTLS
    login: tuple[str, str] | None = None  # (user, password) to require
    messages: list[EmailMessage] = field(default_factory=list)

    def __post_init__(self) -> None:
        sink = self
        parameters: dict = {}
        context = None
        if self.certificate:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(*map(str, self.certificate))
            if not self.implicit_tls:
                parameters.update(tls_context=context, require_starttls=True)
        if self.login:
            parameters.update(authenticator=self._authenticate, auth_required=True)

        class Handler:
            async def handle_DATA(self, _server: SMTP, _session: Session, envelope: Envelope) -> str:  # noqa: N802 -- aiosmtpd's hook name
                raw = envelope.original_content or b""  # the bytes received (``content`` is the same unless decode_data)
                message = email.message_from_bytes(raw, policy=email.policy.default)
                sink.messages.append(message)
                return "250 Message accepted for delivery"

        self.controller = Controller(
            Handler(), hostname=self.host, port=self.port or _free_port(),
            ssl_context=context if self.implicit_tls else None, **parameters,
        )
        self.controller.start()

    def _authenticate(self, _server: SMTP, _session: Session, _envelope: Envelope, _mechanism: str, data: object
                      ) -> AuthResult:
        ok = isinstance(data, LoginPassword) and (data.login.decode(), data.password.decode()) == self.login
        return AuthResult(success=ok, handled=False)

    @property
    def bound_port(self) -> int:
        return self.controller.port

    def wait_for(self, count: int = 1, timeout_s: float = 30.0) -> list[EmailMessage]:
        until = deadline(timeout_s)
        while time.monotonic() < until:
            if len(self.messages) >= count:
                return list(self.messages)
            time.sleep(0.05)
        raise AssertionError(f"{len(self.messages)} of {count} e-mails arrived within {patient(timeout_s):g}s")

    def close(self) -> None:
        self.controller.stop()


def _free_port() -> int:
    from devstack.services import free_port

    return free_port()


def main() -> None:
    parser = argparse.ArgumentParser(description="An SMTP server that prints the alerts it receives.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=1025)
    args = parser.parse_args()
    sink = MailSink(args.host, args.port)
    print(f"SMTP sink on {args.host}:{sink.bound_port}", flush=True)
    seen = 0
    try:
        while True:
            for message in sink.messages[seen:]:
                print(f"mail to {message['To']}: {message['Subject']}", flush=True)
            seen = len(sink.messages)
            threading.Event().wait(0.5)
    except KeyboardInterrupt:
        sink.close()


if __name__ == "__main__":
    main()
