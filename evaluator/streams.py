"""Streams as the evaluator sees them: the registry's schemas, and each stream's share of the catalog.

The web app and the admin CLI publish every declared stream's schema to Redis (the stream
registry, ``subscriptions.streams.publish_registry``); the Spark adapter decodes it
(``evaluator.spark.registry``) into the :class:`StreamShape` this pure code needs. Each stream has its own
streaming query (``evaluator.spark.streams``), whose shards evaluate only the subscriptions
whose ``Condition.stream`` names that stream: :class:`StreamCatalogs` derives that share of
the catalog from the whole one, following the whole one's changes in time proportional to
them (the share has the whole catalog's versions, so a shard's catch-up by
``Catalog.changes_since`` works unchanged).

Optional attributes, dimension filters and key prefixes. A condition is over its *view*
(``evaluator.views``): the events passing its ``WHERE`` filters and key prefix and carrying every
optional attribute it names; each shard evaluates each view in use on its own
(``evaluator.substreams``). So every aggregate of an optional attribute is exact (over the events
that carry it), and :func:`refusal` refuses only what a stream does not have (an attribute or a
dimension it does not declare: a subscription left over from a schema the registry no longer
holds), logged and counted, so the evaluator never alerts on a value it cannot compute.

Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from core.stream_names import TRADES
from evaluator.catalog import Catalog, CatalogChange
from evaluator.spec import Condition, SubscriptionSpec


@dataclass(frozen=True)
class StreamShape:
    """What the evaluator needs of a stream's schema (``core.streams.StreamSchema``; built by the Spark adapter)."""

    name: str
    attributes: tuple[str, ...]
    optional: frozenset[str] = frozenset()
    dimensions: tuple[str, ...] = ()

    @classmethod
    def of(cls, schema: Any) -> StreamShape:
        """From a ``core.streams.StreamSchema`` (duck-typed: the evaluator's pure code does not import it)."""
        return cls(schema.name, tuple(schema.attribute_names),
                   frozenset(a.name for a in schema.attributes if not a.required), tuple(schema.dimension_names))


def refusal(condition: Condition, schema: StreamShape | None) -> str | None:
    """Why the stream's query cannot evaluate ``condition`` (None: it can). ``schema`` None: ``trades`` before any
    registry was read (its conditions are checked against its attributes by the language)."""
    if schema is None:
        return None
    named = [term.attribute for term in condition.terms if term.attribute]
    if condition.percent_of:
        named.append(condition.percent_of)
    for attribute in named:
        if attribute not in schema.attributes:
            return f"stream {schema.name!r} has no attribute {attribute!r}"
    dimensions = set(schema.dimensions)
    unknown = [d for d, _ in condition.where if d not in dimensions]
    if unknown:
        return f"stream {schema.name!r} has no dimension {unknown[0]!r}"
    return None


def _on(spec: SubscriptionSpec, stream: str) -> bool:
    return spec.condition.stream == stream


@dataclass
class StreamCatalogs:
    """Each stream's share of the catalog, derived from the whole catalog and kept in step with it.

    ``schema`` is the stream's (None for ``trades`` read before any registry: every condition on it is
    taken as exact). Shares are cached by the whole catalog's version; a share follows the whole catalog's
    changes one by one when it can, else is rebuilt from the whole catalog.
    """

    keep: int = 1_000
    _shares: dict[tuple[str, StreamShape | None], tuple[int, Catalog]] = field(default_factory=dict)
    refused: dict[int, str] = field(default_factory=dict)  # subscription id -> why it is not evaluated
    _refused_on: dict[int, str] = field(default_factory=dict)  # subscription id -> the stream that refused it

    def share(self, whole: Catalog, stream: str, schema: StreamShape | None = None) -> Catalog:
        held = self._shares.get((stream, schema))
        if held is not None and held[0] == whole.version:
            return held[1]
        changes = whole.changes_since(held[1].version) if held is not None else None
        if held is not None and changes is not None:
            share = held[1]
            for change in changes:
                share = share.applied(self._filtered(change, stream, schema), self.keep)
        else:
            for sid in [sid for sid in self.refused if whole.get(sid) is None]:
                self._forget(sid)
            share = Catalog(whole.version, [s for s in whole.subscriptions if self._admitted(s, stream, schema)])
        self._shares[(stream, schema)] = (whole.version, share)
        return share

    def _forget(self, sid: int) -> None:
        self.refused.pop(sid, None)
        self._refused_on.pop(sid, None)

    def _admitted(self, spec: SubscriptionSpec, stream: str, schema: StreamShape | None) -> bool:
        if not _on(spec, stream):
            # Moved to another stream: a refusal this stream recorded is stale (the shares follow the same
            # changes in any order, so the other stream may have admitted it already).
            if self._refused_on.get(spec.id) == stream:
                self._forget(spec.id)
            return False
        reason = refusal(spec.condition, schema)
        if reason is None:
            self._forget(spec.id)
            return True
        self.refused[spec.id] = reason
        self._refused_on[spec.id] = stream
        return False

    def _filtered(self, change: CatalogChange, stream: str, schema: StreamShape | None) -> CatalogChange:
        """``change`` as the stream's share sees it: upserts of other streams' (or refused) subscriptions are removals."""
        for sid in change.removals:
            self._forget(sid)
        kept = tuple(s for s in change.upserts if self._admitted(s, stream, schema))
        dropped = tuple(s.id for s in change.upserts if s not in kept)
        return CatalogChange(change.version, kept, (*change.removals, *dropped))


def is_builtin(stream: str) -> bool:
    return stream == TRADES
