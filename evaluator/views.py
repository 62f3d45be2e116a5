"""Views: the substream a condition is over, and the cells a stream's events are kept in so every view can be had.

A condition on a declared stream is over the events of its *view*: those whose dimensions
pass its ``WHERE`` filters (each dimension IN its values), whose key starts with its key
prefix, and which carry every optional attribute the condition names (an aggregate of an
optional attribute is over the events that have it: AVG, MIN, MAX, LAST, ... are then exact,
and SUM is what it always was). The whole stream is the view with no filter (``View()``).

To have any view's windows at once, even a view first asked for long after its events
arrived, a declared stream's pane rows are kept per *cell*: the key, the event's dimension
values and which optional attributes it carries. Every view is a union of cells, so a view's
pane rows are the rows of its cells with the cell reduced to the key. A cell is written into
the pane row's key as ``key + SEP + JSON`` (keys cannot hold ``SEP``: ``core.streams.KEY_CHARS``);
an event with no dimension and no optional attribute has the plain key as its cell.

Pure: no I/O.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.json as pa_json

from evaluator.panerows import PaneRows
from evaluator.spec import Condition

#: Between a key and its cell's dimensions and attributes in a cell key (never in a key).
SEP = "\x1f"


@dataclass(frozen=True)
class View:
    """Which events of a stream a condition is over: ``View()`` is the whole stream."""

    where: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (dimension, values), as ``Condition.where``
    key_prefix: str | None = None
    present: tuple[str, ...] = ()  # optional attributes every event must carry (sorted)

    @classmethod
    def of(cls, condition: Condition, optional: frozenset[str] = frozenset()) -> View:
        named = {term.attribute for term in condition.terms if term.attribute}
        if condition.percent_of:
            named.add(condition.percent_of)
        return cls(condition.where, condition.key_prefix, tuple(sorted(named & optional)))

    @property
    def whole(self) -> bool:
        return self == View()

    @property
    def order(self) -> str:
        """Views are evaluated in this order (so transitions come in one order on every copy)."""
        return json.dumps(self.to_json())

    def to_json(self) -> list:
        return [[[d, list(vs)] for d, vs in self.where], self.key_prefix, list(self.present)]

    @classmethod
    def from_json(cls, data: list) -> View:
        where, prefix, present = data
        return cls(tuple((d, tuple(vs)) for d, vs in where), prefix, tuple(present))

    def admits(self, cell: str) -> bool:
        """Whether the events of ``cell`` are in this view."""
        key, dimensions, present = split_cell(cell)
        if self.key_prefix is not None and not key.startswith(self.key_prefix):
            return False
        if any(dimensions.get(d) not in values for d, values in self.where):
            return False
        return all(a in present for a in self.present)


def cell_suffix(dimensions: dict[str, str], present: list[str]) -> str:
    """What follows the key in a cell key ("" for no dimension and no optional attribute)."""
    if not dimensions and not present:
        return ""
    return SEP + json.dumps([dict(sorted(dimensions.items())), sorted(present)], separators=(",", ":"))


@lru_cache(maxsize=65_536)
def _suffix(text: str) -> tuple[dict[str, str], frozenset[str]]:
    dimensions, present = json.loads(text)
    return dimensions, frozenset(present)


def split_cell(cell: str) -> tuple[str, dict[str, str], frozenset[str]]:
    """A cell key's key, dimension values and optional attributes carried."""
    key, sep, rest = cell.partition(SEP)
    if not sep:
        return key, {}, frozenset()
    return key, *_suffix(rest)


def key_of(cell: str) -> str:
    return cell.partition(SEP)[0]


@dataclass(frozen=True)
class Cells:
    """The distinct cells of a batch's pane rows, each row's cell and each cell's key: found once per batch and
    used by every view."""

    names: list[str]
    of_row: np.ndarray  # index into names, per row
    keys: np.ndarray  # object array: each cell's key

    @classmethod
    def of(cls, rows: PaneRows) -> Cells:
        names, of_row = np.unique(rows.keys.astype(str), return_inverse=True)
        listed = names.tolist()
        return cls(listed, of_row, np.array([key_of(c) for c in listed], dtype=object))


def rows_in(rows: PaneRows, view: View, cells: Cells | None = None) -> PaneRows:
    """The pane rows of ``view`` among cell rows: its cells' rows, keyed by the key (several rows may share a
    (key, pane): the shard combines them). ``cells``: the rows' :class:`Cells`, when already found."""
    if not len(rows):
        return rows
    cells = cells or Cells.of(rows)
    admitted = np.fromiter((view.admits(c) for c in cells.names), dtype=bool, count=len(cells.names))
    mask = admitted[cells.of_row]
    if not mask.any():
        return PaneRows.empty(rows.sums.shape[0])
    kept = rows if mask.all() else rows.select(mask)
    return PaneRows(cells.keys[cells.of_row[mask]], kept.starts, kept.counts, kept.sums, kept.mins, kept.maxs,
                    kept.event_offsets, kept.event_ts, kept.event_values)


def read_wire(records: list[str], attributes: tuple[str, ...], dimensions: tuple[str, ...],
              required: frozenset[str]) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Valid wire records of a stream (``core.streams.StreamSchema.wire``) read into columns by Arrow's JSON
    reader: each record's cell key, its time and its ``attributes`` (NaN: a missing optional value, or an attribute
    the schema no longer declares). ``required``: the attributes every record has; the others make cells."""
    if not records:
        return (np.empty(0, dtype=object), np.empty(0, dtype=np.int64),
                {a: np.empty(0, dtype=np.float64) for a in attributes})
    arrow_schema = pa.schema([("key", pa.string()), ("ts", pa.int64()),
                              *((a, pa.float64()) for a in attributes), *((d, pa.string()) for d in dimensions)])
    table = pa_json.read_json(
        io.BytesIO("\n".join(records).encode("utf-8")),
        read_options=pa_json.ReadOptions(block_size=max(1 << 20, 2 * sum(map(len, records)))),
        parse_options=pa_json.ParseOptions(explicit_schema=arrow_schema, unexpected_field_behavior="ignore"),
    )
    keys = table.column("key").to_numpy().astype(object)
    ts = table.column("ts").to_numpy().astype(np.int64)
    columns = {a: table.column(a).to_numpy(zero_copy_only=False).astype(np.float64) for a in attributes}
    optional = [a for a in attributes if a not in required]
    if dimensions or optional:
        cells = pd.DataFrame({**{f"d{i}": table.column(d).to_numpy(zero_copy_only=False).astype(object)
                                 for i, d in enumerate(dimensions)},
                              **{f"a{i}": ~np.isnan(columns[a]) for i, a in enumerate(optional)}})
        codes, distinct = pd.MultiIndex.from_frame(cells).factorize()
        suffixes = np.array([cell_suffix({d: v for d, v in zip(dimensions, cell[:len(dimensions)], strict=True)
                                          if isinstance(v, str)},
                                         [a for a, has in zip(optional, cell[len(dimensions):], strict=True) if has])
                             for cell in distinct.tolist()], dtype=object)
        keys = keys + suffixes[codes]
    return keys, ts, columns
