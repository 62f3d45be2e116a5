"""The local platform's SMTP sink (``python -m devstack.mailsink``, its output is ``var/logs/mail.log``) keeps each
message whole: a person reads the alert e-mail there, headers and decoded body, not only its subject."""

from __future__ import annotations

import smtplib
import time
from email.message import EmailMessage
from pathlib import Path

from devstack.mailsink import SEPARATOR
from devstack.patience import patient
from devstack.services import free_port, python_module, spawn, wait_for_port

ROOT = Path(__file__).resolve().parents[2]


def _multipart() -> EmailMessage:
    message = EmailMessage()
    message["From"] = "tocsin@example.test"
    message["To"] = "owner@example.test"
    message["Subject"] = "[Tocsin] FIRING: BTC-USD price above 100"
    # non-ASCII and long lines: sent quoted-printable, so only a decoded body reads as written
    message.set_content("Key BTC-USD fired at 12:00 — price 101.5 > 100.\n" + "detail " * 30 + "\n", cte="quoted-printable")
    message.add_alternative("<p>Key <b>BTC-USD</b> fired</p>", subtype="html")
    message.add_attachment(b"\x00\x01binary", maintype="application", subtype="octet-stream", filename="raw.bin")
    return message


def test_the_mail_log_holds_whole_messages(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "mail.log"
    sink = spawn("mail", python_module("devstack.mailsink", "--port", str(port)), log, cwd=ROOT)
    try:
        wait_for_port("127.0.0.1", port, timeout_s=60, process=sink.process)
        with smtplib.SMTP("127.0.0.1", port, timeout=30) as smtp:
            smtp.send_message(_multipart())
            second = EmailMessage()
            second["To"], second["Subject"] = "other@example.test", "[Tocsin] RESOLVED"
            second.set_content("resolved body")
            smtp.send_message(second)
        deadline = time.monotonic() + patient(60)
        while "resolved body" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
    finally:
        sink.stop()
    text = log.read_text()
    assert "Subject: [Tocsin] FIRING: BTC-USD price above 100" in text
    assert "From: tocsin@example.test" in text
    assert "Key BTC-USD fired at 12:00 — price 101.5 > 100." in text  # decoded, not quoted-printable
    assert "detail " * 30 in text
    assert "<p>Key <b>BTC-USD</b> fired</p>" in text
    assert "application/octet-stream: raw.bin (8 bytes, not shown)" in text
    assert text.count(SEPARATOR) == 4  # two messages, each framed
    assert text.index("BTC-USD fired") < text.index("resolved body")
