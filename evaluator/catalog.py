"""The set of active subscriptions, indexed for evaluation, and the changes that made it.

Pure: built from a snapshot (a list of specs with a version) and brought forward by
:class:`CatalogChange` diffs; the Spark adapter decides when to reload it. A catalog
remembers the recent changes that led to it (:meth:`Catalog.changes_since`), so a
reader that saw an older version can apply just those, in time proportional to the
change, instead of regrouping every subscription.
"""

from __future__ import annotations

import json
import zlib
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from evaluator.spec import SubscriptionSpec


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


@dataclass(frozen=True)
class Catalog:
    version: int
    subscriptions: tuple[SubscriptionSpec, ...]
    # The latest changes that led to ``version``, oldest first, contiguous (each one version after the previous,
    # the last at ``version``); empty when this catalog was read from a snapshot.
    changes: tuple[CatalogChange, ...] = ()
    _all_keys: tuple[SubscriptionSpec, ...] = field(init=False, repr=False)
    _by_key: dict[str, tuple[SubscriptionSpec, ...]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        everyone: list[SubscriptionSpec] = []
        by_key: dict[str, list[SubscriptionSpec]] = defaultdict(list)
        for spec in self.subscriptions:
            if spec.keys is None:
                everyone.append(spec)
            else:
                for key in spec.keys:
                    by_key[key].append(spec)
        object.__setattr__(self, "_all_keys", tuple(everyone))
        object.__setattr__(self, "_by_key", {k: tuple(v) for k, v in by_key.items()})

    def for_key(self, key: str) -> Iterable[SubscriptionSpec]:
        """Subscriptions whose key filter admits ``key``: all-key ones first, then named ones."""
        return self._all_keys + self._by_key.get(key, ())

    def changes_since(self, version: int | None) -> tuple[CatalogChange, ...] | None:
        """The changes from ``version`` to this catalog, oldest first; None when they are not all known
        (a reader that far behind, or with no version, must start from the whole catalog)."""
        if version == self.version:
            return ()
        if version is None or version > self.version or not self.changes or self.changes[0].version > version + 1:
            return None
        return tuple(c for c in self.changes if c.version > version)

    def applied(self, change: CatalogChange, keep: int = 1_000) -> Catalog:
        """This catalog with ``change`` applied (it must be the next version), remembering up to ``keep`` changes."""
        if change.version != self.version + 1:
            raise ValueError(f"change {change.version} does not follow catalog version {self.version}")
        gone = set(change.removals) | {s.id for s in change.upserts}
        specs = tuple(s for s in self.subscriptions if s.id not in gone) + change.upserts
        return Catalog(change.version, specs, (*self.changes, change)[-keep:] if keep else ())

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
        specs = [s.to_dict() for s in self.subscriptions]
        for spec in specs:
            spec["condition"] = {k: v for k, v in spec["condition"].items() if v is not None or k == "attribute"}
        data = {"version": self.version, "subscriptions": specs}
        return zlib.compress(json.dumps(data, separators=(",", ":")).encode(), 6)

    @classmethod
    def decode(cls, raw: bytes) -> Catalog:
        """A published snapshot (plain JSON, as published before compression, is read too)."""
        return cls.from_dict(json.loads(raw if raw[:1] == b"{" else zlib.decompress(raw)))
