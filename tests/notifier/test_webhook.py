from __future__ import annotations

import time

import pytest

from notifier.webhook import DestinationRefused, check_destination, http_attempt, post_webhook, sign, verify
from infra.receiver import WebhookReceiver


def test_signature_verifies_and_rejects_tampering_and_replay() -> None:
    body = b'{"a":1}'
    now = int(time.time())
    header = f"t={now},v1={sign('s3cret-s3cret-s3cret', now, body)}"
    assert verify("s3cret-s3cret-s3cret", header, body)
    assert not verify("s3cret-s3cret-s3cret", header, b'{"a":2}')
    assert not verify("other-secret-other", header, body)
    assert not verify("s3cret-s3cret-s3cret", header, body, now=now + 301)
    assert not verify("s3cret-s3cret-s3cret", "garbage", body)


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1/x", "http://localhost/x", "http://10.0.0.1/", "http://169.254.169.254/latest", "http://[::1]/",
     "ftp://example.com/", "http://192.168.1.1/"],
)
def test_ssrf_guard_refuses_non_public_destinations(url: str) -> None:
    with pytest.raises(DestinationRefused):
        check_destination(url, allow_hosts=[])


def test_ssrf_guard_allow_list() -> None:
    check_destination("http://127.0.0.1:8080/hook", allow_hosts=["127.0.0.1"])
    check_destination("http://localhost:8080/hook", allow_hosts=["localhost"])


def test_post_signs_and_classifies_responses() -> None:
    receiver = WebhookReceiver(fail_first=1, fail_status=503)
    try:
        first = post_webhook(receiver.url, {"x": 1}, "k" * 20, "id-1", 2, 2)
        assert not first.ok and first.retryable and first.status_code == 503
        second = post_webhook(receiver.url, {"x": 1}, "k" * 20, "id-1", 2, 2)
        assert second.ok
        got = receiver.received[0]
        assert got.headers["Idempotency-Key"] == "id-1"
        assert verify("k" * 20, got.headers["Tocsin-Signature"], got.body)
    finally:
        receiver.close()
    refused = post_webhook(receiver.url, {}, None, "id-2", 0.5, 0.5)
    assert refused.status_code is None and refused.retryable and refused.error


def test_retry_classification() -> None:
    assert http_attempt(429, 1).retryable and http_attempt(500, 1).retryable
    assert not http_attempt(400, 1).retryable and not http_attempt(404, 1).retryable
    assert http_attempt(204, 1).ok and not http_attempt(204, 1).error
    assert http_attempt(503, 1, retry_after_s=7).retry_after_s == 7
