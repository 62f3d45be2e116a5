"""The interface every substream index shares, its batched update, and the table of the keys it holds."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Generic, Protocol, TypeVar

MAX_KEYS = 1 << 24


class _HasId(Protocol):
    id: int


T = TypeVar("T", bound=_HasId)


class KeyTable(Generic[T]):
    """The keys an index holds, by name and by dense id (ids index stamp buckets and per-key arrays).

    An index holds a key only while the key has an element in the retained horizon: it
    :meth:`drop` s the key when expiry empties it, and the key's id goes to the next new
    key. So the id tables are as long as the most keys held at once, never every key
    ever seen, and a key that returns starts afresh.
    """

    __slots__ = ("by_id", "by_name", "free", "live", "names")

    def __init__(self) -> None:
        self.by_name: dict[str, T] = {}
        self.by_id: list[T] = []  # a freed id's slots keep the stale entry and name until the id is reused
        self.names: list[str] = []
        self.free: list[int] = []
        self.live: set[int] = set()  # ids of the keys held

    def get(self, key: str, make: Callable[[int], T]) -> T:
        """The key's entry, made by ``make(id)`` under a fresh or recycled id if the key is not held."""
        item = self.by_name.get(key)
        if item is not None:
            return item
        if self.free:
            i = self.free.pop()
            item = self.by_id[i] = make(i)
            self.names[i] = key
        else:
            if len(self.names) >= MAX_KEYS:
                raise OverflowError("too many keys for one index")
            item = make(len(self.names))
            self.by_id.append(item)
            self.names.append(key)
        self.by_name[key] = item
        self.live.add(item.id)
        return item

    def drop(self, item: T) -> None:
        """Forget ``item``'s key; its id is free for the next new key."""
        i = item.id
        del self.by_name[self.names[i]]
        self.live.discard(i)
        self.free.append(i)

    def ordered(self) -> list[T]:
        """The entries held, by id (what serialisation writes; ids are compacted on load)."""
        by_id = self.by_id
        return [by_id[i] for i in sorted(self.live)]

    def __len__(self) -> int:
        return len(self.live)


class SubstreamIndex(ABC):
    @abstractmethod
    def add(self, key: str, ts: int, value: float) -> None: ...

    @abstractmethod
    def expire(self, before_ts: int) -> None: ...

    def add_batch(self, keys: Iterable[str], ts: Iterable[int], values: Iterable[float]) -> None:
        """Fold a batch of (key, time, value) rows, e.g. Spark's per-(key, pane) pre-aggregation."""
        for key, t, v in zip(keys, ts, values, strict=True):
            self.add(key, int(t), float(v))
