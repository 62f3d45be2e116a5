"""The set of active subscriptions, indexed for evaluation.

Pure: built from a snapshot (a list of specs with a version); the Spark adapter
decides when to reload it.
"""

from __future__ import annotations

import json
import zlib
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from evaluator.spec import SubscriptionSpec


@dataclass(frozen=True)
class Catalog:
    version: int
    subscriptions: tuple[SubscriptionSpec, ...]
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
