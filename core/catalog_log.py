"""The subscription catalog in Redis: a versioned change log, and a snapshot for new or lagging readers.

Writers (the subscriptions service) append each committed change as one Stream entry
with id ``<version>-0``, so the Stream's order is the version order; readers (the
evaluator's workers) read the entries after the version they hold. Payloads are opaque
bytes here (``evaluator.catalog`` encodes them). Each script runs atomically and keeps:

- ``version`` is the newest version published, and only grows while Redis keeps its data;
- an entry is appended only at ``version + 1``, so the log never has a gap after the
  snapshot; a writer whose predecessor has not published yet is told so (:data:`GAP`),
  one whose version is already passed is told that (:data:`STALE`);
- the log holds every change after ``snapshot-version`` and up to ``keep`` before
  it, so the snapshot plus the log reach ``version``;
- a snapshot that jumps ahead of ``version`` (read from the database, the truth) drops
  the log, which cannot lead to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, cast

import redis

from core.redis_schema import RedisKeys

_APPEND = """
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
local snapshot = tonumber(redis.call('GET', KEYS[3]) or '0')
local v = tonumber(ARGV[1])
if v <= current then return {-1, snapshot} end
if v > current + 1 then return {0, snapshot} end
local oldest = math.max(1, math.min(snapshot, v - tonumber(ARGV[3])) + 1)
redis.call('XADD', KEYS[2], 'MINID', tostring(oldest), ARGV[1] .. '-0', 'c', ARGV[2])
redis.call('SET', KEYS[1], ARGV[1])
return {1, snapshot}
"""

_SNAPSHOT = """
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
local snapshot = tonumber(redis.call('GET', KEYS[3]) or '0')
local v = tonumber(ARGV[1])
if ARGV[3] == '1' then
  if v <= current then return 0 end
  redis.call('DEL', KEYS[2])
  redis.call('SET', KEYS[1], ARGV[1])
elseif v <= snapshot or v > current then
  return 0
end
redis.call('SET', KEYS[4], ARGV[2])
redis.call('SET', KEYS[3], ARGV[1])
return 1
"""

_READ = """
local version = redis.call('GET', KEYS[1]) or '0'
if ARGV[1] == 'snapshot' then
  local at = redis.call('GET', KEYS[3]) or '0'
  local after = tostring(tonumber(at) + 1) .. '-0'
  return {version, redis.call('XRANGE', KEYS[2], after, '+'), at, redis.call('GET', KEYS[4]) or ''}
end
return {version, redis.call('XRANGE', KEYS[2], ARGV[1] .. '-0', '+')}
"""


class Appended(IntEnum):
    """What became of an appended change."""

    STALE = -1  # a newer version is there: the change is in it, or Redis is ahead of this database
    GAP = 0  # the previous version is not there yet: its writer is late, or lost it
    APPENDED = 1


@dataclass(frozen=True)
class LogRead:
    """One atomic read: the newest version, the log entries asked for (version, payload), and maybe the snapshot."""

    version: int
    entries: list[tuple[int, bytes]]
    snapshot_version: int = 0
    snapshot: bytes | None = field(default=None, repr=False)


class CatalogLog:
    def __init__(self, client: redis.Redis, keys: RedisKeys, keep: int = 0) -> None:
        self.client = client
        self.keep = keep
        self._keys = [keys.catalog_version, keys.catalog_changes, keys.catalog_snapshot_version, keys.catalog_snapshot]
        self._append = client.register_script(_APPEND)
        self._snapshot = client.register_script(_SNAPSHOT)

    def version(self) -> int:
        return int(self.client.get(self._keys[0]) or 0)

    def append(self, version: int, payload: bytes) -> tuple[Appended, int]:
        """Append the change at ``version`` if it is the next one; returns the outcome and the snapshot's version."""
        status, snapshot = cast("list[int]", self._append(keys=self._keys[:3], args=[version, payload, self.keep]))
        return Appended(int(status)), int(snapshot)

    def publish_snapshot(self, version: int, payload: bytes, rewrite: bool = False) -> bool:
        """Publish the whole catalog at ``version``.

        A new catalog (``rewrite=False``) must be newer than every version published and replaces
        the log; a rewrite is of a version the log already reaches, newer than the current snapshot.
        """
        return bool(self._snapshot(keys=self._keys, args=[version, payload, 0 if rewrite else 1]))

    def _eval(self, arg: str) -> list[Any]:
        reply = self.client.execute_command("EVAL", _READ, len(self._keys), *self._keys, arg, NEVER_DECODE=True)
        return cast("list[Any]", reply)

    @staticmethod
    def _entries(reply: list[Any]) -> list[tuple[int, bytes]]:
        return [(int(entry_id.split(b"-", 1)[0]), fields[1]) for entry_id, fields in reply]

    def read(self, after: int) -> LogRead:
        """The newest version and the log's entries after ``after``."""
        version, entries = self._eval(str(after + 1))
        return LogRead(int(version), self._entries(entries))

    def read_with_snapshot(self) -> LogRead:
        """The newest version, the snapshot (None if there is none) and the log's entries after it."""
        version, entries, at, snapshot = self._eval("snapshot")
        return LogRead(int(version), self._entries(entries), int(at), snapshot or None)
