"""Edge-triggered output: ``firing`` when a (subscription, key) enters its condition, ``resolved`` when it leaves.

With lifecycle clauses (evaluator/lifecycle.py) the edges are those users see (after a pending period, keep-firing,
hysteresis, damping); a crossing is a ``firing`` of kind ``crossing``, an event that nothing resolves.

Each transition has a deterministic id, so re-evaluating the same data (a replayed
micro-batch, a restart from a checkpoint) reproduces the same ids and downstream
de-duplication holds.

A transition is also the contract between processes: the evaluator's sink writes
it to Redis as :meth:`Transition.to_json` (the ``alerts`` stream, ``firing:<id>``,
``history:<id>``), and the notifier's dispatcher and the alert history read it back
with :meth:`Transition.from_json`, so every reader sees the same fields and types.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Literal, NamedTuple, get_args

State = Literal["firing", "resolved"]
STATES: tuple[State, ...] = get_args(State)


class Transition(NamedTuple):
    """One edge. A named tuple, not a frozen dataclass: a first evaluation makes millions at once, and a frozen
    dataclass's ``__init__`` (a ``setattr`` per field) cost 1.7 µs each against 0.46 µs (issue 33); the sink's rows
    are these tuples as they are (``evaluator.spark.sink.shard_output``)."""

    alert_id: str
    subscription_id: int
    key: str
    state: State
    value: float | None
    window_start: int
    window_end: int
    evaluated_at: int
    # "state" (an edge of the alert's state) or "crossing" (an event, evaluator/lifecycle.py: state "firing", no
    # resolved follows, nothing to keep as firing). Last, with a default: payloads written before it still load.
    kind: str = "state"

    def to_dict(self) -> dict[str, Any]:
        """The fields; ``kind`` only for a crossing, so a state transition reads exactly as before kinds existed.
        Written out, not ``dataclasses.asdict``: its recursive deep copy was 6.5 % of a drain batch (issue 33)."""
        data = {"alert_id": self.alert_id, "subscription_id": self.subscription_id, "key": self.key,
                "state": self.state, "value": self.value, "window_start": self.window_start,
                "window_end": self.window_end, "evaluated_at": self.evaluated_at}
        if self.kind != "state":
            data["kind"] = self.kind
        return data

    def to_json(self) -> str:
        """The compact JSON the sink stores (fields in declaration order)."""
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Transition:
        """A transition from its fields, as JSON or a Spark row carries them (numbers of any numeric type).

        ValueError (or KeyError for a missing field) if a field does not fit the contract.
        """
        state = data["state"]
        if state not in STATES:
            raise ValueError(f"transition state {state!r} is none of {', '.join(STATES)}")
        value = data["value"]
        return cls(
            alert_id=_text(data["alert_id"], "alert_id"),
            subscription_id=int(data["subscription_id"]),
            key=_text(data["key"], "key"),
            state=state,
            value=None if value is None else float(value),
            window_start=int(data["window_start"]),
            window_end=int(data["window_end"]),
            evaluated_at=int(data["evaluated_at"]),
            kind=_kind(data.get("kind")),
        )

    @classmethod
    def from_json(cls, payload: str | bytes) -> Transition:
        return cls.from_dict(json.loads(payload))


KINDS = ("state", "crossing")


def _kind(value: object) -> str:
    if value is None:
        return "state"
    if value not in KINDS:
        raise ValueError(f"transition kind {value!r} is none of {', '.join(KINDS)}")
    return str(value)


def _text(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"transition {name} must be text, not {type(value).__name__}")
    return value


def alert_id(subscription_id: int, key: str, state: State, evaluated_at: int) -> str:
    """Deterministic id of a transition: the same evaluation always yields the same id."""
    digest = hashlib.sha256(f"{subscription_id}|{key}|{state}|{evaluated_at}".encode()).hexdigest()
    return digest[:32]
