"""Applying a subscription's alert policy: which transitions become notifications, per key.

Pure decisions over a small per-key state, so they can be tested without Redis:

- *mute*: nothing is sent until ``muted_until``;
- *cool-down*: a key that fired and was notified is not notified again for
  ``cooldown_s``, however often it flaps;
- *re-notify*: a key that stays firing is reminded every ``renotify_s`` (also a key
  whose firing was muted or cooled down, once the mute or cool-down is over);
- *send-resolved*: whether leaving the condition is notified at all. A resolution
  is only sent for a firing episode the subscriber was told about - or, when the key's
  state is *unknown* (no record at all: lost with a Redis node that came back empty, or
  never kept), for one the subscriber may have been told about: a resolve the receiver
  did not need is harmless, a firing nothing closes is silence for ever. Such a
  resolution is marked ``state_unknown`` (``notifier.dispatcher``); send-resolved and
  mute still apply to it.

The policy itself is part of the subscription (``subscriptions.policy.AlertPolicy``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from subscriptions.policy import AlertPolicy

NOTIFY = None  # the reason of a decision that notifies


@dataclass(frozen=True)
class KeyState:
    """What was last told about one (subscription, key)."""

    notified_at: float | None = None  # unix seconds of the last firing or reminder notification
    open: bool = False  # a firing was notified and its resolution is still due
    # The alert id of the firing that opened the episode told about: its resolution carries it as
    # ``episode_id`` (a resolve has an id of its own), so a receiver closes what that firing opened
    # (PagerDuty's dedup_key). Kept after the resolution, so a re-handled resolve finds it again.
    episode: str | None = None
    # False only for :data:`UNKNOWN`: no record of the key at all, so nothing says whether its firing was told.
    # Never stored: a stored state is known.
    known: bool = True

    def to_dict(self) -> dict:
        return {"notified_at": self.notified_at, "open": self.open, "episode": self.episode}

    @classmethod
    def from_dict(cls, data: dict | None) -> KeyState:
        return cls(data["notified_at"], data["open"], data.get("episode")) if data else UNKNOWN


UNKNOWN = KeyState(known=False)
"""The state of a key with no record: as the initial state, except that a resolution is not taken for one whose
firing was held back."""


def decide(policy: AlertPolicy, state: KeyState, transition: str, now: float,
           alert_id: str | None = None) -> tuple[str | None, KeyState]:
    """Whether a ``firing``/``resolved`` transition is notified: (None or the reason not to, new state).

    A notified firing opens an episode named by its ``alert_id``; the resolution keeps that name. A resolution of
    an :data:`UNKNOWN` state is decided as one of an open episode whose name is lost (see
    :func:`resolves_unknown`). The new state is always known.
    """
    unknown, state = not state.known, replace(state, known=True)
    if transition == "firing":
        if policy.muted(now):
            return "muted", state
        if state.notified_at is not None and now - state.notified_at < policy.cooldown_s:
            return "cool-down", state
        return NOTIFY, KeyState(now, True, alert_id)
    if not state.open and not unknown:
        return "its firing was not notified", state
    closed = KeyState(state.notified_at, False, state.episode)
    if not policy.send_resolved:
        return "send-resolved is off", closed
    if policy.muted(now):
        return "muted", closed
    return NOTIFY, closed


def resolves_unknown(state: KeyState, transition: str) -> bool:
    """Whether ``transition``, if notified, is a resolution sent without knowing that its firing was."""
    return transition == "resolved" and not state.known


def reminder_due(policy: AlertPolicy, state: KeyState, now: float) -> bool:
    """Whether a key that is still firing should be reminded now."""
    if policy.renotify_s is None or policy.muted(now):
        return False
    if state.notified_at is None:
        return True
    return now - state.notified_at >= max(policy.renotify_s, policy.cooldown_s)
