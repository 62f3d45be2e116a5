"""What became of every notification, in Redis: attempt logs, delivered marks, dead letters.

- ``deliveries:<subscription>``: the newest attempts (and policy suppressions) of a
  subscription, newest first, for its delivery log, and ``deliveries:endpoint:<id>``,
  the newest attempts at one endpoint (test alerts included);
- ``delivered:<notification>:<endpoint>``: set once a delivery ended for good
  (``delivered``, ``dead`` or ``dropped``), so a redelivered copy of its task
  never sends twice nor runs again after its dead letter was written, and ``sending:<notification>:<endpoint>``,
  held while one copy of a task is sending, so two copies never send at once;
- ``deliveries:dead``: a hash of deliveries that failed for good, by
  ``<notification>:<endpoint>``, kept until an operator replays or discards them;
- ``inflight:endpoint:<id>`` and ``inflight:owner:<user>``: sorted sets of the
  attempts in flight (scored by when their hold expires), the per-endpoint and
  per-owner caps that keep one slow receiver from taking every worker thread,
  ``inflight:took:<id>``, how long the endpoint's last attempt took (ms), which tells a
  delivery that finds the endpoint's cap full when to look again, and ``inflight:turn:<id>``,
  the last turn (Redis clock, ms) handed to a delivery that found it full: deliveries that
  find an endpoint full line up behind each other, each coming back when a slot should be
  free for it, instead of all looking again and again.

On a Redis Cluster a delivery's ``delivered`` and ``sending`` marks share a slot (claimed in one
transaction), and an owner's in-flight sets share one (taken by one script); the final mark and the
log lines and counters written with it span slots, so there they are one pipelined round trip rather
than one transaction: the mark, not the log, decides that a delivery never runs twice (docs/redis.md).

A delivery task is bound to its endpoint as it was when the delivery was queued:
its id, its owner and its *generation* (a fingerprint of its channel, address and
stored secret). The worker drops a delivery whose endpoint is gone, belongs to
someone else or changed since (a rotated secret), and records why.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass

import redis
from celery import Celery

from core.redis_schema import RedisKeys
from notifier.app import DELIVER_TASK, queue_for
from notifier.attempt import Attempt
from notifier.notification import Notification, test_notification
from notifier.outbox import Outbox, forget, noted_headers
from notifier.rendering import unknown_states
from subscriptions.routing import EndpointRoute

ATTEMPT_LOG_LENGTH = 1_000
DELIVERED_MARK_TTL_S = 30 * 24 * 3600
ATTEMPT_TIME_TTL_S = 3600  # an endpoint's last attempt time, older than this, no longer says when a slot frees


# KEYS: the endpoint's and the owner's in-flight sets, the endpoint's last attempt time (ms), its last turn handed
# out (ms). ARGV: token, endpoint cap, owner cap, hold (ms), the longest in-thread wait (ms), the furthest turn
# (ms from now). Returns 1 once both slots are held, else {0, which cap is full (1 endpoint, 2 owner), the
# endpoint's last attempt time or -1, 1 if the token holds an owner slot while it waits, its turn}. Only the
# endpoint full, and quick (twice its last attempt time within the wait): the token takes an owner slot to wait
# in - so a thread waiting counts against its owner's cap like one sending - or keeps the one it took at an
# earlier call, and the endpoint slot is added to it once one is free. The endpoint full and the token not
# waiting: its turn is ms from now after the last one handed out (or now), one slot's worth of the endpoint's
# time later (the longer of its last attempt time and the age of its oldest attempt in flight - so holds kept
# long by a receiver that answers others at once space the line out -, a quarter more for slack, over its cap,
# at least 10 ms), -2 if that is past the furthest turn (the line is that long: it holds no turn), -1 if the
# endpoint's time is unknown or turns are not asked for (a furthest turn < 0). A line further ahead than the
# furthest turn (the Redis clock stepped back) starts again from now.
_TAKE_SLOT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local waiting = redis.call('ZSCORE', KEYS[2], ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  local took = tonumber(redis.call('GET', KEYS[3]) or '-1') or -1
  if not waiting and took >= 0 and tonumber(ARGV[5]) > 0 and 2 * took <= tonumber(ARGV[5])
      and redis.call('ZCARD', KEYS[2]) < tonumber(ARGV[3]) then
    redis.call('ZADD', KEYS[2], now + ttl, ARGV[1])
    redis.call('PEXPIRE', KEYS[2], ttl)
    waiting = true
  end
  local turn = -1
  local furthest = tonumber(ARGV[6])
  if not waiting and took >= 0 and furthest >= 0 then
    local line = math.floor(tonumber(redis.call('GET', KEYS[4]) or '0') or 0)
    if line > now + furthest then line = now end
    local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
    local held = now - (tonumber(oldest[2]) - ttl)
    local at = math.max(now, line) + math.max(10, math.ceil(math.max(took, held) * 1.25 / tonumber(ARGV[2])))
    turn = -2
    if at - now <= furthest then
      redis.call('SET', KEYS[4], at, 'PX', at - now + ttl)
      turn = at - now
    end
  end
  return {0, 1, took, waiting and 1 or 0, turn}
end
if not waiting and redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[3]) then return {0, 2, -1, 0, -1} end
for i = 1, 2 do
  redis.call('ZADD', KEYS[i], now + ttl, ARGV[1])
  redis.call('PEXPIRE', KEYS[i], ttl)
end
return 1
"""


_DELETE_IF_UNCHANGED = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then return redis.call('HDEL', KEYS[1], ARGV[1]) end
return 0
"""


@dataclass(frozen=True)
class Busy:
    """Why a delivery found no slot: which cap was full, (its own endpoint's) how long its last attempt took,
    whether it holds one of its owner's slots to wait in, and its turn in the endpoint's line: in how long a slot
    should be free for it (``turn_s``), or that the line is longer than a turn may be (``line_full``)."""

    endpoint_full: bool
    last_attempt_s: float | None = None
    waiting: bool = False
    turn_s: float | None = None
    line_full: bool = False


def _json(value: dict) -> str:
    return json.dumps(value, separators=(",", ":"))


def endpoint_generation(kind: str, target: str, stored_secret: str | None) -> str:
    """Changes whenever what a delivery is bound to changes: the channel, the address, the stored secret."""
    material = json.dumps([kind, target, stored_secret])
    return hashlib.sha256(material.encode()).hexdigest()[:16]


def binding(endpoint: EndpointRoute) -> dict:
    """The task arguments that bind a delivery to this endpoint as it is now.

    The one place a generation is taken from an endpoint (enqueueing and the
    worker's check both come here), over the secret as stored.
    """
    return {"owner_id": endpoint.owner_id,
            "generation": endpoint_generation(endpoint.kind, endpoint.target, endpoint.stored_secret)}


def enqueue(celery: Celery, outbox: Outbox, payload: dict, endpoint_id: int, bound: dict) -> None:
    """Queue one delivery of a notification's JSON, in the lane of its kind (test alerts have their own), noted in
    the outbox first: sent again should the broker lose it (``notifier.outbox``).

    Takes the JSON as it is so a dead letter replays exactly what failed; new
    deliveries come through :func:`enqueue_notification`.
    """
    publish(celery, payload, endpoint_id, bound, outbox.add(payload, endpoint_id, bound))


def publish(celery: Celery, payload: dict, endpoint_id: int, kwargs: dict, noted_ms: int | None) -> None:
    """Put a delivery task on its lane's queue (the outbox's resend publishes a noted one again here), with when its
    note was written (``None``: not noted), which tells the resend what was queued before it."""
    celery.send_task(DELIVER_TASK, args=(payload, endpoint_id), kwargs=kwargs, queue=queue_for(celery, payload),
                     headers=None if noted_ms is None else noted_headers(noted_ms))


def enqueue_notification(celery: Celery, outbox: Outbox, notification: Notification, endpoint_id: int,
                         bound: dict) -> None:
    """Queue one delivery of ``notification`` (the typed contract the delivery task reads back)."""
    enqueue(celery, outbox, notification.to_json(), endpoint_id, bound)


def enqueue_test_alert(celery: Celery, outbox: Outbox, endpoint: EndpointRoute) -> str:
    """Queue a made-up alert to one endpoint through the real delivery task; returns its notification id."""
    notification = test_notification(endpoint.id, int(time.time() * 1000))
    enqueue_notification(celery, outbox, notification, endpoint.id, binding(endpoint))
    return notification.notification_id


def _unknown(notification: dict) -> dict:
    """``{"state_unknown": [keys]}``: the keys resolved without a record of their firing (``notifier.policy``)."""
    keys = unknown_states(notification)
    return {"state_unknown": keys} if keys else {}


def dead_letter_id(notification_id: str, endpoint_id: int) -> str:
    return f"{notification_id}:{endpoint_id}"


class DeliveryRecords:
    def __init__(self, client: redis.Redis, keys: RedisKeys) -> None:
        self.redis = client  # decode_responses=True
        self.keys = keys
        self._take_slot = client.register_script(_TAKE_SLOT)  # by its digest: a waiting thread calls it often

    # -- writing (worker, dispatcher) ------------------------------------------------------

    def _log(self, pipe: redis.client.Pipeline, subscription_id: int | None, entry: dict,
             endpoint_log: bool = True, stats: redis.client.Pipeline | None = None) -> None:
        line = _json({**entry, "at": time.time()})
        logs = [self.keys.delivery_log(subscription_id)] if subscription_id is not None else []
        if endpoint_log and entry.get("endpoint_id") is not None:
            logs.append(self.keys.endpoint_log(entry["endpoint_id"]))
        for log_key in logs:
            pipe.lpush(log_key, line)
            pipe.ltrim(log_key, 0, ATTEMPT_LOG_LENGTH - 1)
        (pipe if stats is None else stats).hincrby(self.keys.delivery_stats, entry["outcome"], 1)

    @staticmethod
    def _entry(notification: dict, endpoint_id: int, kind: str | None, attempt: Attempt, number: int,
               outcome: str) -> dict:
        return {
            "notification_id": notification["notification_id"],
            "endpoint_id": endpoint_id,
            "kind": kind,
            "state": notification["state"],
            "reminder": notification.get("reminder", False),
            "keys": [a["key"] for a in notification["alerts"]],
            "attempt": number,
            "outcome": outcome,
            **attempt.detail(),
            **_unknown(notification),
        }

    def attempt(self, notification: dict, endpoint_id: int, kind: str | None, attempt: Attempt, number: int,
                outcome: str) -> None:
        pipe = self.redis.pipeline()
        self._log(pipe, notification["subscription_id"], self._entry(notification, endpoint_id, kind, attempt,
                                                                     number, outcome))
        pipe.execute()

    def _finished(self, pipe: redis.client.Pipeline, notification_id: str, endpoint_id: int, outcome: str) -> None:
        """Mark the delivery's final outcome, in the caller's transaction: later copies of its task do nothing, and
        the outbox no longer waits for a sign of its life (``notifier.outbox``)."""
        pipe.set(self.keys.delivered(notification_id, endpoint_id), outcome, ex=DELIVERED_MARK_TTL_S)
        forget(pipe, self.keys, notification_id, endpoint_id)

    def delivered(self, notification: dict, endpoint_id: int, kind: str, attempt: Attempt, number: int) -> None:
        pipe = self.redis.pipeline()
        self._finished(pipe, notification["notification_id"], endpoint_id, "delivered")
        self._log(pipe, notification["subscription_id"],
                  self._entry(notification, endpoint_id, kind, attempt, number, "delivered"))
        pipe.execute()

    def dead(self, notification: dict, endpoint_id: int, kind: str | None, attempt: Attempt, number: int,
             bound: dict | None = None) -> None:
        entry = self._entry(notification, endpoint_id, kind, attempt, number, "dead")
        letter = {"id": dead_letter_id(notification["notification_id"], endpoint_id), "notification": notification,
                  **entry, "binding": bound or {}, "dead_at": time.time()}
        pipe = self.redis.pipeline()
        pipe.hset(self.keys.dead_letters, letter["id"], _json(letter))
        self._finished(pipe, notification["notification_id"], endpoint_id, "dead")
        self._log(pipe, notification["subscription_id"], entry)
        pipe.execute()

    def malformed(self, payload: dict, reason: str) -> str:
        """Dead-letter a task whose arguments are not a delivery (no notification id, no endpoint, ...).

        Nothing of it can be trusted, so it is kept whole (for the operator to read)
        under an id derived from its content; returns that id.
        """
        raw = json.dumps(payload, sort_keys=True, default=repr)
        notification = payload.get("notification")
        letter_id = f"malformed:{hashlib.sha256(raw.encode()).hexdigest()[:16]}"
        letter: dict[str, object] = {"id": letter_id,
                                     "notification": notification if isinstance(notification, dict) else {},
                                     "endpoint_id": payload.get("endpoint_id"), "kind": None, "keys": [], "state": None,
                                     "attempt": payload.get("attempt"), "outcome": "dead", "error": f"malformed task: {reason}",
                                     "payload": raw[:10_000], "binding": {}, "dead_at": time.time()}
        pipe = self.redis.pipeline()
        pipe.hset(self.keys.dead_letters, letter_id, _json(letter))
        pipe.hincrby(self.keys.delivery_stats, "dead", 1)
        pipe.execute()
        return letter_id

    def dropped(self, notification: dict, endpoint_id: int, reason: str, number: int) -> None:
        """Log that a delivery was dropped because its endpoint is gone or changed.

        Only in the subscription's log: the endpoint's log (by id) is not the old
        delivery's to write to any more.
        """
        entry = {**self._entry(notification, endpoint_id, None, Attempt(False, False, 0.0, error=reason), number,
                               "dropped"), "reason": reason}
        pipe = self.redis.pipeline()
        self._finished(pipe, notification["notification_id"], endpoint_id, "dropped")
        self._log(pipe, notification["subscription_id"], entry, endpoint_log=False)
        pipe.execute()

    def suppressed(self, subscription_id: int, alert: dict, reason: str, pipe: redis.client.Pipeline,
                   stats: redis.client.Pipeline, silence_id: int | None = None) -> None:
        """Log, in the caller's transaction, that the alert policy or a silence (``silence_id``) held a transition back.

        The log is in the subscription's slot (``core.redis_schema``), the count in ``stats``: the
        deployment-wide counters are in a slot of their own on a Redis Cluster.
        """
        entry = {"alert_id": alert["alert_id"], "keys": [alert["key"]], "state": alert["state"],
                 "outcome": "suppressed", "reason": reason}
        self._log(pipe, subscription_id, entry if silence_id is None else {**entry, "silence_id": silence_id},
                  stats=stats)

    def claim(self, notification_id: str, endpoint_id: int, ttl_s: float) -> tuple[bool, bool]:
        """(claimed, already finished: delivered, dead-lettered or dropped), in one round trip.

        Only one copy of a delivery is in flight at a time; a dead holder's claim
        expires after ``ttl_s``.
        """
        pipe = self.redis.pipeline(transaction=True)
        pipe.exists(self.keys.delivered(notification_id, endpoint_id))
        pipe.set(self.keys.sending(notification_id, endpoint_id), "1", nx=True, px=int(ttl_s * 1000))
        delivered, claimed = pipe.execute()
        if delivered and claimed:
            self.release(notification_id, endpoint_id)
        return bool(claimed) and not delivered, bool(delivered)

    def finished(self, notification_id: str, endpoint_id: int) -> bool:
        """Whether the delivery ended for good (delivered, dead-lettered or dropped)."""
        return bool(self.redis.exists(self.keys.delivered(notification_id, endpoint_id)))

    def sending(self, notification_id: str, endpoint_id: int) -> bool:
        """Whether a copy of the delivery holds its claim (is sending, or died doing so within the claim's hold)."""
        return bool(self.redis.exists(self.keys.sending(notification_id, endpoint_id)))

    def release(self, notification_id: str, endpoint_id: int) -> None:
        self.redis.delete(self.keys.sending(notification_id, endpoint_id))

    def take_slot(self, endpoint_id: int, owner_id: int, token: str, endpoint_cap: int, owner_cap: int,
                  ttl_s: float, wait_s: float = 0.0, furthest_turn_s: float | None = None) -> Busy | None:
        """Hold one in-flight slot of the endpoint and of its owner (None), or neither if either is full (why).

        With ``wait_s``, a token that finds only its endpoint full, and the endpoint quick
        (twice its last attempt time within ``wait_s``), holds an owner slot to wait in
        (``Busy.waiting``); called again with the same token, it gets the endpoint slot
        once one is free. A waiter that gives up frees its hold with :meth:`free_slot`.
        With ``furthest_turn_s``, one that does not wait is given a turn in the endpoint's
        line, at most that far away (``Busy.turn_s``; ``Busy.line_full`` past that).
        A holder that dies frees its slots when its hold expires (``ttl_s``, longer
        than any attempt); expiry uses the Redis server's clock, shared by all workers.
        """
        keys = [self.keys.inflight_endpoint(owner_id, endpoint_id), self.keys.inflight_owner(owner_id),
                self.keys.attempt_time(owner_id, endpoint_id), self.keys.endpoint_turn(owner_id, endpoint_id)]
        reply = self._take_slot(keys, [token, endpoint_cap, owner_cap, int(ttl_s * 1000), round(wait_s * 1000),
                                       -1 if furthest_turn_s is None else round(furthest_turn_s * 1000)])
        if reply == 1:
            return None
        _, full, took_ms, waiting, turn_ms = (int(v) for v in reply)
        endpoint_full = full == 1
        return Busy(endpoint_full, took_ms / 1000 if endpoint_full and took_ms >= 0 else None, waiting == 1,
                    turn_ms / 1000 if turn_ms >= 0 else None, turn_ms == -2)

    def free_slot(self, endpoint_id: int, owner_id: int, token: str, took_s: float | None) -> None:
        """Give both slots back, and note how long the attempt took (``None``: it did not get to an end)."""
        pipe = self.redis.pipeline()
        pipe.zrem(self.keys.inflight_endpoint(owner_id, endpoint_id), token)
        pipe.zrem(self.keys.inflight_owner(owner_id), token)
        if took_s is not None:
            pipe.set(self.keys.attempt_time(owner_id, endpoint_id), round(took_s * 1000), ex=ATTEMPT_TIME_TTL_S)
        pipe.execute()

    # -- reading and operating (web) -----------------------------------------------------------

    def log(self, subscription_id: int, limit: int = 100) -> list[dict]:
        return [json.loads(e) for e in self.redis.lrange(self.keys.delivery_log(subscription_id), 0, limit - 1)]

    def endpoint_log(self, endpoint_id: int, limit: int = 100) -> list[dict]:
        return [json.loads(e) for e in self.redis.lrange(self.keys.endpoint_log(endpoint_id), 0, limit - 1)]

    def dead_letters(self, limit: int = 500) -> list[dict]:
        letters = [json.loads(v) for v in self.redis.hvals(self.keys.dead_letters)]
        return sorted(letters, key=lambda d: d["dead_at"], reverse=True)[:limit]

    def dead_letter(self, letter_id: str) -> dict | None:
        raw = self.redis.hget(self.keys.dead_letters, letter_id)
        return json.loads(raw) if raw else None

    def replay(self, letter_id: str, celery: Celery, outbox: Outbox) -> bool:
        """Send a dead letter again with a fresh retry budget; False if there is no such letter.

        The letter is enqueued before it is removed: a crash in between leaves a
        letter that is replayed twice at worst, which the delivered mark absorbs.
        Only the letter as read is removed: if the replayed delivery already failed
        for good again (a fast worker), its new letter under the same id stays.
        """
        raw = self.redis.hget(self.keys.dead_letters, letter_id)
        if raw is None:
            return False
        letter = json.loads(raw)
        mark = self.keys.delivered(letter["notification"].get("notification_id"), letter["endpoint_id"])
        if self.redis.get(mark) != "delivered":  # a dead (not a delivered) delivery may run again
            self.redis.delete(mark)
        enqueue(celery, outbox, letter["notification"], letter["endpoint_id"], letter.get("binding") or {})
        self.redis.eval(_DELETE_IF_UNCHANGED, 1, self.keys.dead_letters, letter_id, raw)
        return True

    def discard(self, letter_id: str) -> bool:
        return bool(self.redis.hdel(self.keys.dead_letters, letter_id))
