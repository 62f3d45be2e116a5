"""Raw Kafka records -> events, dead letters, each partition's progress -> pane rows per shard (pure).

The first stage of live evaluation (``evaluator.spark.parse`` runs it in Spark's
``mapInArrow``, adding the dead-letter topic, counters and the series limit) and of a
backtest (``evaluator.backtest``, on history read back from the topic): one judge for
both, so a backtest sees exactly the events, refusals and panes the live query saw.

Because Kafka partitions by key, one input partition holds all of a key's events
in a micro-batch, so the per-partition pre-aggregation is complete and the
shuffle carries one row per (key, pane) instead of one per event. The pane row
layout (``PANES_SCHEMA``) is written by :class:`RecordPanes` and read back by
:func:`pane_rows` in the shard operator.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from core.settings import Settings
from core.stream_names import TRADES
from evaluator.panerows import PaneRows
from evaluator.views import SEP, key_of
from ingest.model import ATTRIBUTES, MAX_TS, DeadLetter, Event, Heartbeat, RecordLimits, parse_record


def stat_fields(attributes: tuple[str, ...]) -> tuple[str, ...]:
    return ("count", *(f"{stat}_{a}" for a in attributes for stat in ("sum", "min", "max")))


def event_fields(attributes: tuple[str, ...]) -> tuple[str, ...]:
    """The pane's events, for QUANTILE and LAST."""
    return ("event_ts", *(f"event_{a}" for a in attributes))


def pane_columns(attributes: tuple[str, ...]) -> list[tuple[str, pa.DataType]]:
    """The pane rows' columns for a stream of ``attributes``, as the parser writes them (Arrow types)."""
    return [
        ("shard", pa.int64()), ("key", pa.string()), ("pane_start", pa.int64()), ("count", pa.int64()),
        *((f, pa.float64()) for f in stat_fields(attributes)[1:]),
        ("event_ts", pa.list_(pa.int64())), *((f"event_{a}", pa.list_(pa.float64())) for a in attributes),
        ("partition", pa.int32()), ("progress", pa.int64()),
    ]


_SPARK_TYPES = {pa.int64(): "long", pa.int32(): "int", pa.string(): "string", pa.float64(): "double",
                pa.list_(pa.int64()): "array<long>", pa.list_(pa.float64()): "array<double>"}


def panes_schema(attributes: tuple[str, ...]) -> str:
    """The pane rows' Spark schema for a stream of ``attributes`` (``PANES_SCHEMA`` for ``trades``)."""
    return ", ".join(f"{name} {_SPARK_TYPES[kind]}" for name, kind in pane_columns(attributes))


STAT_FIELDS = stat_fields(ATTRIBUTES)
EVENT_FIELDS = event_fields(ATTRIBUTES)
PANES_SCHEMA = panes_schema(ATTRIBUTES)
NO_PARTITION = -1  # the ``partition`` of a pane row; progress rows carry their Kafka partition
#: Each worker process's keys' shards, per shard layout: Spark unpickles the parser afresh for every task, so what
#: outlives a batch lives here.
_SHARD_OF: dict[tuple[int, ...], dict[str, int]] = {}


def shard_of(key: str, shard_ids: tuple[int, ...]) -> int:
    return shard_ids[zlib.crc32(key.encode()) % len(shard_ids)]


#: JSON whitespace (RFC 8259), allowed between tokens.
_WS = r"[ \t\n\r]*"
#: A non-negative JSON number of bounded length: far from any rounding or overflow corner, so Arrow's parse
#: and pydantic's agree bit for bit (both round correctly). Anything longer or signed takes the careful path.
_NUMBER = r"(?:0|[1-9][0-9]{0,15})(?:\.[0-9]{1,17})?(?:[eE][+-]?[0-9]{1,2})?"
#: A plain event as producers write it (``Event.to_json``): its four fields once each, in order, flat, ASCII,
#: no escapes, a key of the allowed characters and length, ts a non-negative integer. Such a record is valid
#: exactly when ts <= MAX_TS and its values are <= max_value, which is checked on the parsed columns.
PLAIN_EVENT = (
    rf'^{_WS}\{{{_WS}"key"{_WS}:{_WS}"(?P<key>[A-Za-z0-9._:\-/]{{1,64}})"{_WS},'
    rf'{_WS}"ts"{_WS}:{_WS}(?P<ts>0|[1-9][0-9]{{0,14}}){_WS},'
    rf'{_WS}"price"{_WS}:{_WS}(?P<price>{_NUMBER}){_WS},'
    rf'{_WS}"volume"{_WS}:{_WS}(?P<volume>{_NUMBER}){_WS}\}}{_WS}$'
)


@dataclass
class ParsedRecords:
    """What a batch of raw records holds: events (columns, in arrival order), progress and dead letters.

    ``rows`` is each event's position in the batch; ``dead`` is in batch order.
    """

    rows: np.ndarray
    keys: np.ndarray  # str objects
    ts: np.ndarray
    values: dict[str, np.ndarray]
    progress: dict[int, int]
    dead: list[DeadLetter]
    refused: dict[str, int]

    def events(self) -> pd.DataFrame:
        return pd.DataFrame({"key": self.keys, "ts": self.ts, **self.values})


class RecordPanes:
    """Raw Kafka rows -> pane aggregates per shard, each partition's progress to every shard.

    Every record becomes an event, a heartbeat or a dead letter: :func:`ingest.model.parse_record`
    never raises, and anything unexpected in the per-record work here becomes a dead letter with
    an ``internal: ...`` reason, so a poison record costs that record only and a retried or
    restarted batch cannot crash on it again.

    Records are judged in two passes. The vectorised pass (Arrow's RE2 over the value column,
    then casts and range checks on whole columns) accepts only records it can prove are plain
    valid events (:data:`PLAIN_EVENT`, ts and values in range, not ahead of the clock) and
    yields exactly the events ``parse_record`` would; every other record -- heartbeats,
    malformed or hostile input, anything in an unusual layout -- goes through the per-record
    pass, which gives dead letters their field-level reasons. ``vectorised=False`` runs every
    record through the per-record pass (the reference the property tests compare against).

    Time the outside cannot hijack. An event whose time is more than ``max_future_skew_ms``
    ahead of the processing clock is dead-lettered, and such a heartbeat refused (and
    dead-lettered); neither counts as progress, so a partition's progress, hence the
    watermark, never passes processing time + skew. The processing clock is the
    micro-batch's timestamp (``current_timestamp()``, which Structured Streaming fixes when
    it plans a batch and records in the offset log), not the wall clock: a batch re-run
    after a failure or a restart sees the same clock, refuses the same records and so
    yields the same pane rows, progress and transitions, with the same alert ids. (With the
    wall clock, an event refused by the first attempt could be accepted by the replay, and
    the replay's alerts would differ from those already written.) A backlog read late is
    judged against the time it is read, never refused for being old.
    """

    #: The attributes of the pane rows (a declared stream's, ``evaluator.stream_records``, has its own).
    attributes: tuple[str, ...] = ATTRIBUTES
    #: Whose records: the series limit is per stream.
    stream: str = TRADES

    def __init__(self, settings: Settings, shard_ids: tuple[int, ...], *, vectorised: bool = True) -> None:
        self.settings = settings
        self.shard_ids = shard_ids
        self.vectorised = vectorised

    def _source(self, topic: str, partition: int, offset: int) -> str:
        """Where a record came from, as dead letters name it."""
        return f"{topic}[{partition}]@{offset}"

    def parse(self, raw: pd.DataFrame) -> ParsedRecords:
        """Judge every record of ``raw`` (no I/O)."""
        now = batch_clock(raw)
        plain = np.zeros(len(raw), dtype=bool)
        fast: tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]] | None = None
        if self.vectorised and len(raw):
            try:
                plain, fast = self._plain_events(raw, now)
            except Exception:  # noqa: BLE001 - the per-record pass judges every record instead
                plain, fast = np.zeros(len(raw), dtype=bool), None
        careful = self._parse_each(raw, np.flatnonzero(~plain), now)
        if fast is None:
            careful.progress = dict(sorted(careful.progress.items()))  # progress rows in partition order
            return careful
        rows = np.flatnonzero(plain)
        keys, ts, values = fast
        progress = dict(careful.progress)
        partitions = raw["partition"].to_numpy()[rows].astype(np.int64)
        for p in np.unique(partitions):
            newest = int(ts[partitions == p].max())
            progress[int(p)] = max(progress.get(int(p), newest), newest)
        order = np.argsort(np.concatenate([rows, careful.rows]), kind="stable")
        return ParsedRecords(
            np.concatenate([rows, careful.rows])[order],
            np.concatenate([keys, careful.keys])[order],
            np.concatenate([ts, careful.ts])[order],
            {a: np.concatenate([values[a], careful.values[a]])[order] for a in ATTRIBUTES},
            dict(sorted(progress.items())), careful.dead, careful.refused,
        )

    def _plain_events(self, raw: pd.DataFrame, now: int) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray, dict]]:
        """Which rows are plain valid events (a mask), and those events' key, ts and values."""
        limits = RecordLimits.of(self.settings)
        value = pa.array(raw["value"], type=pa.binary())
        fields = pc.extract_regex(value, PLAIN_EVENT)
        small = pc.less_equal(pc.binary_length(value), limits.max_record_bytes)
        # not cut to its start by the source; exactly None, as the per-record pass asks (NaN raises: all careful)
        whole = pa.array(raw["value_sha256"].to_numpy(dtype=object), type=pa.string(), from_pandas=False).is_null()
        candidate = pc.and_kleene(pc.and_kleene(fields.is_valid(), small), whole)
        matched = fields.filter(pc.fill_null(candidate, False))
        ts = pc.cast(pc.cast(matched.field("ts"), pa.string()), pa.int64()).to_numpy()
        values = {a: pc.cast(pc.cast(matched.field(a), pa.string()), pa.float64()).to_numpy() for a in ATTRIBUTES}
        ok = (ts <= MAX_TS) & (ts - now <= self.settings.max_future_skew_ms)
        for a in ATTRIBUTES:
            ok &= np.isfinite(values[a]) & (values[a] <= limits.max_value)
        mask = pc.fill_null(candidate, False).to_numpy(zero_copy_only=False)
        mask[np.flatnonzero(mask)[~ok]] = False
        keys = pc.cast(matched.field("key").filter(pa.array(ok)), pa.string()).to_numpy(zero_copy_only=False)
        return mask, (keys, ts[ok], {a: values[a][ok] for a in ATTRIBUTES})

    def _parse_each(self, raw: pd.DataFrame, rows: np.ndarray, now: int) -> ParsedRecords:
        """The per-record pass over ``rows`` of ``raw``: :func:`parse_record` with its field-level reasons."""
        limits = RecordLimits.of(self.settings)
        skew = self.settings.max_future_skew_ms
        events: list[tuple] = []
        progress: dict[int, int] = {}
        dead: list[DeadLetter] = []
        refused = {"future_events_refused": 0, "future_heartbeats_refused": 0}
        columns = ("topic", "partition", "offset", "value", "value_bytes", "value_sha256")
        # every record plain (the common case): no pandas take of six columns (~2 ms a batch for nothing)
        picked = (raw[c].iloc[rows] for c in columns) if len(rows) else ((),) * len(columns)
        for row, topic, partition, offset, value, size, digest in zip(rows, *picked, strict=True):
            source = self._source(topic, partition, offset)
            try:
                if digest is not None:  # the source kept only the start of an oversized record
                    dead.append(DeadLetter.of(
                        f"record: {int(size)} bytes, more than the {limits.max_record_bytes} allowed",
                        value, source, limits, size=int(size), digest=digest))
                    continue
                parsed = parse_record(value, source, limits)
                if isinstance(parsed, DeadLetter):
                    dead.append(parsed)
                    continue
                if parsed.ts - now > skew:
                    what = "heartbeat" if isinstance(parsed, Heartbeat) else "event"
                    refused[f"future_{what}s_refused"] += 1
                    dead.append(DeadLetter.of(
                        f"ts: {what} time {parsed.ts} is {parsed.ts - now} ms ahead of the processing clock "
                        f"({now}); at most {skew} allowed (TOCSIN_MAX_FUTURE_SKEW_MS)", value, source, limits))
                    continue
                if isinstance(parsed, Event):
                    events.append((row, parsed.key, parsed.ts, *(getattr(parsed, a) for a in ATTRIBUTES)))
                p = int(partition)
                progress[p] = max(progress.get(p, parsed.ts), parsed.ts)
            except Exception as exc:  # noqa: BLE001 - a record must never fail the batch
                dead.append(DeadLetter.of(f"internal: {type(exc).__name__}: {exc}", value, source, limits))
        cols: list[Any] = list(zip(*events, strict=True)) if events else [()] * (3 + len(ATTRIBUTES))
        return ParsedRecords(
            np.array(cols[0], dtype=np.int64),
            np.array(cols[1], dtype=object),
            np.array(cols[2], dtype=np.int64),
            {a: np.array(c, dtype=np.float64) for a, c in zip(ATTRIBUTES, cols[3:], strict=True)},
            progress, dead, refused,
        )

    def pane_rows(self, parsed: ParsedRecords) -> PaneRows:
        """The pane rows of ``parsed``'s events, in process (as :meth:`_frame` writes them and :func:`pane_rows` reads
        them back, without the Arrow round trip): what a backtest feeds its shard."""
        attributes = self.attributes
        if not len(parsed.ts):
            return PaneRows.empty(len(attributes))
        values = {a: np.asarray(parsed.values[a], dtype=np.float64) for a in attributes}
        panes, offsets, events = self._panes(np.asarray(parsed.keys, dtype=object), parsed.ts.astype(np.int64), values)
        return PaneRows(
            panes["key"], panes["pane_start"].astype(np.int64), panes["count"],
            np.vstack([panes[f"sum_{a}"] for a in attributes]), np.vstack([panes[f"min_{a}"] for a in attributes]),
            np.vstack([panes[f"max_{a}"] for a in attributes]), offsets.astype(np.int64), events[0].astype(np.int64),
            np.vstack([np.asarray(v, dtype=np.float64) for v in events[1:]]).reshape(len(attributes), -1),
        )

    def _frame(self, events: pd.DataFrame | list[tuple], progress: dict[int, int]) -> pa.RecordBatch:
        """Pane rows of ``events`` (key, ts, *ATTRIBUTES, in arrival order) and progress rows for every shard, as the
        Arrow batch Spark takes (``pane_columns``): columns built whole, each pane's events as slices of one array."""
        attributes = self.attributes
        stats = stat_fields(attributes)
        parts: list[dict[str, np.ndarray]] = []
        offsets, events_flat = [np.zeros(1, dtype=np.int32)], []
        if len(events):
            df = events if isinstance(events, pd.DataFrame) else pd.DataFrame.from_records(
                events, columns=["key", "ts", *attributes])
            panes, pane_offsets, pane_events = self._panes(
                df["key"].to_numpy(dtype=object), df["ts"].to_numpy(dtype=np.int64),
                {a: df[a].to_numpy(dtype=np.float64) for a in attributes})
            parts.append(panes | {"partition": np.full(len(panes["key"]), NO_PARTITION, dtype=np.int32),
                                  "progress": np.zeros(len(panes["key"]), dtype=np.int64)})
            offsets.append(pane_offsets[1:])
            events_flat.append(pane_events)
        if progress:
            partitions, newest = (np.array(c, dtype=np.int64) for c in zip(*progress.items(), strict=True))
            n = len(self.shard_ids) * len(partitions)
            zeros = np.zeros(n)
            parts.append({
                "shard": np.repeat(np.array(self.shard_ids, dtype=np.int64), len(partitions)),
                "key": np.full(n, "", dtype=object), "pane_start": np.zeros(n, dtype=np.int64),
                "count": np.zeros(n, dtype=np.int64), **dict.fromkeys(stats[1:], zeros),
                "partition": np.tile(partitions, len(self.shard_ids)).astype(np.int32),
                "progress": np.tile(newest, len(self.shard_ids)),
            })
            offsets.append(np.full(n, offsets[-1][-1], dtype=np.int32))  # no events
        schema = pa.schema(pane_columns(attributes))
        if not parts:
            return pa.RecordBatch.from_arrays([pa.array([], type=f.type) for f in schema], schema=schema)
        flat_offsets = pa.array(np.concatenate(offsets))
        columns = []
        for field in schema:
            if field.name.startswith("event_"):
                i = event_fields(attributes).index(field.name)
                values = (np.concatenate([e[i] for e in events_flat]) if events_flat
                          else np.empty(0, dtype=field.type.value_type.to_pandas_dtype()))
                columns.append(pa.ListArray.from_arrays(flat_offsets, pa.array(values, type=field.type.value_type)))
            else:
                columns.append(pa.array(np.concatenate([p[field.name] for p in parts]), type=field.type))
        return pa.RecordBatch.from_arrays(columns, schema=schema)

    def _panes(self, keys: np.ndarray, ts: np.ndarray,
               values: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], np.ndarray, list[np.ndarray]]:
        """One row per (key, pane) in (key, pane) order (count, sum/min/max per attribute, as columns), the panes'
        offsets into their events, and those events (ts, then each attribute's values).

        Array work only: keys are factorised (sorted, so rows come in key order), events sorted by
        (key, pane, time) with a stable sort, so among equal times arrival order holds and a pane's
        last event is LAST's; sums go through pandas' compensated group sum (as exact as ``math.fsum``
        to 1e-12), minima and maxima through ``reduceat``.

        A declared stream's keys are cells (``evaluator.views``): events of one key with equal times in
        different cells would be ordered by cell where a view joins the cells. So such ties split their
        cells' rows by :func:`tie_ranks`, and rows come in (key, rank, cell, pane) order: joined in row
        order and sorted stably by time (``evaluator.values``), equal times keep arrival order across cells.
        Without such ties every rank is 0 and the rows are those of (cell, pane) order.
        """
        codes, uniques = pd.factorize(keys, sort=True)
        pane = (ts // self.settings.pane_ms) * self.settings.pane_ms
        rank = tie_ranks(codes, uniques, ts)
        order = np.lexsort((ts, pane, codes, rank, _key_codes(uniques)[codes])) if rank is not None \
            else np.lexsort((ts, pane, codes))
        codes, pane, ts = codes[order], pane[order], ts[order]
        values = {a: v[order] for a, v in values.items()}
        boundary = (codes[1:] != codes[:-1]) | (pane[1:] != pane[:-1])
        if rank is not None:
            rank = rank[order]
            boundary |= rank[1:] != rank[:-1]
        first = np.flatnonzero(np.r_[True, boundary])
        ends = np.r_[first[1:], len(ts)]
        group = pd.Index(np.repeat(np.arange(len(first)), ends - first))
        shards = self._shards(uniques)
        sums = pd.DataFrame(values).groupby(group, sort=False).sum()  # NaN (a missing optional value) skipped
        panes = {"shard": shards[codes[first]], "key": np.asarray(uniques, dtype=object)[codes[first]],
                 "pane_start": pane[first], "count": (ends - first).astype(np.int64)}
        for a in self.attributes:
            panes[f"sum_{a}"] = sums[a].to_numpy()
            # fmin/fmax skip a missing optional value; a pane with none of it holds 0 (see evaluator.streams)
            panes[f"min_{a}"] = np.nan_to_num(np.fmin.reduceat(values[a], first), nan=0.0)
            panes[f"max_{a}"] = np.nan_to_num(np.fmax.reduceat(values[a], first), nan=0.0)
        values = {a: np.nan_to_num(v, nan=0.0) for a, v in values.items()}
        if self.settings.quantile_max_window_ms or self.settings.tuple_max_events:  # every event: quantiles, tuples
            offsets = np.r_[first, len(ts)].astype(np.int32)
        else:  # only the newest event of each pane, for LAST
            ts, values = ts[ends - 1], {a: v[ends - 1] for a, v in values.items()}
            offsets = np.arange(len(first) + 1, dtype=np.int32)
        return panes, offsets, [ts, *values.values()]

    def _shards(self, keys: pd.Index) -> np.ndarray:
        """Each key's shard: by the key of its cell (``evaluator.views``), remembered per worker, as keys recur."""
        known = _SHARD_OF.setdefault(self.shard_ids, {})
        if len(known) > self.settings.stream_max_series:  # keys turning over: bounded by the active series'
            known.clear()
        names = keys.tolist()
        for k in names:
            if k not in known:
                known[k] = shard_of(key_of(k), self.shard_ids)
        return np.fromiter(map(known.__getitem__, names), dtype=np.int64, count=len(names))


def _flat(lists: pd.Series, dtype: type) -> np.ndarray:
    return np.concatenate(lists.to_list()).astype(dtype) if len(lists) else np.empty(0, dtype=dtype)


def batch_clock(raw: pd.DataFrame) -> int:
    """The micro-batch's processing clock (ms), one timestamp for every row (see :class:`RecordPanes`)."""
    return int(raw["now"].iat[0]) if len(raw) else 0


def _key_codes(cells: np.ndarray | pd.Index) -> np.ndarray:
    """Each (sorted, distinct) cell's key as a code, in the cells' order."""
    return pd.factorize(np.array([key_of(c) for c in cells], dtype=object))[0]


def tie_ranks(codes: np.ndarray, cells: np.ndarray | pd.Index, ts: np.ndarray) -> np.ndarray | None:
    """Per event (in arrival order; ``codes`` index ``cells``): how many times the cell changed before it among
    the events of its key with its very time. None when no key has events of one time in two cells.

    Rows split by it and ordered by (key, rank, cell) list a key's equal-time events in arrival order:
    ``A@5, B@5, A@5`` ranks 0, 1, 2; ``A@5, A@5, B@5`` ranks 0, 0, 1.
    """
    if len(ts) < 2 or not any(SEP in c for c in cells):
        return None
    keys = _key_codes(cells)[codes]
    tied = np.flatnonzero(pd.DataFrame({"key": keys, "ts": ts}).duplicated(keep=False).to_numpy())  # a hash pass
    if not tied.size:
        return None
    order = tied[np.lexsort((tied, ts[tied], keys[tied]))]  # the tied events by key, time, arrival
    k, t, c = keys[order], ts[order], codes[order]
    same = (k[1:] == k[:-1]) & (t[1:] == t[:-1])
    switches = np.cumsum(np.r_[0, (same & (c[1:] != c[:-1])).astype(np.int64)])
    if not switches[-1]:
        return None
    run_base = np.maximum.accumulate(np.where(np.r_[True, ~same], switches, 0))
    rank = np.zeros(len(ts), dtype=np.int64)
    rank[order] = switches - run_base
    return rank


def pane_rows(frame: pd.DataFrame, attributes: tuple[str, ...] = ATTRIBUTES) -> PaneRows:
    """The pane rows of a parser's output frame (``panes_schema(attributes)``)."""
    lengths = np.fromiter((len(v) for v in frame["event_ts"]), dtype=np.int64, count=len(frame))
    return PaneRows(
        frame["key"].to_numpy(dtype=object),
        frame["pane_start"].to_numpy(dtype=np.int64),
        frame["count"].to_numpy(dtype=np.int64),
        np.vstack([frame[f"sum_{a}"].to_numpy(dtype=np.float64) for a in attributes]),
        np.vstack([frame[f"min_{a}"].to_numpy(dtype=np.float64) for a in attributes]),
        np.vstack([frame[f"max_{a}"].to_numpy(dtype=np.float64) for a in attributes]),
        np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        _flat(frame["event_ts"], np.int64),
        np.vstack([_flat(frame[f"event_{a}"], np.float64) for a in attributes]).reshape(len(attributes), -1),
    )


