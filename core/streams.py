"""Streams: what a publisher declares about its data, and the checks every record of it passes.

A stream is a named, keyed series of events: a key field, a time field (epoch
milliseconds or ISO-8601), numeric attributes (optionally with a unit and a valid
range) and string dimensions. Publishers send records in that shape; Tocsin
writes each accepted record to the stream's Kafka topic in the *wire form* the
evaluator reads: ``{"key": …, "ts": <epoch ms>, <attributes>…, <dimensions>…}``
(for the built-in ``trades`` stream exactly ``ingest.model.Event``'s JSON).

:class:`StreamValidator` judges a whole batch at once: Arrow's RE2 over the raw
texts and checks on whole columns accept every record it can prove valid; only the
rest go through the per-record pydantic model (:meth:`StreamValidator.judge`),
which is the reference and gives every reject its field-level reason.

For a topic reader (the evaluator): ``StreamValidator(schema.wire(), limits).validate_values(values)``
judges Kafka record values against the stream's wire schema, with the same answers as the HTTP
path. Heartbeat records (``{"kind": "heartbeat", …}``) are progress marks, not events: ``kind`` is
reserved, so the validator refuses them and a reader separates them first.

Pure: no I/O; the database, Kafka and HTTP sides live in ``subscriptions.streams``
and ``web.api.streams``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any, Literal

import numpy as np
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, create_model, model_validator

from core.settings import Settings
from core.stream_names import TRADES
from core.text import PlainText

if TYPE_CHECKING:
    import pyarrow as pa

#: Field names of the wire form; ``kind`` marks heartbeat records on the same topics.
WIRE_KEY, WIRE_TIME, RESERVED = "key", "ts", "kind"
_WIRE_TS = rf'^\{{"{WIRE_KEY}":"[^"]*","{WIRE_TIME}":(?P<ts>[0-9]+)'  # how every wire record starts
#: Latest event time: 9999-12-31T23:59:59.999Z (as ``ingest.model.MAX_TS``).
MAX_TS = 253_402_300_799_999
KEY_CHARS = r"[A-Za-z0-9._:\-/]"
KEY_MAX = 64
MAX_ATTRIBUTES = 64
MAX_DIMENSIONS = 16
MAX_REASON_CHARS = 1_000

StreamName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,62}$", max_length=63,
                                  description="lower case letters, digits and _; starts with a letter")]
FieldName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,62}$",
                                 description="letters, digits and _; starts with a letter or _")]
Unit = Annotated[str, Field(min_length=1, max_length=32), PlainText]
Bound = Annotated[float, Field(allow_inf_nan=False)]
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


class Attribute(BaseModel):
    """A numeric attribute conditions aggregate over. ``required``: every record carries it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: FieldName
    unit: Unit | None = None
    min: Bound | None = None
    max: Bound | None = None
    required: bool = True

    @model_validator(mode="after")
    def _ordered(self) -> Attribute:
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"attribute {self.name}: min {self.min:g} is above max {self.max:g}")
        return self


class Dimension(BaseModel):
    """A string label of a record (``exchange``, ``region``) that conditions may filter on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: FieldName
    max_length: int = Field(256, ge=1, le=4_096)
    required: bool = False


class StreamSchema(BaseModel):
    """A stream as its publishers see it. Retention and partitions are its Kafka topic's, fixed at creation."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: StreamName
    key_field: FieldName = WIRE_KEY
    time_field: FieldName = WIRE_TIME
    time_format: Literal["epoch_ms", "iso8601"] = "epoch_ms"
    attributes: tuple[Attribute, ...] = Field(min_length=1, max_length=MAX_ATTRIBUTES)
    dimensions: tuple[Dimension, ...] = Field((), max_length=MAX_DIMENSIONS)
    retention_ms: int = Field(ge=60_000, description="how long the topic keeps records")
    partitions: int = Field(ge=1, le=1_024)

    @model_validator(mode="after")
    def _distinct_fields(self) -> StreamSchema:
        names = [self.key_field, self.time_field, *self.attribute_names, *self.dimension_names]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"field names must be distinct: {', '.join(repeated)} given more than once")
        if RESERVED in names:
            raise ValueError(f"{RESERVED!r} is reserved (heartbeat records)")
        wire = {WIRE_KEY, WIRE_TIME}
        clash = [n for n in (*self.attribute_names, *self.dimension_names) if n in wire]
        if clash or self.key_field == WIRE_TIME or self.time_field == WIRE_KEY:
            raise ValueError(f"{WIRE_KEY!r} and {WIRE_TIME!r} name the key and the time on the topic: an attribute "
                             "or dimension may not use them, nor the key field 'ts' or the time field 'key'")
        return self

    @property
    def attribute_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.attributes)

    @property
    def dimension_names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.dimensions)

    @property
    def required_attributes(self) -> frozenset[str]:
        return frozenset(a.name for a in self.attributes if a.required)

    def wire(self) -> StreamSchema:
        """The schema of the records on the topic: key ``key``, time ``ts`` in epoch ms (what Kafka producers write)."""
        return self.model_copy(update={"key_field": WIRE_KEY, "time_field": WIRE_TIME, "time_format": "epoch_ms"})


def topic_name(stream: str, settings: Settings) -> str:
    """The one place a stream's Kafka topic is named: ``trades`` keeps today's events topic."""
    return settings.events_topic if stream == TRADES else f"{settings.stream_topic_prefix}{stream}"


def trades_schema(settings: Settings) -> StreamSchema:
    """The built-in stream: ``ingest.model.Event`` (key, ts in epoch ms, price and volume >= 0)."""
    return StreamSchema(name=TRADES, attributes=(Attribute(name="price", min=0), Attribute(name="volume", min=0)),
                        retention_ms=settings.stream_default_retention_ms, partitions=settings.event_partitions)


# -- schema evolution --------------------------------------------------------------------------------------------


class IncompatibleChange(ValueError):
    """A change publishers or subscriptions would break on; ``subscriptions`` names those that use what changes."""

    def __init__(self, message: str, subscriptions: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.subscriptions = list(subscriptions)


_FIXED = ("key_field", "time_field", "time_format", "retention_ms", "partitions")


def check_compatible(old: StreamSchema, new: StreamSchema, used_by: Mapping[str, Collection[str]]) -> None:
    """Raise :class:`IncompatibleChange` unless ``new`` may replace ``old`` while the stream runs.

    ``used_by`` maps each subscription on the stream (its label) to the field names its condition uses.
    Adding optional attributes or dimensions is compatible; removing or altering one is refused when a
    subscription uses it (the error lists them); a new required field is refused, since producers that do
    not send it yet would be refused; the key, the time and the topic's shape never change.
    """
    if new.name != old.name:
        raise IncompatibleChange("a stream cannot be renamed (its topic and subscriptions name it)")
    for name in _FIXED:
        if getattr(new, name) != getattr(old, name):
            raise IncompatibleChange(f"{name} cannot change once the stream exists (was {getattr(old, name)!r})")
    changed: list[str] = []
    for before, after in ((old.attributes, new.attributes), (old.dimensions, new.dimensions)):
        now = {f.name: f for f in after}
        changed += [f.name for f in before if now.get(f.name) != f]
        was = {f.name for f in before}
        added_required = [f.name for f in after if f.name not in was and f.required]
        if added_required:
            raise IncompatibleChange(f"new fields must be optional (required: false), or producers that do not send "
                                     f"them yet would be refused: {', '.join(added_required)}")
    users = sorted(label for label, fields in used_by.items() if set(fields) & set(changed))
    if users:
        raise IncompatibleChange(f"{', '.join(sorted(changed))}: removed or altered, but used by subscriptions: "
                                 f"{', '.join(users)}", users)


# -- batches of raw records ----------------------------------------------------------------------------------------


class BatchError(ValueError):
    """A request body that is not a batch of records at all (not a JSON array); records are never guessed at."""


def split_ndjson(data: bytes) -> list[str | bytes]:
    """One record per non-blank line; a line that is not UTF-8 stays bytes (and is rejected as such)."""
    try:
        lines: list[str | bytes] = list(data.decode("utf-8").split("\n"))
    except UnicodeDecodeError:
        lines = []
        for raw in data.split(b"\n"):
            try:
                lines.append(raw.decode("utf-8"))
            except UnicodeDecodeError:
                lines.append(raw)
    return [line.rstrip("\r") if isinstance(line, str) else line.rstrip(b"\r")
            for line in lines if line.strip()]


_WS = re.compile(r"[ \t\n\r]*")
_decoder = json.JSONDecoder()


def split_json_array(data: bytes, max_records: int | None = None) -> list[str | bytes]:
    """The texts of a JSON array's elements, each as sent (so a dead letter shows the record as written).

    With ``max_records``, splitting stops at the first element past it (the caller refuses the batch then):
    a body of tiny elements is not parsed whole only to be refused.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BatchError(f"the body is not UTF-8: byte 0x{data[exc.start]:02x} at position {exc.start}") from None
    end = len(text)
    pos = _WS.match(text, 0).end()  # type: ignore[union-attr]
    if pos == end or text[pos] != "[":
        raise BatchError("expected a JSON array of records (or send NDJSON as application/x-ndjson)")
    records: list[str | bytes] = []
    pos = _WS.match(text, pos + 1).end()  # type: ignore[union-attr]
    if pos < end and text[pos] == "]":
        pos += 1
    else:
        while True:
            try:
                _, stop = _decoder.raw_decode(text, pos)
            except json.JSONDecodeError as exc:
                raise BatchError(f"record {len(records)}: not JSON: {exc.msg} at position {exc.pos}") from None
            except RecursionError:
                raise BatchError(f"record {len(records)}: JSON nested too deep to parse") from None
            records.append(text[pos:stop])
            if max_records is not None and len(records) > max_records:
                return records
            pos = _WS.match(text, stop).end()  # type: ignore[union-attr]
            if pos < end and text[pos] == ",":
                pos = _WS.match(text, pos + 1).end()  # type: ignore[union-attr]
                continue
            if pos < end and text[pos] == "]":
                pos += 1
                break
            raise BatchError(f"expected ',' or ']' after record {len(records) - 1} at position {pos}")
    if _WS.match(text, pos).end() != end:  # type: ignore[union-attr]
        raise BatchError(f"unexpected data after the array at position {pos}")
    return records


# -- validation -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecordLimits:
    """What any record may be, whatever its stream (see the settings of the same names)."""

    max_record_bytes: int
    max_json_depth: int
    max_value: float

    @classmethod
    def of(cls, settings: Settings) -> RecordLimits:
        return cls(settings.max_record_bytes, settings.max_json_depth, settings.max_event_value)


@dataclass(frozen=True)
class Rejected:
    """A record that is not valid for the stream: its position in the batch, why, and the record as sent."""

    index: int
    reason: str
    raw: str | bytes


@dataclass
class ValidatedBatch:
    """Accepted records in batch order: their positions, keys and wire-form JSON; and the rejects."""

    indices: np.ndarray
    keys: list[str]
    records: list[str]
    rejected: list[Rejected] = field(default_factory=list)

    @property
    def accepted(self) -> int:
        return len(self.records)

    def refusing(self, reasons: Mapping[int, str], raw: Sequence[str | bytes]) -> ValidatedBatch:
        """This batch with the accepted records at positions ``reasons`` (position among the accepted -> why)
        made rejects; ``raw``: the batch's records as sent."""
        if not reasons:
            return self
        keep = [i for i in range(self.accepted) if i not in reasons]
        made = (Rejected(int(self.indices[i]), why, raw[int(self.indices[i])]) for i, why in reasons.items())
        return ValidatedBatch(self.indices[keep], [self.keys[i] for i in keep], [self.records[i] for i in keep],
                              sorted([*self.rejected, *made], key=lambda r: r.index))

    @property
    def newest_ts(self) -> int | None:
        """The newest event time of the accepted records (read off their wire form, which starts key, ts)."""
        if not self.records:
            return None
        import pyarrow as pa  # here, not at the top: what only reads schemas (a notifier worker) never loads Arrow
        import pyarrow.compute as pc

        ts = pc.extract_regex(pa.array(self.records, pa.string()), _WIRE_TS).field("ts")
        return int(pc.max(pc.cast(ts, pa.int64())).as_py())


class DuplicateField(ValueError):
    """A JSON object that names a field twice (json.loads would keep the last silently)."""


def unique_fields(pairs: list[tuple[str, object]]) -> dict:
    """``json.loads``' object hook that refuses a field given twice (:class:`DuplicateField`)."""
    fields = dict(pairs)
    if len(fields) != len(pairs):
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                raise DuplicateField(name)
            seen.add(name)
    return fields


def too_deep(text: str, limit: int) -> int | None:
    """The nesting depth of ``text`` if above ``limit`` (strings skipped), else None."""
    if text.count("[") + text.count("{") <= limit:
        return None
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest if deepest > limit else None


def _describe(error: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'record'}: {e['msg']}" for e in error.errors())


def _iso_ms(value: object) -> int:
    if not isinstance(value, str):
        raise ValueError("expected an ISO-8601 timestamp string, e.g. 2026-01-02T09:30:00Z")
    moment = datetime.fromisoformat(value)
    if moment.tzinfo is None:
        raise ValueError("ISO timestamps need a zone offset, e.g. 2026-01-02T09:30:00Z")
    ms = (moment - _EPOCH) // _MS
    if not 0 <= ms <= MAX_TS:
        raise ValueError("the time must be from 1970-01-01T00:00:00Z on")
    return ms


def _record_model(schema: StreamSchema, limits: RecordLimits) -> type[BaseModel]:
    """The per-record pydantic model of ``schema`` (fields ``f0``… aliased to the declared names)."""

    def bounded(value: float) -> float:
        if abs(value) > limits.max_value:
            raise ValueError(f"Input should be between -{limits.max_value:g} and {limits.max_value:g}")
        return value

    key = Annotated[str, Field(strict=True, min_length=1, max_length=KEY_MAX, pattern=rf"^{KEY_CHARS}+$")]
    fields: dict[str, Any] = {"f0": (key, Field(alias=schema.key_field))}
    if schema.time_format == "epoch_ms":
        fields["f1"] = (Annotated[int, Field(strict=True, ge=0, le=MAX_TS)], Field(alias=schema.time_field))
    else:
        fields["f1"] = (Annotated[int, BeforeValidator(_iso_ms)], Field(alias=schema.time_field))
    for i, attribute in enumerate(schema.attributes, 2):
        value = Annotated[float, Field(strict=True, allow_inf_nan=False, ge=attribute.min, le=attribute.max),
                          AfterValidator(bounded)]
        fields[f"f{i}"] = ((value, Field(alias=attribute.name)) if attribute.required
                           else (value | None, Field(None, alias=attribute.name)))
    first_dimension = 2 + len(schema.attributes)
    for i, dimension in enumerate(schema.dimensions, first_dimension):
        text = Annotated[str, Field(strict=True, max_length=dimension.max_length)]
        fields[f"f{i}"] = ((text, Field(alias=dimension.name)) if dimension.required
                           else (text | None, Field(None, alias=dimension.name)))
    return create_model(f"Record_{schema.name}", __config__=ConfigDict(extra="forbid", frozen=True), **fields)


_NUMBER = r"-?(?:0|[1-9][0-9]{0,15})(?:\.[0-9]{1,17})?(?:[eE][+-]?[0-9]{1,2})?"
_EPOCH_MS = r"0|[1-9][0-9]{0,14}"
_ISO = (r"[0-9]{4}-[0-9]{2}-[0-9]{2}T(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,3})?"
        r"(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])")
_DIMENSION = r'[^"\\\x00-\x1f]*'
_RE_WS = r"[ \t\r\n]*"


def _plain_pattern(schema: StreamSchema) -> str:
    """RE2: a flat record of every declared field once, in declared order, no escapes; group ``fN`` per field."""
    time = f'"(?P<f1>{_ISO})"' if schema.time_format == "iso8601" else f"(?P<f1>{_EPOCH_MS})"
    parts = [f'"{re.escape(schema.key_field)}"{_RE_WS}:{_RE_WS}"(?P<f0>{KEY_CHARS}{{1,{KEY_MAX}}})"',
             f'"{re.escape(schema.time_field)}"{_RE_WS}:{_RE_WS}{time}']
    i = 2
    for attribute in schema.attributes:
        parts.append(f'"{re.escape(attribute.name)}"{_RE_WS}:{_RE_WS}(?P<f{i}>{_NUMBER})')
        i += 1
    for dimension in schema.dimensions:
        parts.append(f'"{re.escape(dimension.name)}"{_RE_WS}:{_RE_WS}"(?P<f{i}>{_DIMENSION})"')
        i += 1
    return f"^{_RE_WS}\\{{{_RE_WS}" + f"{_RE_WS},{_RE_WS}".join(parts) + f"{_RE_WS}\\}}{_RE_WS}$"


def _utf8_or_empty(value: bytes) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return ""


class StreamValidator:
    """Judges batches of raw records for one stream and turns the valid ones into wire records.

    :meth:`judge` is the reference (one record, pydantic); :meth:`validate` gives exactly its answers for
    a whole batch, proving most records valid on whole Arrow columns and judging only the rest one by one.
    """

    def __init__(self, schema: StreamSchema, limits: RecordLimits) -> None:
        self.schema = schema
        self.limits = limits
        self.model = _record_model(schema, limits)
        self.pattern = _plain_pattern(schema)
        self._names = [WIRE_KEY, WIRE_TIME, *schema.attribute_names, *schema.dimension_names]

    # -- one record: the reference ----------------------------------------------------------------------------

    def judge(self, raw: str | bytes, latest_ts: int = MAX_TS) -> tuple[str, str] | str:
        """``(key, wire record)`` for a valid record, else the reason it is not. Never raises.

        ``latest_ts``: the latest event time accepted (the HTTP path: its clock plus ``max_future_skew_ms``,
        beyond which the evaluator dead-letters an event, so accepting it would promise what is not kept).
        """
        try:
            verdict = self._judge(raw)
        except Exception as exc:  # noqa: BLE001 - a poison record costs that record only
            verdict = f"internal: {type(exc).__name__}: {exc}"[:MAX_REASON_CHARS]
        if isinstance(verdict, str):  # a reason quotes field names: a lone surrogate in one could not be sent
            return verdict[:MAX_REASON_CHARS].encode("utf-8", "backslashreplace").decode("utf-8")
        if json.loads(verdict[1])[WIRE_TIME] > latest_ts:
            return self._ahead(latest_ts)
        return verdict

    def _ahead(self, latest_ts: int) -> str:
        latest = (_EPOCH + latest_ts * _MS).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        return (f"{self.schema.time_field}: later than {latest}, too far ahead of the server's clock "
                "(the evaluator refuses such events)")

    def _judge(self, raw: str | bytes) -> tuple[str, str] | str:
        size = len(raw.encode("utf-8", "surrogatepass")) if isinstance(raw, str) else len(raw)
        if size > self.limits.max_record_bytes:
            return f"record: {size} bytes, more than the {self.limits.max_record_bytes} allowed"
        if isinstance(raw, bytes):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                return f"not UTF-8: byte 0x{raw[exc.start]:02x} at position {exc.start}"
        else:
            text = raw
        depth = too_deep(text, self.limits.max_json_depth)
        if depth is not None:
            return f"record: JSON nested {depth} deep, more than the {self.limits.max_json_depth} allowed"
        try:
            payload = json.loads(text, object_pairs_hook=unique_fields)
        except DuplicateField as exc:
            return f"{exc}: field given more than once"
        except json.JSONDecodeError as exc:
            return f"not JSON: {exc.msg} at position {exc.pos}"
        except RecursionError:
            return "record: JSON nested too deep to parse"
        if not isinstance(payload, dict):
            return "record: expected a JSON object"
        try:
            record = self.model.model_validate(payload)
        except ValidationError as exc:
            return _describe(exc)[:MAX_REASON_CHARS]
        values = record.model_dump().values()
        wire = dict(zip(self._names, values, strict=True))
        return wire[WIRE_KEY], json.dumps(wire, separators=(",", ":"), ensure_ascii=False)

    # -- a batch -------------------------------------------------------------------------------------------------

    def validate(self, records: Sequence[str | bytes], latest_ts: int = MAX_TS) -> ValidatedBatch:
        """Every record judged as :meth:`judge` would (with ``latest_ts``); accepted ones in batch order."""
        import pyarrow as pa

        texts = pa.array([r if isinstance(r, str) else "" for r in records], pa.string())
        return self._validate(records, texts, latest_ts)

    def validate_values(self, values: Sequence[bytes]) -> ValidatedBatch:
        """:meth:`validate` for Kafka record values (what a topic reader has), UTF-8 checked on the whole column."""
        import pyarrow as pa

        try:
            texts = pa.array(values, pa.binary()).cast(pa.string())
        except pa.ArrowInvalid:  # some value is not UTF-8: it is judged (and rejected) one by one
            texts = pa.array([_utf8_or_empty(v) for v in values], pa.string())
        return self._validate(values, texts)

    def _validate(self, records: Sequence[str | bytes], texts: pa.Array, latest_ts: int = MAX_TS) -> ValidatedBatch:
        n = len(records)
        if n == 0:
            return ValidatedBatch(np.zeros(0, np.int64), [], [])
        proven, keys, wires = self._prove(texts, latest_ts)
        fast_rows = np.flatnonzero(proven)
        rest = np.flatnonzero(~proven)
        slow_rows: list[int] = []
        slow_keys: list[str] = []
        slow_wires: list[str] = []
        rejected: list[Rejected] = []
        for row in rest.tolist():
            verdict = self.judge(records[row], latest_ts)
            if isinstance(verdict, str):
                rejected.append(Rejected(row, verdict, records[row]))
            else:
                slow_rows.append(row)
                slow_keys.append(verdict[0])
                slow_wires.append(verdict[1])
        if not slow_rows:
            return ValidatedBatch(fast_rows, keys, wires, rejected)
        rows = np.concatenate([fast_rows, np.asarray(slow_rows, np.int64)])
        order = np.argsort(rows, kind="stable")
        all_keys, all_wires = keys + slow_keys, wires + slow_wires
        return ValidatedBatch(rows[order], [all_keys[i] for i in order], [all_wires[i] for i in order], rejected)

    def _prove(self, texts: pa.Array, latest_ts: int = MAX_TS) -> tuple[np.ndarray, list[str], list[str]]:
        """Which records are plain and in range, with their keys and wire records (in batch order)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        n = len(texts)
        small = pc.less_equal(pc.binary_length(texts), self.limits.max_record_bytes)
        parts = pc.extract_regex(texts, self.pattern)  # null where the record is not plain
        ok = pc.and_kleene(pc.is_valid(parts), small)
        ok = pc.fill_null(ok, False)
        if not pc.any(ok).as_py():
            return np.zeros(n, bool), [], []
        good = parts.filter(ok)
        columns = [good.field(i) for i in range(good.type.num_fields)]
        checks: list[pa.Array] = []
        if self.schema.time_format == "epoch_ms":
            ts = pc.cast(columns[1], pa.int64())
            checks.append(pc.less_equal(ts, min(latest_ts, MAX_TS)))
            ts_text = columns[1]
        else:
            try:
                ts = pc.cast(pc.cast(columns[1], pa.timestamp("ms", tz="UTC")), pa.int64())
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # an impossible date: judged one by one
                return np.zeros(n, bool), [], []
            checks += [pc.greater_equal(ts, 0), pc.less_equal(ts, min(latest_ts, MAX_TS))]
            ts_text = pc.cast(ts, pa.string())
        for column, attribute in zip(columns[2:], self.schema.attributes, strict=False):
            value = pc.cast(column, pa.float64())
            checks.append(pc.less_equal(pc.abs(value), self.limits.max_value))
            if attribute.min is not None:
                checks.append(pc.greater_equal(value, attribute.min))
            if attribute.max is not None:
                checks.append(pc.less_equal(value, attribute.max))
        first_dimension = 2 + len(self.schema.attributes)
        for column, dimension in zip(columns[first_dimension:], self.schema.dimensions, strict=True):
            checks.append(pc.less_equal(pc.utf8_length(column), dimension.max_length))
        valid = np.ones(len(good), bool)
        for check in checks:
            valid &= check.to_numpy(zero_copy_only=False)
        pieces: list[Any] = [f'{{"{WIRE_KEY}":"', columns[0], f'","{WIRE_TIME}":', ts_text]
        for i, name in enumerate(self.schema.attribute_names, 2):
            pieces += [f',"{name}":', columns[i]]
        for i, name in enumerate(self.schema.dimension_names, first_dimension):
            pieces += [f',"{name}":"', columns[i], '"']
        pieces.append("}")
        mask = pa.array(valid)
        arrays = [p.filter(mask) if isinstance(p, pa.Array) else p for p in pieces]
        wires = pc.binary_join_element_wise(*arrays, "").to_pylist()
        keys = columns[0].filter(mask).to_pylist()
        proven = np.zeros(n, bool)
        proven[np.flatnonzero(ok.to_numpy(zero_copy_only=False))[valid]] = True
        return proven, keys, wires
