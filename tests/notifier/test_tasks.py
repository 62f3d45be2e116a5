"""Pure decisions of the delivery task: when a queued delivery is stale, how long a retry waits."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.settings import Settings
from notifier.attempt import Attempt
from notifier.channels import EndpointView
from notifier.channels.email import header_text, render
from notifier.deliveries import endpoint_generation
from notifier.tasks import retry_delay_s, stale_reason

GENERATION = endpoint_generation("webhook", "https://a.example/hook", "secret-1")
ENDPOINT = EndpointView("webhook", "https://a.example/hook", "secret-1", owner_id=7, generation=GENERATION, id=1)


def test_stale_deliveries_are_named_for_why() -> None:
    assert stale_reason(ENDPOINT, 7, GENERATION) is None
    assert stale_reason(None, 7, GENERATION) == "endpoint deleted"
    assert stale_reason(ENDPOINT, 8, GENERATION) == "endpoint owner changed"
    rotated = endpoint_generation("webhook", "https://a.example/hook", "secret-2")
    assert stale_reason(ENDPOINT, 7, rotated) == "endpoint changed since enqueue (secret rotated)"
    assert stale_reason(ENDPOINT, None, None) is None  # queued before deliveries carried a binding


def test_generation_follows_channel_address_and_secret() -> None:
    assert endpoint_generation("webhook", "https://a.example/hook", "s") == endpoint_generation(
        "webhook", "https://a.example/hook", "s")
    assert len({endpoint_generation("webhook", "https://a.example/hook", "s"),
                endpoint_generation("webhook", "https://b.example/hook", "s"),
                endpoint_generation("email", "https://a.example/hook", "s"),
                endpoint_generation("webhook", "https://a.example/hook", None)}) == 4


@given(st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)), st.integers(0, 20))
def test_a_retry_delay_is_always_finite_and_capped(retry_after: float | None, retries: int) -> None:
    settings = Settings(delivery_backoff_base_s=1, delivery_backoff_max_s=300)
    delay = retry_delay_s(Attempt(False, True, 1.0, 503, "HTTP 503", retry_after), retries, settings)
    assert math.isfinite(delay) and 0 <= delay <= 300


@pytest.mark.parametrize("name", ["volume\r\nBcc: victim@example.com", "a\nb", "a\rb", "tab\there", "nul\x00",
                                  "line\u2028sep", "\x85next"])
def test_control_characters_never_reach_a_header(name: str) -> None:
    notification = {"notification_id": "n1", "subscription_id": 1, "subscription_name": name, "condition": "x",
                    "state": "firing", "reminder": False, "evaluated_at": 0, "created_at": 0.0,
                    "alerts": [{"alert_id": "a", "key": "K\r\nX-Evil: 1", "state": "firing", "value": 1.0,
                                "window_start": 0, "window_end": 1, "evaluated_at": 1}]}
    message = render(notification, "Tocsin <alerts@example.com>", "ops@example.com", 3)
    subject = message["Subject"]
    assert not any(c in subject for c in "\r\n\t\x00\x85\u2028") and message["X-Evil"] is None
    headers = message.as_bytes().split(b"\n\n", 1)[0]
    assert b"\nX-Evil" not in headers and b"\nBcc" not in headers
    assert header_text(" a \r\n b ") == "a b"
