"""A declared stream's records -> pane rows, judged by the stream's schema (pure; live and backtests).

``trades`` keeps :class:`evaluator.records.RecordPanes` (its fast path is tuned to the
trades record). Any other stream's records are judged by ``core.streams.StreamValidator`` on
the stream's wire schema, the same judge as the publishing API and ``ingest.streams``, so a
record is refused here exactly when a publisher would have been told it is invalid:

- heartbeats (records naming ``kind``) are separated first and read by ``ingest.model.parse_record``;
- a record the source cut to its start (over ``max_record_bytes``) is a dead letter unread;
- every other record is judged in one vectorised call (``validate_values``); rejects are dead letters
  with the validator's field-level reason and ``stream <name>: <topic>[<partition>]@<offset>`` as source;
- accepted events dated beyond the batch clock + ``max_future_skew_ms`` are dead letters, as for trades;
- accepted wire records are read into columns by Arrow's JSON reader; a missing optional attribute is a
  NaN, which the pane stage leaves out (see ``evaluator.streams``);
- each event's key becomes its cell's (``evaluator.views``: its dimension values and the optional attributes
  it carries), so every view of the stream can be had from the pane rows; shards still go by the key.

The live query's ``evaluator.spark.stream_parse`` adds what :class:`PaneParser` does around :meth:`parse`
(dead letters, stats).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from core.settings import Settings
from core.streams import RecordLimits as StreamLimits
from core.streams import StreamSchema, StreamValidator
from evaluator.records import ParsedRecords, RecordPanes, batch_clock
from evaluator.views import read_wire
from ingest.model import DeadLetter, Heartbeat, RecordLimits, parse_record

_KIND = b'"kind"'


class StreamRecordPanes(RecordPanes):
    """:class:`RecordPanes` for a declared stream: the stream's schema as the judge."""

    def __init__(self, settings: Settings, shard_ids: tuple[int, ...], schema: StreamSchema,
                 columns: tuple[str, ...] | None = None) -> None:
        """``columns``: the pane rows' attributes (default the schema's); one the schema no longer declares is
        always missing (see ``evaluator.spark.supervisor.query_attributes``)."""
        super().__init__(settings, shard_ids)
        self.schema = schema.wire()
        self.stream = schema.name
        self.attributes = columns if columns is not None else self.schema.attribute_names
        self._validator: StreamValidator | None = None  # built in the worker (pydantic models do not pickle)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_validator": None}

    @property
    def validator(self) -> StreamValidator:
        if self._validator is None:
            self._validator = StreamValidator(self.schema, StreamLimits.of(self.settings))
        return self._validator

    def _source(self, topic: str, partition: int, offset: int) -> str:
        return f"stream {self.schema.name}: " + super()._source(topic, partition, offset)

    def parse(self, raw: pd.DataFrame) -> ParsedRecords:
        """Judge every record of ``raw`` (no I/O)."""
        limits = RecordLimits.of(self.settings)
        now = batch_clock(raw)
        skew = self.settings.max_future_skew_ms
        values = raw["value"].tolist()
        digests = raw["value_sha256"].tolist()
        partitions = raw["partition"].to_numpy().astype(np.int64)
        sources = [self._source(t, p, o) for t, p, o in zip(raw["topic"], raw["partition"], raw["offset"], strict=True)]
        dead: list[tuple[int, DeadLetter]] = []
        refused = {"future_events_refused": 0, "future_heartbeats_refused": 0}
        progress: dict[int, int] = {}
        judged: list[int] = []
        for row, (value, digest) in enumerate(zip(values, digests, strict=True)):
            if digest is not None:  # the source kept only the start of an oversized record
                size = int(raw["value_bytes"].iat[row])
                dead.append((row, DeadLetter.of(f"record: {size} bytes, more than the {limits.max_record_bytes} "
                                                "allowed", value, sources[row], limits, size=size, digest=digest)))
            elif _KIND in value:
                beat = parse_record(value, sources[row], limits)
                if not isinstance(beat, Heartbeat):  # an event (``"kind"`` inside a value), or invalid: judged
                    judged.append(row)
                elif beat.ts - now > skew:
                    refused["future_heartbeats_refused"] += 1
                    dead.append((row, DeadLetter.of(_ahead("heartbeat", beat.ts, now, skew), value, sources[row],
                                                    limits)))
                else:
                    p = int(partitions[row])
                    progress[p] = max(progress.get(p, beat.ts), beat.ts)
            else:
                judged.append(row)
        rows = np.asarray(judged, dtype=np.int64)
        batch = self.validator.validate_values([values[r] for r in judged])
        for reject in batch.rejected:
            row = int(rows[reject.index])
            dead.append((row, DeadLetter.of(reject.reason, values[row], sources[row], limits)))
        accepted = rows[batch.indices] if len(batch.indices) else np.empty(0, np.int64)
        keys, ts, columns = read_wire(batch.records, self.attributes, self.schema.dimension_names,
                                      self.schema.required_attributes)
        ahead = ts - now > skew
        for i in np.flatnonzero(ahead).tolist():
            row = int(accepted[i])
            refused["future_events_refused"] += 1
            dead.append((row, DeadLetter.of(_ahead("event", int(ts[i]), now, skew), values[row], sources[row],
                                            limits)))
        keep = ~ahead
        accepted, keys, ts = accepted[keep], keys[keep], ts[keep]
        columns = {a: c[keep] for a, c in columns.items()}
        for p in np.unique(partitions[accepted]).tolist():
            newest = int(ts[partitions[accepted] == p].max())
            progress[p] = max(progress.get(p, newest), newest)
        dead.sort(key=lambda d: d[0])
        return ParsedRecords(accepted, keys, ts, columns, dict(sorted(progress.items())), [d for _, d in dead],
                             refused)


def _ahead(what: str, ts: int, now: int, skew: int) -> str:
    return (f"ts: {what} time {ts} is {ts - now} ms ahead of the processing clock ({now}); at most {skew} allowed "
            "(TOCSIN_MAX_FUTURE_SKEW_MS)")
