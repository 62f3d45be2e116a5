"""What every shared window structure has: a ring of raw values, its position, growth, bytes.

Reference implementation of the paper (see the package docstring): production does not import
it; the other structures of this package build on it.
"""

from __future__ import annotations

import struct
from abc import ABC, abstractmethod
from typing import Any, Self

import numpy as np

from evaluator.monoid import Agg, Monoid, monoid

_HEADER = struct.Struct("<8sQQ")  # aggregate name, position, capacity


def pow2_at_least(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


class WindowStructure(ABC):
    """Base of B-INT, L-INT, R-INT and the baselines. Raw values live in a ring of ``capacity``."""

    def __init__(self, agg: Agg | str, capacity: int, **options: Any) -> None:
        self.monoid: Monoid = monoid(agg)
        self.options = options
        self.capacity = pow2_at_least(max(capacity, 2))
        self.mask = self.capacity - 1
        self.n = 0  # number of elements appended: the next position
        self.start = 0  # first position ever held (later after a rebuild or restore)
        self.values: list[float] = [self.monoid.identity] * self.capacity

    @abstractmethod
    def append(self, value: float) -> None: ...

    def extend(self, values: np.ndarray | list[float]) -> None:
        for v in np.asarray(values, dtype=float).tolist():
            self.append(v)

    @abstractmethod
    def range(self, start: int, end: int) -> float:
        """Aggregate of positions ``[start, end)`` (a historical window); the identity if empty."""

    def lookup(self, width: int) -> float:
        """Aggregate of the last ``width`` elements (a suffix window)."""
        return self.range(max(self.n - width, self.oldest), self.n)

    @property
    def oldest(self) -> int:
        """Oldest position still retained."""
        return max(self.n - self.capacity, self.start)

    def _check(self, start: int, end: int) -> bool:
        """True if the window is non-empty; raises if it reaches outside what is retained."""
        if start >= end:
            return False
        if start < self.oldest or end > self.n:
            raise IndexError(f"window [{start}, {end}) is outside the retained [{self.oldest}, {self.n})")
        return True

    def _skip_to(self, position: int) -> None:
        """Make an empty structure start at ``position`` (the elements before it are gone)."""
        self.n = self.start = position

    def retained_values(self) -> list[float]:
        return [self.values[p & self.mask] for p in range(self.oldest, self.n)]

    def grow(self, capacity: int) -> None:
        """Retain at least ``capacity`` positions: rebuild derived state from the raw values."""
        if capacity <= self.capacity:
            return
        fresh = type(self)(self.monoid.agg, capacity, **self.options)
        fresh._skip_to(self.oldest)
        fresh.extend(self.retained_values())
        self.__dict__.update(fresh.__dict__)

    def to_bytes(self) -> bytes:
        """Only the retained raw values: everything else is derived, so state stays compact."""
        body = np.asarray(self.retained_values(), dtype=np.float64).tobytes()
        return _HEADER.pack(self.monoid.agg.value.encode(), self.n, self.capacity) + body

    @classmethod
    def from_bytes(cls, blob: bytes, **options: Any) -> Self:
        name, n, capacity = _HEADER.unpack_from(blob)
        values = np.frombuffer(blob, dtype=np.float64, offset=_HEADER.size)
        structure = cls(name.rstrip(b"\0").decode(), capacity, **options)
        structure._skip_to(n - len(values))
        structure.extend(values)
        return structure


def dyadic_cover(start: int, end: int, top: int) -> list[tuple[int, int]]:
    """The O(log(end - start)) base intervals ``(level, index)`` that tile ``[start, end)``.

    Level ``l`` index ``i`` is the base interval ``[i * 2**l, (i + 1) * 2**l)``; no level exceeds ``top``.
    """
    cover = []
    a = start
    while a < end:
        level = min((a & -a).bit_length() - 1 if a else top, top)
        while a + (1 << level) > end:
            level -= 1
        cover.append((level, a >> level))
        a += 1 << level
    return cover
