from __future__ import annotations

import ipaddress
import socket
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path

import psutil
import pytest
import trustme

from devstack.receiver import WebhookReceiver
from notifier.channels.webhook import (
    DestinationRefused,
    DestinationUnresolved,
    WebhookLimits,
    _public,
    check_destination,
    http_attempt,
    post_webhook,
    retry_after_s,
    sign,
    verify,
)

LOCAL = WebhookLimits(connect_timeout_s=2, read_timeout_s=2, total_timeout_s=5, allow_hosts=("127.0.0.1",))


def test_signature_verifies_and_rejects_tampering_and_replay() -> None:
    body = b'{"a":1}'
    now = int(time.time())
    header = f"t={now},v1={sign('s3cret-s3cret-s3cret', now, body)}"
    assert verify("s3cret-s3cret-s3cret", header, body)
    assert not verify("s3cret-s3cret-s3cret", header, b'{"a":2}')
    assert not verify("other-secret-other", header, body)
    assert not verify("s3cret-s3cret-s3cret", header, body, now=now + 301)
    assert not verify("s3cret-s3cret-s3cret", header, body, now=now - 301)  # from the future, too
    assert not verify("s3cret-s3cret-s3cret", "garbage", body)


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1/x", "http://localhost/x", "http://10.0.0.1/", "http://169.254.169.254/latest", "http://[::1]/",
     "ftp://example.com/", "http://192.168.1.1/", "http://[::ffff:127.0.0.1]/", "not a url",
     "http://2130706433/", "http://0x7f.1/", "http://017700000001/", "http://127.1/", "http://0/",
     # IPv4 carried in IPv6: NAT64 (well-known and local-use prefixes) and 6to4 reach the private IPv4 inside
     "http://[64:ff9b::a00:1]/", "http://[64:ff9b::7f00:1]/", "http://[64:ff9b:1::a9fe:a9fe]/",
     "http://[2002:a00:1::1]/", "http://[2002:7f00:1::1]/",
     # ... and IPv4-compatible (deprecated), IPv4-translated, NAT64 local-use at its /48 position, site-local
     "http://[::127.0.0.1]/", "http://[::7f00:1]/", "http://[::10.0.0.1]/", "http://[::169.254.169.254]/",
     "http://[::ffff:0:127.0.0.1]/", "http://[::ffff:0:a00:1]/", "http://[64:ff9b:1:a00:0:100::]/",
     "http://[64:ff9b:1::808:808]/", "http://[fec0::1]/"],
)
def test_ssrf_guard_refuses_non_public_destinations(url: str) -> None:
    with pytest.raises(DestinationRefused):
        check_destination(url, allow_hosts=[])


@pytest.mark.parametrize("address", ["8.8.8.8", "2606:4700::1111", "64:ff9b::808:808", "2002:808:808::1"])
def test_ssrf_guard_judges_an_embedded_ipv4_address_by_itself(address: str) -> None:
    """The same encodings of a public IPv4 address pass: it is the address inside that decides."""
    assert _public(ipaddress.ip_address(address))


def test_ssrf_guard_allow_list_approves_the_resolved_addresses() -> None:
    assert check_destination("http://127.0.0.1:8080/hook", allow_hosts=["127.0.0.1"]).addresses == ("127.0.0.1",)
    assert "127.0.0.1" in check_destination("http://localhost:8080/hook", allow_hosts=["localhost"]).addresses


def _resolving(monkeypatch: pytest.MonkeyPatch, host: str, *answers: str) -> list[str]:
    """Make ``host`` resolve to the given addresses, one per lookup (the last one repeats); returns the lookups."""
    lookups: list[str] = []
    real = socket.getaddrinfo

    def getaddrinfo(name, port, *args, **kwargs):
        if name != host:
            return real(name, port, *args, **kwargs)
        address = answers[min(len(lookups), len(answers) - 1)]
        lookups.append(address)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return lookups


def test_dns_rebinding_cannot_redirect_the_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """The name passes the guard as 127.0.0.1 (allowed), then rebinds to 127.0.0.2 (not allowed)."""
    approved = WebhookReceiver()
    port = approved.server.server_address[1]
    internal = WebhookReceiver(host="127.0.0.2", port=port)
    lookups = _resolving(monkeypatch, "hooks.rebind.test", "127.0.0.1", "127.0.0.2")
    try:
        attempt = post_webhook(f"http://hooks.rebind.test:{port}/hook", {"x": 1}, "k" * 20, "id-1", LOCAL)
    finally:
        approved.close()
        internal.close()
    assert attempt.ok, attempt
    assert internal.attempts == 0 and len(approved.received) == 1
    assert lookups == ["127.0.0.1"]  # resolved once, by the guard
    assert approved.received[0].headers["Host"] == f"hooks.rebind.test:{port}"


def test_a_name_resolving_to_a_private_address_among_public_ones_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    _resolving(monkeypatch, "hooks.mixed.test", "10.1.2.3")
    attempt = post_webhook("http://hooks.mixed.test/hook", {}, None, "id", WebhookLimits())
    assert not attempt.ok and not attempt.retryable and "non-public address 10.1.2.3" in attempt.error


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def _tls_receiver(ca: trustme.CA, directory: Path, name: str) -> WebhookReceiver:
    cert = ca.issue_cert(name)
    chain, key = directory / f"{name}.pem", directory / f"{name}.key"
    cert.private_key_and_cert_chain_pem.write_to_path(str(chain))
    cert.private_key_pem.write_to_path(str(key))
    return WebhookReceiver(certificate=(chain, key))


def test_https_to_a_pinned_address_keeps_sni_host_and_certificate_checks(ca: trustme.CA, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    limits = WebhookLimits(connect_timeout_s=2, read_timeout_s=2, total_timeout_s=5, allow_hosts=("127.0.0.1",),
                           ca_file=tmp_path / "ca.pem")
    receiver = _tls_receiver(ca, tmp_path, "hooks.example.test")
    port = receiver.server.server_address[1]
    _resolving(monkeypatch, "hooks.example.test", "127.0.0.1")
    try:
        attempt = post_webhook(f"https://hooks.example.test:{port}/hook", {"x": 1}, "k" * 20, "id-1", limits)
        wrong_name = post_webhook(f"https://127.0.0.1:{port}/hook", {"x": 1}, "k" * 20, "id-2", limits)
        untrusted = post_webhook(f"https://hooks.example.test:{port}/hook", {"x": 1}, "k" * 20, "id-3",
                                 WebhookLimits(allow_hosts=("127.0.0.1",)))
    finally:
        receiver.close()
    assert attempt.ok, attempt
    [got] = receiver.received
    assert got.headers["Host"] == f"hooks.example.test:{port}"
    assert receiver.server_names[0] == "hooks.example.test"
    assert verify("k" * 20, got.headers["Tocsin-Signature"], got.body)
    # The certificate is checked against the URL's host, and against the configured CAs only.
    assert not wrong_name.ok and "CERTIFICATE_VERIFY_FAILED" in wrong_name.error
    assert not untrusted.ok and "CERTIFICATE_VERIFY_FAILED" in untrusted.error


@pytest.mark.timeout(60)
def test_a_receiver_sending_one_byte_a_second_is_cut_at_the_total_deadline() -> None:
    receiver = WebhookReceiver(trickle_bytes_per_s=1)
    limits = WebhookLimits(connect_timeout_s=2, read_timeout_s=5, total_timeout_s=3, allow_hosts=("127.0.0.1",))
    started = time.monotonic()
    try:
        attempt = post_webhook(receiver.url, {"x": 1}, None, "id", limits)
    finally:
        receiver.close()
    elapsed = time.monotonic() - started
    assert 2.5 < elapsed < 3 + 1.5, elapsed  # every read returns in time, so only the total can end it
    assert not attempt.ok and attempt.retryable and "3 s deadline" in attempt.error


@pytest.mark.timeout(60)
def test_an_endless_error_body_is_read_only_up_to_the_cap() -> None:
    receiver = WebhookReceiver(endless_status=503)
    rss = psutil.Process().memory_info().rss
    try:
        attempts = [post_webhook(receiver.url, {"x": 1}, None, "id", LOCAL) for _ in range(5)]
    finally:
        receiver.close()
    assert all(not a.ok and a.retryable and a.status_code == 503 for a in attempts)
    assert attempts[0].error == "HTTP 503 (response body cut at 64 KiB)"
    assert all(a.latency_ms < 4_000 for a in attempts)  # stopped at the cap, not at the deadline
    assert psutil.Process().memory_info().rss - rss < 50 * 2**20


def test_a_success_with_an_endless_body_is_delivered_without_reading_it() -> None:
    receiver = WebhookReceiver(endless_status=200)
    try:
        attempt = post_webhook(receiver.url, {"x": 1}, None, "id", LOCAL)
    finally:
        receiver.close()
    assert attempt.ok and attempt.status_code == 200


def test_dns_failures_are_worth_retrying(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*_: object, **__: object) -> None:
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr(socket, "getaddrinfo", fail)
    with pytest.raises(DestinationUnresolved):
        check_destination("https://hooks.example.com/x", allow_hosts=[])
    attempt = post_webhook("https://hooks.example.com/x", {}, None, "id", WebhookLimits())
    assert not attempt.ok and attempt.retryable and "cannot resolve hooks.example.com" in attempt.error


def test_post_signs_and_classifies_responses() -> None:
    receiver = WebhookReceiver(fail_first=1, fail_status=503)
    try:
        first = post_webhook(receiver.url, {"x": 1}, "k" * 20, "id-1", LOCAL)
        assert not first.ok and first.retryable and first.status_code == 503 and first.error == "HTTP 503"
        second = post_webhook(receiver.url, {"x": 1}, "k" * 20, "id-1", LOCAL)
        assert second.ok
        got = receiver.received[0]
        assert got.headers["Idempotency-Key"] == "id-1"
        assert verify("k" * 20, got.headers["Tocsin-Signature"], got.body)
    finally:
        receiver.close()
    refused = post_webhook(receiver.url, {}, None, "id-2", LOCAL)
    assert refused.status_code is None and refused.retryable and refused.error


def test_retry_classification() -> None:
    assert http_attempt(429, 1).retryable and http_attempt(500, 1).retryable
    assert not http_attempt(400, 1).retryable and not http_attempt(404, 1).retryable
    assert http_attempt(204, 1).ok and not http_attempt(204, 1).error
    assert http_attempt(503, 1, retry_after_s=7).retry_after_s == 7


NOW = 1_800_000_000.0


@pytest.mark.parametrize(("header", "expected"), [
    (None, None), ("", None), ("7", 7.0), ("2.5", 2.5), ("nan", None), ("NaN", None), ("inf", None),
    ("-inf", None), ("-5", 0.0), ("1e300", 1e300), ("soon", None), ("1e309", None), ("-1e309", None),
    ("9" * 30, 1e30), ("1" * 5000, None), ("0x10", None), ("Sat, 01 Jan 10000 00:00:00 GMT", None),
    ("Fri, 31 Dec 9999 23:59:59 GMT", 253402300799.0 - NOW), ("Mon, 32 Foo 2020", None),
    (format_datetime(datetime.fromtimestamp(NOW + 30, UTC), usegmt=True), 30.0),
    (format_datetime(datetime.fromtimestamp(NOW, UTC) - timedelta(days=1), usegmt=True), 0.0),
])
def test_retry_after_is_a_finite_non_negative_delay_or_nothing(header: str | None, expected: float | None) -> None:
    assert retry_after_s(header, now=NOW) == expected
