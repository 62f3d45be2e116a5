"""The interface every substream index shares, and its one batched update."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable

MAX_KEYS = 1 << 24


class SubstreamIndex(ABC):
    names: list[str]  # key of each dense key id

    def _new_id(self, key: str) -> int:
        """Give ``key`` the next dense id (ids index the stamp buckets and per-key arrays)."""
        if len(self.names) >= MAX_KEYS:
            raise OverflowError("too many keys for one index")
        self.names.append(key)
        return len(self.names) - 1

    @abstractmethod
    def add(self, key: str, ts: int, value: float) -> None: ...

    @abstractmethod
    def expire(self, before_ts: int) -> None: ...

    def add_batch(self, keys: Iterable[str], ts: Iterable[int], values: Iterable[float]) -> None:
        """Fold a batch of (key, time, value) rows, e.g. Spark's per-(key, pane) pre-aggregation."""
        for key, t, v in zip(keys, ts, values, strict=True):
            self.add(key, int(t), float(v))
