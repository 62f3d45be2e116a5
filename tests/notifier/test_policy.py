from __future__ import annotations

from datetime import UTC, datetime
from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from notifier.notification import build_notification, notification_id, summary
from notifier.policy import NOTIFY, KeyState, decide, reminder_due
from subscriptions.policy import AlertPolicy

T0 = 1_800_000_000.0


def test_first_firing_notifies_and_opens_the_episode() -> None:
    reason, state = decide(AlertPolicy(), KeyState(), "firing", T0)
    assert reason is NOTIFY and state == KeyState(T0, True)
    reason, state = decide(AlertPolicy(), state, "resolved", T0 + 5)
    assert reason is NOTIFY and state == KeyState(T0, False)


def test_cooldown_holds_back_a_flapping_key() -> None:
    policy = AlertPolicy(cooldown_s=600)
    _, state = decide(policy, KeyState(), "firing", T0)
    _, state = decide(policy, state, "resolved", T0 + 10)
    reason, state = decide(policy, state, "firing", T0 + 20)
    assert reason == "cool-down"
    reason, state = decide(policy, state, "resolved", T0 + 30)
    assert reason == "its firing was not notified"  # never resolve what was not announced
    assert decide(policy, state, "firing", T0 + 601)[0] is NOTIFY


def test_send_resolved_off_and_mute() -> None:
    _, state = decide(AlertPolicy(send_resolved=False), KeyState(), "firing", T0)
    reason, state = decide(AlertPolicy(send_resolved=False), state, "resolved", T0 + 1)
    assert reason == "send-resolved is off" and not state.open

    muted = AlertPolicy(muted_until=datetime.fromtimestamp(T0 + 60, UTC))
    assert decide(muted, KeyState(), "firing", T0)[0] == "muted"
    assert decide(muted, KeyState(), "firing", T0 + 61)[0] is NOTIFY
    naive = AlertPolicy(muted_until=datetime.fromtimestamp(T0 + 60, UTC).replace(tzinfo=None))
    assert naive.muted(T0) and not naive.muted(T0 + 61)  # a time without zone is UTC


def test_reminders() -> None:
    policy = AlertPolicy(renotify_s=3600)
    assert not reminder_due(AlertPolicy(), KeyState(T0, True), T0 + 10**6)  # no re-notify interval
    assert not reminder_due(policy, KeyState(T0, True), T0 + 3599)
    assert reminder_due(policy, KeyState(T0, True), T0 + 3600)
    assert reminder_due(policy, KeyState(), T0)  # fired while muted: told as soon as the mute is over
    muted = policy.model_copy(update={"muted_until": datetime.fromtimestamp(T0 + 60, UTC)})
    assert not reminder_due(muted, KeyState(), T0)


@given(
    cooldown=st.integers(0, 100),
    send_resolved=st.booleans(),
    gaps=st.lists(st.integers(0, 60), min_size=1, max_size=40),
)
def test_policy_invariants_over_any_episode_sequence(cooldown: int, send_resolved: bool, gaps: list[int]) -> None:
    """Over alternating firing/resolved transitions of one key, as the evaluator emits them:
    firings are notified at least ``cooldown`` apart, a resolution is only notified right after a
    notified firing, and a firing after a quiet period of ``cooldown`` is always notified."""
    policy = AlertPolicy(cooldown_s=cooldown, send_resolved=send_resolved)
    state, now, last_fired = KeyState(), T0, None
    sent: list[tuple[str, float]] = []
    for i, gap in enumerate(gaps):
        now += gap
        transition = "firing" if i % 2 == 0 else "resolved"
        reason, state = decide(policy, state, transition, now)
        if transition == "firing" and (last_fired is None or now - last_fired >= cooldown):
            assert reason is NOTIFY
        if reason is NOTIFY:
            if transition == "firing":
                last_fired = now
            sent.append((transition, now))
    firings = [t for kind, t in sent if kind == "firing"]
    assert all(b - a >= cooldown for a, b in pairwise(firings))
    for previous, current in zip([("start", 0.0), *sent], sent, strict=False):
        if current[0] == "resolved":
            assert previous[0] == "firing" and send_resolved


def test_notifications_are_named_by_their_alerts() -> None:
    alerts = [
        {"alert_id": i, "key": k, "state": "firing", "value": 1.0, "window_start": 0, "window_end": 60_000,
         "evaluated_at": 60_000}
        for i, k in (("b", "MSFT"), ("a", "AAPL"), ("c", "NVDA"), ("d", "TSLA"))
    ]
    nid = notification_id(["b", "a", "c", "d"])
    assert nid == notification_id(["a", "b", "c", "d"]) != notification_id(["a", "b", "c"])
    assert notification_id(["a"], reminder_at=T0) != notification_id(["a"]) != notification_id(["a"], T0 + 1)
    n = build_notification({"id": 3, "name": "volume", "condition": "COUNT(*) OVER 1m > 1"}, alerts, nid)
    assert [a["key"] for a in n["alerts"]] == ["AAPL", "MSFT", "NVDA", "TSLA"]
    assert n["state"] == "firing" and n["subscription_id"] == 3 and n["notification_id"] == nid
    assert summary(n) == "FIRING: volume (AAPL, MSFT, NVDA +1)"
