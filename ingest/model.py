"""The event record and its validation.

An event is one observation of one key (a stock symbol, a host, a sensor) at an
event time, carrying the numeric attributes conditions aggregate over. Anything
that fails validation becomes a :class:`DeadLetter` with a readable reason —
never silently dropped.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

#: The numeric attributes an event carries; conditions may aggregate over any of them.
ATTRIBUTES: tuple[str, ...] = ("price", "volume")

Key = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._:\-/]+$")]


class Event(BaseModel):
    """A validated event. ``ts`` is event time in epoch milliseconds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: Key
    ts: int = Field(ge=0, description="event time, epoch milliseconds")
    price: float = Field(ge=0, allow_inf_nan=False)
    volume: float = Field(ge=0, allow_inf_nan=False)

    @field_validator("ts", mode="before")
    @classmethod
    def _parse_time(cls, value: object) -> object:
        """Accept epoch milliseconds or an ISO-8601 timestamp with a zone."""
        if isinstance(value, str) and not value.strip().lstrip("-").isdigit():
            moment = datetime.fromisoformat(value)
            if moment.tzinfo is None:
                raise ValueError("ISO timestamps need a zone offset, e.g. 2026-01-02T09:30:00Z")
            return int(moment.timestamp() * 1000)
        return value

    def to_json(self) -> bytes:
        return self.model_dump_json().encode()


class Heartbeat(BaseModel):
    """Source progress on one partition: no event older than ``ts`` will follow.

    Heartbeats keep event time moving on idle partitions so windows expire and
    alerts resolve even when a key, or a whole partition, goes quiet.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["heartbeat"] = "heartbeat"
    partition: int = Field(ge=0)
    ts: int = Field(ge=0)

    def to_json(self) -> bytes:
        return self.model_dump_json().encode()


class DeadLetter(BaseModel):
    """A rejected record, kept with the reason so nothing is lost."""

    reason: str
    raw: str
    source: str

    def to_json(self) -> bytes:
        return self.model_dump_json().encode()


def describe_errors(error: ValidationError) -> str:
    """One line per failing field, e.g. ``volume: Input should be >= 0``."""
    return "; ".join(
        f"{'.'.join(map(str, e['loc'])) or 'record'}: {e['msg']}" for e in error.errors()
    )


def parse_event(raw: bytes | str | dict, source: str = "unknown") -> Event | DeadLetter:
    """Validate one record; return the event or a dead letter saying why not."""
    text = raw if isinstance(raw, str) else raw.decode("utf-8", "replace") if isinstance(raw, bytes) else json.dumps(raw)
    try:
        payload = raw if isinstance(raw, dict) else json.loads(text)
    except json.JSONDecodeError as exc:
        return DeadLetter(reason=f"not JSON: {exc.msg} at position {exc.pos}", raw=text, source=source)
    if not isinstance(payload, dict):
        return DeadLetter(reason="record: expected a JSON object", raw=text, source=source)
    try:
        return Event.model_validate(payload)
    except ValidationError as exc:
        return DeadLetter(reason=describe_errors(exc), raw=text, source=source)
