"""Pure decisions of the delivery task: when a queued delivery is stale, how long a retry or a busy delivery waits."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.settings import Settings
from notifier.attempt import Attempt
from notifier.channels import EndpointView
from notifier.channels.email import header_text, render
from notifier.deliveries import Busy, endpoint_generation
from notifier.tasks import busy_delay_s, busy_wait_s, retry_delay_s, stale_reason

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


def test_a_fast_endpoint_busy_with_itself_is_looked_at_again_in_milliseconds() -> None:
    """A burst to a receiver answering in 20 ms waited 1-3 s, then 2-6 s, per deferral (2 s busy delay): a burst
    of 300 to one endpoint took p99 4.1 s, max 8.4 s, at 35 deliveries/s (2026-11-27)."""
    settings = Settings(delivery_busy_delay_s=2.0, delivery_busy_min_delay_s=0.05)
    fast = Busy(endpoint_full=True, last_attempt_s=0.02)
    assert all(0.025 <= busy_delay_s(settings, fast, 0) <= 0.075 for _ in range(200))
    assert all(0.05 <= busy_delay_s(settings, fast, 1) <= 0.15 for _ in range(200))
    instant = Busy(endpoint_full=True, last_attempt_s=0.0)
    assert all(busy_delay_s(settings, instant, 0) >= 0.025 for _ in range(200))  # never a spin


def test_a_first_burst_to_an_endpoint_probes_from_the_shortest_delay() -> None:
    """No attempt of the endpoint has ended yet: start short and double, not a 2 s busy delay (a burst of 20 to a
    fresh endpoint answering in ~15 ms had p99 2.1 s)."""
    settings = Settings(delivery_busy_delay_s=2.0, delivery_busy_min_delay_s=0.05)
    first = Busy(endpoint_full=True, last_attempt_s=None)
    assert [max(busy_delay_s(settings, first, n) for _ in range(200)) <= 0.075 * 2 ** n for n in range(4)] == [True] * 4


def test_a_delivery_with_a_turn_comes_back_at_it_and_one_past_the_line_at_the_furthest_turn() -> None:
    settings = Settings(delivery_busy_delay_s=2.0, delivery_busy_min_delay_s=0.05)
    assert busy_delay_s(settings, Busy(True, 0.24, turn_s=3.75), 0) == 3.75  # the script spaced the line already
    assert busy_delay_s(settings, Busy(True, 0.24, turn_s=0.0), 0) > 0  # never a spin
    assert all(8 <= busy_delay_s(settings, Busy(True, 0.24, line_full=True), 0) <= 24 for _ in range(200))


@pytest.mark.parametrize("busy", [Busy(endpoint_full=False), Busy(endpoint_full=True, last_attempt_s=9.5)])
def test_an_owner_busy_elsewhere_or_a_slow_endpoint_waits_the_busy_delay(busy: Busy) -> None:
    settings = Settings(delivery_busy_delay_s=2.0)
    assert all(1.0 <= busy_delay_s(settings, busy, 0) <= 3.0 for _ in range(200))


def test_only_a_delivery_holding_an_owner_slot_to_wait_in_waits_in_the_thread() -> None:
    """The slot script decides who may wait (tests/notifier/test_records.py); the wait is twice the endpoint's
    last attempt time, never more than the setting."""
    settings = Settings(delivery_busy_wait_s=0.5)
    assert busy_wait_s(settings, Busy(endpoint_full=True, last_attempt_s=0.18, waiting=True)) == pytest.approx(0.36)
    assert busy_wait_s(settings, Busy(endpoint_full=True, last_attempt_s=0.4, waiting=True)) == 0.5
    assert busy_wait_s(settings, Busy(endpoint_full=True, last_attempt_s=0.18)) == 0.0  # no owner slot to wait in
    assert busy_wait_s(settings, Busy(endpoint_full=False)) == 0.0


@given(st.booleans(), st.one_of(st.none(), st.floats(0, 1e6)), st.integers(0, 10_000))
def test_a_busy_delay_grows_with_deferrals_and_stays_under_8x(endpoint_full: bool, took: float | None,
                                                              deferrals: int) -> None:
    settings = Settings(delivery_busy_delay_s=2.0, delivery_busy_min_delay_s=0.05)
    busy = Busy(endpoint_full, took if endpoint_full else None)
    delay = busy_delay_s(settings, busy, deferrals)
    assert math.isfinite(delay) and 0.025 <= delay <= 8 * 2.0 * 1.5
    if deferrals >= 9:  # 0.05 s doubled 9 times passes 16 s: every deferral that long waits the cap
        assert delay >= 8 * 2.0 * 0.5


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
