"""Redis replies as the text they are: every Tocsin client is made with ``decode_responses=True``.

redis-py types replies ``bytes | str`` because decoding is a run-time option it cannot see.
These helpers state the option once, with a cheap check that the client really decodes,
instead of a cast at every call site.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import cast


def _decoded(sample: object) -> None:
    if isinstance(sample, bytes):
        raise TypeError("a Redis reply in bytes: make the client with decode_responses=True")


def text_hash(reply: Mapping[bytes | str, bytes | str]) -> dict[str, str]:
    """An HGETALL reply."""
    for field in reply:
        _decoded(field)
        break
    return cast("dict[str, str]", reply)


def text_entries(reply: Sequence[tuple[bytes | str | None, Mapping[bytes | str, bytes | str] | None]] | None
                 ) -> list[tuple[str, dict[str, str]]]:
    """An XRANGE or XREVRANGE reply: (entry id, fields) oldest or newest first; an empty stream gives []."""
    entries = list(reply or [])
    if entries:
        _decoded(entries[0][0])
    return cast("list[tuple[str, dict[str, str]]]", entries)
