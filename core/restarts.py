"""Process restarts as a supervisor records them, for the operators' dashboard to show.

The local runner (``devstack.run``) restarts a platform process that exited; it has
no metrics endpoint of its own, so it counts each restart in one Redis hash
(``ops:restarts``), which every web process reads for ``/ops``: per process, the
restarts since the runner started, the last one's time and exit code, the crashes
in a row and whether it is crash-looping. The runner also logs each one
(``process_restarted``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import redis

from core.redis_replies import text_hash
from core.redis_schema import RedisKeys


@dataclass(frozen=True)
class Restarts:
    """One process's restarts as the supervisor last recorded them."""

    process: str
    restarts: int  # restarts since the supervisor started
    last_at: float  # when it last exited (Unix time)
    last_code: int | None  # its last exit code (negative: killed by that signal)
    in_a_row: int  # crashes without staying up ``runner_restart_reset_s`` in between
    crash_looping: bool
    next_in_s: float  # the backoff before this restart


def record(client: redis.Redis, keys: RedisKeys, entry: Restarts) -> None:
    client.hset(keys.process_restarts, entry.process, json.dumps(asdict(entry)))


def forget(client: redis.Redis, keys: RedisKeys) -> None:
    """A new runner starts counting afresh (the counts are of this run's platform)."""
    client.delete(keys.process_restarts)


def recorded(client: redis.Redis, keys: RedisKeys) -> list[Restarts]:
    """Every process's record, by name; an unreadable entry is skipped (the dashboard must render)."""
    found = []
    for _name, raw in sorted(text_hash(client.hgetall(keys.process_restarts)).items()):
        try:
            found.append(Restarts(**json.loads(raw)))
        except (ValueError, TypeError):
            continue
    return found
