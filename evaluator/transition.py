"""Edge-triggered output: ``firing`` when a (subscription, key) enters its condition, ``resolved`` when it leaves.

Each transition has a deterministic id, so re-evaluating the same data (a replayed
micro-batch, a restart from a checkpoint) reproduces the same ids and downstream
de-duplication holds.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from typing import Literal

State = Literal["firing", "resolved"]


@dataclass(frozen=True, slots=True)
class Transition:
    alert_id: str
    subscription_id: int
    key: str
    state: State
    value: float | None
    window_start: int
    window_end: int
    evaluated_at: int

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def alert_id(subscription_id: int, key: str, state: State, evaluated_at: int) -> str:
    """Deterministic id of a transition: the same evaluation always yields the same id."""
    digest = hashlib.sha256(f"{subscription_id}|{key}|{state}|{evaluated_at}".encode()).hexdigest()
    return digest[:32]
