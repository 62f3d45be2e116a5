"""Deliveries queued and not ended yet, sent again when they go silent: at least once, whatever the broker loses.

Celery's Redis transport (kombu) takes a message off its queue (``BRPOP``) before it writes it where the
visibility timeout restores it from (the ``unacked`` hash); a worker killed between the two - the reply still in
its socket, or read and not yet written back - loses the message for good (celery/kombu#305). Killed while the
dispatcher enqueued, a worker lost one grouped webhook of five keys that way (``test_order``'s killed worker, in
CI): nothing in the broker said so, and nothing sent it again.

- **Noted before it is queued.** Every delivery the dispatcher, a dead-letter replay, a test alert, the watchdog or a
  stale-stream notice queues is noted here first: ``pending`` (a sorted set of ``<notification>:<endpoint>``, by
  when it is *due* to show a sign of life) and ``pending-tasks`` (its task's arguments). Its final mark
  (delivered, dead-lettered, dropped: ``notifier.deliveries``) removes it.
- **Signs of life.** A run that puts its delivery back (a retry's countdown, a busy endpoint, a wait in line) moves
  its due time to the countdown plus :func:`silent_after_s`; so does a wake-up by the delivery ahead of it.
- **Sent again.** The dispatcher, every ``dispatcher_claim_interval_s``, takes the deliveries past due (moving their
  due time on by :func:`silent_after_s` in the same script, so two dispatchers never both take one) and publishes
  each again, logged and counted (``delivery_resent``, ``tocsin_delivery_resent_total``), unless it ended (its final
  mark: the note is removed), a copy is sending right now (its claim), or it may still wait in its lane's queue: each
  task carries when its note was written or last moved (:data:`NOTED_HEADER`), the queue is first in, first out, so
  a delivery noted before the queue's oldest message is not in it, however long the backlog behind (a backlog is
  not silence, but must not hide a loss either; ``notifier.resend.QueueHead``). It sends nothing within a silence of
  its start or of its last round that found Redis away (a worker holding a delivery it sent meanwhile records it
  first: ``notifier.tasks._Delivery.recorded``). A copy in delivery lines (``notifier.order``) is sent with its
  line's current wake-up count, so it is not taken for a stale copy.
- **Duplicates, not losses.** A delivery taken for silent that was alive after all (a task a dead worker held, which
  the broker hands back later, or one a saturated worker holds that long) runs twice at worst: its claim and final
  mark keep the sends one at a time and stop them once one succeeded, as for any redelivered copy. A delivery sent
  again starts its retries from the first.

:func:`silent_after_s` is two claims' holds and the broker's restore interval: by then a live worker has started a
task it holds (it reserves one per thread, each behind at most one attempt) or shown a sign of life, and an attempt
that was sending has ended. A task a dead worker held is sent again then, well before the broker's visibility timeout
would hand it back (that timeout outlasts the whole retry schedule: ~18 min by default, against 2 min): a worker
killed mid-delivery costs its alerts about two minutes, not eighteen. Its restored copy, later, finds the
delivery ended.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import redis

from core.redis_schema import RedisKeys
from core.settings import Settings
from notifier.channels import claim_ttl_s

RESEND_BATCH = 500  # the most deliveries one round takes: a deployment back from an outage catches up over rounds

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS: pending, pending-tasks. ARGV: member, task arguments (JSON), due in (ms). Returns when it was noted.
_ADD = _NOW + """
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
return now
"""

# KEYS: pending. ARGV: member, due in (ms). Only a delivery still noted (one that ended is not noted again). Returns
# when it was noted.
_ALIVE = _NOW + """
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
return now
"""

# KEYS: pending, pending-tasks. ARGV: how many at most, due again in (ms). Returns now, then member, task, due time
# it had, member, task, due time...
_DUE = _NOW + """
local due = redis.call('ZRANGE', KEYS[1], '-inf', now, 'BYSCORE', 'LIMIT', 0, tonumber(ARGV[1]), 'WITHSCORES')
local taken = {now}
for i = 1, #due, 2 do
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), due[i])
  taken[#taken + 1] = due[i]
  taken[#taken + 1] = redis.call('HGET', KEYS[2], due[i]) or ''
  taken[#taken + 1] = due[i + 1]
end
return taken
"""

#: The message header a noted delivery's task is published with: when (Redis's clock, ms) it was noted, so a look at
#: the oldest message of a queue tells which silent deliveries were queued before it (``notifier.resend``).
NOTED_HEADER = "tocsin_noted_ms"


def noted_headers(noted_ms: int) -> dict[str, int]:
    """The headers of a task published right after its note (or sign of life) at ``noted_ms``."""
    return {NOTED_HEADER: noted_ms}


def noted_ms_of(message: bytes | str) -> int | None:
    """When the delivery of a queued message (kombu's JSON envelope, as the Redis transport keeps it) was noted;
    ``None`` for a message published without the header (an un-noted task) or one that is not such an envelope."""
    try:
        headers = json.loads(message).get("headers") or {}
        noted = headers.get(NOTED_HEADER)
    except (ValueError, AttributeError):
        return None
    return noted if type(noted) is int else None


@dataclass(frozen=True)
class Silent:
    """A delivery past due: its notification id, endpoint and task arguments (``None``: its note lost them), the due
    time it had (Redis's clock, ms) and when it was taken."""

    notification_id: str
    endpoint_id: int
    task: dict | None
    due_ms: int
    taken_ms: int


def silent_after_s(settings: Settings) -> float:
    """How long a queued delivery may show no sign of life before it is sent again (see the module's docstring)."""
    return 2 * claim_ttl_s(settings) + settings.delivery_restore_interval_s


def member(notification_id: str, endpoint_id: int) -> str:
    return f"{notification_id}:{endpoint_id}"


def forget(pipe: redis.client.Pipeline, keys: RedisKeys, notification_id: str, endpoint_id: int) -> None:
    """Forget a delivery that ended, in the caller's pipeline (with its final mark)."""
    pipe.zrem(keys.pending_deliveries, member(notification_id, endpoint_id))
    pipe.hdel(keys.pending_tasks, member(notification_id, endpoint_id))


class Outbox:
    """The deliveries of one deployment that were queued and have not ended (see the module's docstring)."""

    def __init__(self, client: redis.Redis, keys: RedisKeys, settings: Settings) -> None:
        self.redis, self.keys = client, keys
        self.silent_after_s = silent_after_s(settings)
        self._add = client.register_script(_ADD)
        self._alive = client.register_script(_ALIVE)
        self._due = client.register_script(_DUE)

    def add(self, payload: dict, endpoint_id: int, kwargs: dict) -> int | None:
        """Note a delivery about to be queued, with its task's arguments; returns when (Redis's clock, ms), for its
        message's headers (:func:`noted_headers`). A task that is not a delivery (a malformed dead letter replayed:
        no notification id or endpoint) is not noted (``None``): the worker dead-letters it again."""
        if not isinstance(payload.get("notification_id"), str) or type(endpoint_id) is not int:
            return None
        task = json.dumps({"notification": payload, "endpoint_id": endpoint_id, "kwargs": kwargs},
                          separators=(",", ":"))
        return int(self._add(keys=[self.keys.pending_deliveries, self.keys.pending_tasks],
                             args=[member(payload["notification_id"], endpoint_id), task,
                                   round(self.silent_after_s * 1000)]))

    def alive(self, notification_id: str, endpoint_id: int, next_run_s: float = 0.0) -> int:
        """A sign of life: the delivery runs again in ``next_run_s``; returns when it was noted (Redis's clock, ms),
        for the headers of the message that runs it again."""
        return int(self._alive(keys=[self.keys.pending_deliveries],
                               args=[member(notification_id, endpoint_id),
                                     round((next_run_s + self.silent_after_s) * 1000)]))

    def due(self, limit: int = RESEND_BATCH) -> list[Silent]:
        """Take the deliveries past due (each due again after :attr:`silent_after_s`)."""
        reply = self._due(keys=[self.keys.pending_deliveries, self.keys.pending_tasks],
                          args=[limit, round(self.silent_after_s * 1000)])
        taken, silent = int(reply[0]), []
        for i in range(1, len(reply), 3):
            notification_id, _, endpoint = reply[i].rpartition(":")
            silent.append(Silent(notification_id, int(endpoint), json.loads(reply[i + 1]) if reply[i + 1] else None,
                                 int(float(reply[i + 2])), taken))
        return silent

    def forget(self, notification_id: str, endpoint_id: int) -> None:
        pipe = self.redis.pipeline()
        forget(pipe, self.keys, notification_id, endpoint_id)
        pipe.execute()

    def count(self) -> int:
        """How many deliveries are queued and not ended."""
        return int(self.redis.zcard(self.keys.pending_deliveries))
