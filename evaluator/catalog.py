"""The set of active subscriptions, indexed for evaluation, and the changes that made it.

Pure: built from a snapshot (a list of specs with a version) and brought forward by
:class:`CatalogChange` diffs; the Spark adapter decides when to reload it. A catalog
remembers the recent changes that led to it (:meth:`Catalog.changes_since`), so a
reader that saw an older version can apply just those, in time proportional to the
change, instead of regrouping every subscription.

A catalog is persistent: :meth:`Catalog.applied` leaves the old one intact and shares
its specs with the new one. The specs live in a base dict (never changed once shared)
and a small overlay of the ids changed since (spec, or None for removed); the overlay
is folded into a new base when it outgrows ~sqrt(n) ids, so a change costs its own
size plus an amortised O(sqrt(n)) of C-speed dict copying, never a Python loop over
every subscription. ``subscriptions`` and the per-key index are built on first use.
"""

from __future__ import annotations

import json
import zlib
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from math import isqrt

from evaluator.spec import SubscriptionSpec

_MIN_OVERLAY = 64  # ids an overlay may hold before it is folded into a new base, whatever the catalog's size


def _compact(spec: SubscriptionSpec) -> dict[str, object]:
    """A spec as published: without absent condition fields (they are most of them)."""
    data = spec.to_dict()
    data["condition"] = {k: v for k, v in data["condition"].items() if v is not None or k == "attribute"}
    return data


def _pack(data: dict[str, object]) -> bytes:
    return zlib.compress(json.dumps(data, separators=(",", ":")).encode(), 6)


def _unpack(raw: bytes) -> dict:
    """Compact JSON, zlib-compressed (plain JSON, as published before compression, is read too)."""
    return json.loads(raw if raw[:1] == b"{" else zlib.decompress(raw))


#: What decoding a published change or snapshot raises when it is not one this code can read.
UNREADABLE = (ValueError, KeyError, TypeError, zlib.error)


@dataclass(frozen=True)
class CatalogChange:
    """One committed edit, from ``version - 1`` to ``version``: whole specs added or edited, and ids removed.

    An upsert of an id already present replaces that subscription (an edit); a removal
    of an id not present is a no-op (removals are idempotent).
    """

    version: int
    upserts: tuple[SubscriptionSpec, ...] = ()
    removals: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, object]:
        return {"version": self.version, "upserts": [s.to_dict() for s in self.upserts],
                "removals": list(self.removals)}

    @classmethod
    def from_dict(cls, data: dict) -> CatalogChange:
        return cls(int(data["version"]), tuple(SubscriptionSpec.from_dict(s) for s in data.get("upserts", ())),
                   tuple(int(i) for i in data.get("removals", ())))

    def encode(self) -> bytes:
        """The change as published in the change log: compact like the snapshot."""
        return _pack({"version": self.version, "upserts": [_compact(s) for s in self.upserts],
                      "removals": list(self.removals)})

    @classmethod
    def decode(cls, raw: bytes) -> CatalogChange:
        return cls.from_dict(_unpack(raw))


class _Base:
    """Specs by id, shared by every catalog derived from it and never changed; its key index is built on first use."""

    __slots__ = ("_index", "specs")

    def __init__(self, specs: dict[int, SubscriptionSpec]) -> None:
        self.specs = specs
        self._index: tuple[tuple[SubscriptionSpec, ...], dict[str, tuple[SubscriptionSpec, ...]]] | None = None

    def index(self) -> tuple[tuple[SubscriptionSpec, ...], dict[str, tuple[SubscriptionSpec, ...]]]:
        """The all-key subscriptions, and the others by the keys they name."""
        if self._index is None:
            everyone: list[SubscriptionSpec] = []
            by_key: dict[str, list[SubscriptionSpec]] = defaultdict(list)
            for spec in self.specs.values():
                if spec.keys is None:
                    everyone.append(spec)
                else:
                    for key in spec.keys:
                        by_key[key].append(spec)
            self._index = (tuple(everyone), {k: tuple(v) for k, v in by_key.items()})
        return self._index


class Catalog:
    """The active subscriptions at ``version``, and the latest ``changes`` that led to it.

    ``changes`` are oldest first, contiguous (each one version after the previous, the last
    at ``version``); empty when this catalog was read from a snapshot.
    """

    __slots__ = ("_base", "_changes", "_overlay", "_subscriptions", "_version")

    def __init__(self, version: int, subscriptions: Iterable[SubscriptionSpec] = (),
                 changes: Iterable[CatalogChange] = ()) -> None:
        given = tuple(subscriptions)
        self._version = version
        self._changes = tuple(changes)
        self._base = _Base({s.id: s for s in given})
        self._overlay: dict[int, SubscriptionSpec | None] = {}
        self._subscriptions: tuple[SubscriptionSpec, ...] | None = given

    @classmethod
    def _derived(cls, version: int, base: _Base, overlay: dict[int, SubscriptionSpec | None],
                 changes: tuple[CatalogChange, ...]) -> Catalog:
        catalog = cls.__new__(cls)
        catalog._version, catalog._base, catalog._overlay, catalog._changes = version, base, overlay, changes
        catalog._subscriptions = None
        return catalog

    @property
    def version(self) -> int:
        return self._version

    @property
    def changes(self) -> tuple[CatalogChange, ...]:
        return self._changes

    @property
    def subscriptions(self) -> tuple[SubscriptionSpec, ...]:
        """Every active subscription: the snapshot's order, edited and added ones last, in the order of their changes."""
        if self._subscriptions is None:
            overlay = self._overlay
            kept = (s for i, s in self._base.specs.items() if i not in overlay)
            self._subscriptions = (*kept, *(s for s in overlay.values() if s is not None))
        return self._subscriptions

    def get(self, subscription_id: int) -> SubscriptionSpec | None:
        """One subscription by id, or None when it is not in the catalog."""
        if subscription_id in self._overlay:
            return self._overlay[subscription_id]
        return self._base.specs.get(subscription_id)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Catalog):
            return NotImplemented
        return (self.version, self.subscriptions, self.changes) == (other.version, other.subscriptions, other.changes)

    def __hash__(self) -> int:
        return hash((self.version, self.subscriptions))

    def __repr__(self) -> str:
        return f"Catalog(version={self.version}, subscriptions={self.subscriptions!r}, changes={len(self.changes)})"

    def for_key(self, key: str) -> Iterable[SubscriptionSpec]:
        """Subscriptions whose key filter admits ``key``: all-key ones first, then named ones."""
        everyone, by_key = self._base.index()
        overlay = self._overlay
        if not overlay:
            return everyone + by_key.get(key, ())
        added = [s for s in overlay.values() if s is not None]
        return (*(s for s in everyone if s.id not in overlay), *(s for s in added if s.keys is None),
                *(s for s in by_key.get(key, ()) if s.id not in overlay),
                *(s for s in added if s.keys is not None and key in s.keys))

    def changes_since(self, version: int | None) -> tuple[CatalogChange, ...] | None:
        """The changes from ``version`` to this catalog, oldest first; None when they are not all known
        (a reader that far behind, or with no version, must start from the whole catalog)."""
        if version == self.version:
            return ()
        if version is None or version > self.version or not self.changes or self.changes[0].version > version + 1:
            return None
        return tuple(c for c in self.changes if c.version > version)

    def applied(self, change: CatalogChange, keep: int = 1_000) -> Catalog:
        """This catalog with ``change`` applied (it must be the next version), remembering up to ``keep`` changes.

        The old catalog is left as it was; the cost is the change's size plus the overlay's (see the module doc).
        """
        if change.version != self.version + 1:
            raise ValueError(f"change {change.version} does not follow catalog version {self.version}")
        base, overlay = self._base, dict(self._overlay)
        for sid in change.removals:
            overlay.pop(sid, None)
            if sid in base.specs:
                overlay[sid] = None
        for spec in change.upserts:
            overlay.pop(spec.id, None)  # an edit moves to the end, as if removed and added
            overlay[spec.id] = spec
        if len(overlay) > max(_MIN_OVERLAY, isqrt(len(base.specs))):
            specs = {i: s for i, s in base.specs.items() if i not in overlay}
            specs.update((i, s) for i, s in overlay.items() if s is not None)
            base, overlay = _Base(specs), {}
        return Catalog._derived(change.version, base, overlay, (*self.changes, change)[-keep:] if keep else ())

    def brought_forward(self, log: Iterable[tuple[int, bytes]], keep: int = 1_000) -> Catalog:
        """This catalog with the encoded changes of ``log`` (version, payload; in version order) that follow it applied.

        Entries at or below this version are skipped undecoded; it stops at the first gap or entry it cannot
        decode, so a reader never applies a change whose predecessor it has not applied.
        """
        catalog = self
        for version, payload in log:
            if version <= catalog.version:
                continue
            if version != catalog.version + 1:
                break
            try:
                change = CatalogChange.decode(payload)
            except UNREADABLE:  # e.g. written by a newer web app: a gap, so readers keep what they hold
                break
            catalog = catalog.applied(change, keep)
        return catalog

    @classmethod
    def empty(cls) -> Catalog:
        return cls(0, ())

    def to_dict(self) -> dict[str, object]:
        return {"version": self.version, "subscriptions": [s.to_dict() for s in self.subscriptions]}

    @classmethod
    def from_dict(cls, data: dict) -> Catalog:
        return cls(int(data["version"]), tuple(SubscriptionSpec.from_dict(s) for s in data["subscriptions"]))

    def encode(self) -> bytes:
        """The snapshot as published: compact JSON without absent fields, zlib-compressed (key lists repeat a lot)."""
        return _pack({"version": self.version, "subscriptions": [_compact(s) for s in self.subscriptions]})

    @classmethod
    def decode(cls, raw: bytes) -> Catalog:
        """A published snapshot (plain JSON, as published before compression, is read too)."""
        return cls.from_dict(_unpack(raw))


def rewritten_snapshot(snapshot: bytes | None, log: Iterable[tuple[int, bytes]]) -> tuple[int, bytes]:
    """A published snapshot (None: the empty catalog) brought forward by the log's contiguous changes after it,
    and its version: what :meth:`Catalog.brought_forward` then :meth:`Catalog.encode` give, worked on the JSON
    alone, since building every spec is most of the cost of a snapshot (the writer's amortised rewrite)."""
    data: dict = _unpack(snapshot) if snapshot else {"version": 0, "subscriptions": []}
    version = int(data["version"])
    specs = {int(s["id"]): s for s in data["subscriptions"]}
    for at, payload in log:
        if at <= version:
            continue
        if at != version + 1:
            break
        change = _unpack(payload)
        for sid in change.get("removals", ()):
            specs.pop(int(sid), None)
        for spec in change.get("upserts", ()):
            specs.pop(int(spec["id"]), None)  # an edit moves to the end, as in Catalog.applied
            specs[int(spec["id"])] = spec
        version = at
    return version, _pack({"version": version, "subscriptions": list(specs.values())})

