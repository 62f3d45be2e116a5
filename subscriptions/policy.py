"""A subscription's alert policy: what its subscriber asked to be told, and when.

Part of the subscription (stored as JSON on it, validated by the API and the form),
so it lives here; the notifier applies it (``notifier.policy.decide``):

- *mute*: nothing is sent until ``muted_until``;
- *cool-down*: a key that fired and was notified is not notified again for ``cooldown_s``;
- *re-notify*: a key that stays firing is reminded every ``renotify_s``;
- *send-resolved*: whether leaving the condition is notified at all;
- *group*: one notification for all keys of one evaluation, or one per key.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from core.timestamps import UtcDatetime


class AlertPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cooldown_s: int = Field(0, ge=0, le=30 * 86_400, description="minimum seconds between notifications of one key")
    renotify_s: int | None = Field(
        None, ge=60, le=30 * 86_400, description="remind every so many seconds while a key stays firing; null: never"
    )
    send_resolved: bool = Field(True, description="notify when a key leaves the condition")
    group: bool = Field(True, description="one notification for all keys of one evaluation")
    muted_until: UtcDatetime | None = Field(None, description="send nothing until this time")

    def muted(self, now: float) -> bool:
        if self.muted_until is None:
            return False
        return now < self.muted_until.timestamp()  # in UTC (a time given without an offset is read as UTC)
