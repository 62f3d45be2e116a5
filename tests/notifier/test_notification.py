"""The notification contract: what is enqueued is what the task reads, through JSON, and anything else is named."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from notifier.notification import (
    MalformedNotificationError,
    Notification,
    build_notification,
    make_notification,
    notification_id,
)
from notifier.notification import test_notification as made_up  # not collected as a test

texts = st.text(max_size=20)
numbers = st.one_of(st.none(), st.integers(-(2**53), 2**53), st.floats(allow_nan=False, allow_infinity=False))
alerts = st.fixed_dictionaries({
    "alert_id": texts, "key": texts, "state": st.sampled_from(["firing", "resolved"]), "value": numbers,
    "window_start": st.integers(0, 2**45), "window_end": st.integers(0, 2**45), "evaluated_at": st.integers(0, 2**45),
})
subscriptions = st.fixed_dictionaries({"id": st.one_of(st.none(), st.integers(1, 2**31 - 1)), "name": texts,
                                       "condition": texts})
marks = st.fixed_dictionaries({}, optional={
    "test": st.just(True), "operator": st.just(True),
    "watchdog": st.fixed_dictionaries({"rule": texts, "since": st.floats(0, 2e9), "detail": texts})})


@given(subscriptions, st.lists(alerts, min_size=1, max_size=5), st.booleans(), marks)
def test_a_notification_survives_the_queue_unchanged(subscription: dict, members: list[dict], reminder: bool,
                                                     extra: dict) -> None:
    sent = make_notification(subscription, members, notification_id(a["alert_id"] for a in members), reminder,
                             **extra)
    wire = json.loads(json.dumps(sent.to_json()))  # what Celery's JSON serializer does
    received = Notification.from_json(wire)
    assert received == sent and received.to_json() == wire
    assert ({"test", "operator", "watchdog"} & set(wire)) == set(extra)  # optional fields only when set


def test_fields_the_contract_does_not_know_travel_through_unchanged() -> None:
    payload = {**made_up(1, 60_000).to_json(), "enqueued_at": 12.5}  # what benchmarks/notifier.py adds
    payload["alerts"][0]["note"] = "x"
    assert Notification.from_json(payload).to_json() == payload


def test_the_json_form_is_the_payload_receivers_always_got() -> None:
    alert = {"alert_id": "a1", "key": "AAPL", "state": "firing", "value": 2.5, "window_start": 0, "window_end": 60_000,
             "evaluated_at": 60_000}
    payload = build_notification({"id": 3, "name": "volume", "condition": "c"}, [alert], "n1")
    assert set(payload) == {"notification_id", "subscription_id", "subscription_name", "condition", "state",
                            "reminder", "evaluated_at", "created_at", "alerts"}
    assert payload["alerts"] == [alert] and payload["subscription_id"] == 3
    assert made_up(7, 60_000).to_json()["test"] is True


def test_a_crossing_says_so_and_a_state_edge_reads_as_before() -> None:
    from evaluator.transition import Transition
    crossing = Transition("c1", 3, "AAPL", "firing", 101.0, 0, 60_000, 60_000, kind="crossing").to_dict()
    edge = Transition("e1", 3, "MSFT", "firing", 99.0, 0, 60_000, 60_000).to_dict()
    payload = build_notification({"id": 3, "name": "p", "condition": "c"}, [crossing, edge], "n1")
    assert [a.get("kind") for a in payload["alerts"]] == ["crossing", None]
    assert "kind" not in payload["alerts"][1]


@pytest.mark.parametrize(("payload", "reason"), [
    (None, "notification is NoneType, not an object"),
    ([], "notification is list, not an object"),
    ({}, "notification has no notification_id"),
    ({"notification_id": ""}, "notification has no notification_id"),
    ({"subscription_id": "1"}, "notification has no valid subscription_id"),
    ({"state": 1}, "notification has no state"),
    ({"alerts": []}, "notification has no alerts with keys"),
    ({"alerts": [{"alert_id": "a"}]}, "notification has no alerts with keys"),
    ({"reminder": "yes"}, "notification field reminder: Input should be a valid boolean"),
])
def test_anything_else_is_malformed_and_says_why(payload: object, reason: str) -> None:
    good = made_up(1, 60_000).to_json()
    with pytest.raises(MalformedNotificationError) as caught:
        Notification.from_json({**good, **payload} if isinstance(payload, dict) and payload else payload)
    assert str(caught.value) == reason
