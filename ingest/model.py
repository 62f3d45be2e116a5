"""The event record and its validation.

An event is one observation of one key (a stock symbol, a host, a sensor) at an
event time, carrying the numeric attributes conditions aggregate over. Anything
that fails validation becomes a :class:`DeadLetter` with a readable reason —
never silently dropped, and never an exception: :func:`parse_record` returns a
dead letter for any input whatever (oversized, non-UTF-8, nested to any depth,
duplicate fields, wrong JSON types, values out of range).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from core.settings import Settings, get_settings
from core.streams import DuplicateField, too_deep, unique_fields

#: The numeric attributes an event carries; conditions may aggregate over any of them.
ATTRIBUTES: tuple[str, ...] = ("price", "volume")

#: Latest event time: 9999-12-31T23:59:59.999Z, the end of ``datetime``'s range. Far inside int64, so
#: event times plus windows, delays and skews never overflow, and every time has an ISO form.
MAX_TS = 253_402_300_799_999

#: A dead letter's reason is cut to this many characters (a field name in a reason can be as long as the record).
MAX_REASON_CHARS = 1_000

Key = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._:\-/]+$")]
#: JSON numbers only: ``true`` or ``"12"`` is not a price (strict), nor are NaN and infinities.
Value = Annotated[float, Field(ge=0, allow_inf_nan=False, strict=True)]


def _event_time(value: object) -> object:
    """Epoch milliseconds, or an ISO-8601 timestamp with a zone; never a boolean."""
    if isinstance(value, bool):
        raise ValueError("expected epoch milliseconds or an ISO-8601 timestamp, not a boolean")
    if isinstance(value, str) and not value.strip().lstrip("-").isdigit():
        moment = datetime.fromisoformat(value)
        if moment.tzinfo is None:
            raise ValueError("ISO timestamps need a zone offset, e.g. 2026-01-02T09:30:00Z")
        return int(moment.timestamp() * 1000)
    return value


class Event(BaseModel):
    """A validated event. ``ts`` is event time in epoch milliseconds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: Key
    ts: int = Field(ge=0, le=MAX_TS, description="event time, epoch milliseconds")
    price: Value
    volume: Value

    @field_validator("ts", mode="before")
    @classmethod
    def _parse_time(cls, value: object) -> object:
        return _event_time(value)

    def to_json(self) -> bytes:
        return self.model_dump_json().encode()


class Heartbeat(BaseModel):
    """Source progress on one partition: no event older than ``ts`` will follow.

    Heartbeats keep event time moving on idle partitions so windows expire and
    alerts resolve even when a key, or a whole partition, goes quiet.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["heartbeat"] = "heartbeat"
    partition: int = Field(ge=0, strict=True)
    ts: int = Field(ge=0, le=MAX_TS, strict=True)

    def to_json(self) -> bytes:
        return self.model_dump_json().encode()


@dataclass(frozen=True)
class RecordLimits:
    """What a record may be; from the settings (see there for why each bound is what it is)."""

    max_record_bytes: int
    max_json_depth: int
    max_value: float
    dead_letter_raw_bytes: int

    @classmethod
    def of(cls, settings: Settings) -> RecordLimits:
        return cls(settings.max_record_bytes, settings.max_json_depth, settings.max_event_value,
                   settings.dead_letter_raw_bytes)


class DeadLetter(BaseModel):
    """A rejected record, kept with the reason so nothing is lost.

    ``raw`` is the record's start (at most ``dead_letter_raw_bytes`` of it, invalid UTF-8
    as ``\\xNN`` escapes); ``raw_bytes`` and ``raw_sha256`` are those of the whole record,
    so a letter always fits the dead-letter topic and still identifies what it stands for.
    """

    reason: str
    raw: str
    source: str
    raw_bytes: int
    raw_sha256: str

    @classmethod
    def of(cls, reason: str, raw: bytes | str | dict | None, source: str, limits: RecordLimits | None = None, *,
           size: int | None = None, digest: str | None = None) -> DeadLetter:
        """A letter for ``raw``; ``size``/``digest`` describe the whole record when ``raw`` is only its start."""
        limits = limits or default_limits()
        payload = _payload_bytes(raw)
        if len(reason) > MAX_REASON_CHARS:
            reason = reason[: MAX_REASON_CHARS - 1] + "…"
        return cls(
            reason=reason,
            raw=payload[: limits.dead_letter_raw_bytes].decode("utf-8", "backslashreplace"),
            source=source[:MAX_REASON_CHARS],
            raw_bytes=len(payload) if size is None else size,
            raw_sha256=hashlib.sha256(payload).hexdigest() if digest is None else digest,
        )

    def to_json(self) -> bytes:
        return self.model_dump_json().encode()


def _payload_bytes(raw: bytes | str | dict | None) -> bytes:
    if raw is None:
        return b""
    if isinstance(raw, bytes | bytearray | memoryview):
        return bytes(raw)
    if isinstance(raw, str):
        return raw.encode("utf-8", "surrogatepass")
    try:
        return json.dumps(raw, default=repr).encode("utf-8", "surrogatepass")
    except (TypeError, ValueError):  # circular or otherwise unprintable
        return repr(raw).encode("utf-8", "backslashreplace")


_default_limits: tuple[Settings, RecordLimits] | None = None


def default_limits() -> RecordLimits:
    """The limits of the process's settings (cached: this is on every record's path)."""
    global _default_limits
    settings = get_settings()
    if _default_limits is None or _default_limits[0] is not settings:
        _default_limits = (settings, RecordLimits.of(settings))
    return _default_limits[1]


def describe_errors(error: ValidationError) -> str:
    """One line per failing field, e.g. ``volume: Input should be >= 0``."""
    return "; ".join(
        f"{'.'.join(map(str, e['loc'])) or 'record'}: {e['msg']}" for e in error.errors()
    )


def _in_range(event: Event, limits: RecordLimits) -> str | None:
    """Why an event's values are out of range, or None."""
    for attribute in ATTRIBUTES:
        if getattr(event, attribute) > limits.max_value:
            return f"{attribute}: Input should be less than or equal to {limits.max_value:g}"
    return None


# Quotes in a record as producers write it (Event/Heartbeat.to_json): every field name and string value is
# quoted, no valid name or value contains a quote, so with this many quotes no field can appear twice.
_EVENT_QUOTES = 2 * (len(Event.model_fields) + 1)  # the names and the key
_HEARTBEAT_QUOTES = 2 * (len(Heartbeat.model_fields) + 1)  # the names and "heartbeat"


def parse_record(raw: bytes | str | dict | None, source: str = "unknown",
                 limits: RecordLimits | None = None) -> Event | Heartbeat | DeadLetter:
    """One record -> an event, a heartbeat, or a dead letter saying why it is neither. Never raises.

    Records as producers write them take a fast path (pydantic's JSON parser, no Python
    dict); anything else takes the careful one: size, UTF-8, nesting depth, duplicate
    fields, JSON types, ranges, each with its own reason.
    """
    limits = limits or default_limits()
    try:
        if isinstance(raw, dict):
            return _validate(raw, raw, source, limits)
        if raw is None:
            return DeadLetter.of("record: empty value", raw, source, limits)
        data = raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogatepass")
        if len(data) > limits.max_record_bytes:
            return DeadLetter.of(f"record: {len(data)} bytes, more than the {limits.max_record_bytes} allowed",
                                 data, source, limits)
        quotes = data.count(b'"')
        try:
            if quotes == _EVENT_QUOTES:
                event = Event.model_validate_json(data)
                reason = _in_range(event, limits)
                return event if reason is None else DeadLetter.of(reason, data, source, limits)
            if quotes == _HEARTBEAT_QUOTES and b"heartbeat" in data:
                return Heartbeat.model_validate_json(data)
        except ValidationError:
            pass  # the careful path says why
        return _parse_carefully(data, source, limits)
    except Exception as exc:  # noqa: BLE001 - a record must never take the caller down
        return DeadLetter.of(f"internal: {type(exc).__name__}: {exc}", raw, source, limits)


def _parse_carefully(data: bytes, source: str, limits: RecordLimits) -> Event | Heartbeat | DeadLetter:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return DeadLetter.of(f"not UTF-8: byte 0x{data[exc.start]:02x} at position {exc.start}", data, source,
                             limits)
    depth = too_deep(text, limits.max_json_depth)
    if depth is not None:
        return DeadLetter.of(f"record: JSON nested {depth} deep, more than the {limits.max_json_depth} allowed",
                             data, source, limits)
    try:
        payload = json.loads(text, object_pairs_hook=unique_fields)
    except DuplicateField as exc:
        return DeadLetter.of(f"{exc}: field given more than once", data, source, limits)
    except json.JSONDecodeError as exc:
        return DeadLetter.of(f"not JSON: {exc.msg} at position {exc.pos}", data, source, limits)
    except RecursionError:
        return DeadLetter.of("record: JSON nested too deep to parse", data, source, limits)
    return _validate(payload, data, source, limits)


def _validate(payload: object, data: bytes | dict, source: str,
              limits: RecordLimits) -> Event | Heartbeat | DeadLetter:
    if not isinstance(payload, dict):
        return DeadLetter.of("record: expected a JSON object", data, source, limits)
    if payload.get("kind") == "heartbeat":
        try:
            return Heartbeat.model_validate(payload)
        except ValidationError as exc:
            return DeadLetter.of(f"heartbeat: {describe_errors(exc)}", data, source, limits)
    try:
        event = Event.model_validate(payload)
    except ValidationError as exc:
        return DeadLetter.of(describe_errors(exc), data, source, limits)
    reason = _in_range(event, limits)
    return event if reason is None else DeadLetter.of(reason, data, source, limits)


def parse_event(raw: bytes | str | dict | None, source: str = "unknown",
                limits: RecordLimits | None = None) -> Event | DeadLetter:
    """Validate one record meant to be an event; return the event or a dead letter saying why not."""
    parsed = parse_record(raw, source, limits)
    if isinstance(parsed, Heartbeat):
        return DeadLetter.of("record: a heartbeat, not an event", raw, source, limits)
    return parsed
