"""Per-alert delivery order: each endpoint gets a key's notifications in the order the dispatcher decided them.

Without it a resolve could overtake its firing: a delivery that found its endpoint or owner busy was
put back for a while, and its key's next notification, queued later, took the slot that freed meanwhile
(issue 30: 4 of 82 PagerDuty resolves arrived 1.6-2.8 s before their trigger; PagerDuty drops a resolve
for an unknown ``dedup_key``, and the later trigger opens an incident nothing closes).

- **Sequence.** The dispatcher numbers each notified transition, and each reminder, of a (subscription,
  key): :func:`reserve` takes the next numbers of ``sequence:<subscription>`` in one transaction per
  decision round (so a grouped notification's keys are numbered together, and two dispatchers never
  hand out one number twice), and the number is stored with the transition's decision, so a re-handled
  transition keeps it. Every alert of a notification carries its ``sequence``; receivers can order on it
  too. Numbers only grow; a gap is a transition that was not notified (policy, silences) or a number
  taken by a dispatcher that died before storing its decisions. A resolution whose key's state was lost
  (``state_unknown``, ``notifier.policy``) lost the counter and the lines too: its counter starts again at
  the clock (:func:`restart_after`), above every number given before, so a firing numbered before the loss
  and still queued goes first or, once the resolution went, is superseded - never after it.
- **Line.** Before a notification is enqueued, the dispatcher puts it in the line of every (endpoint,
  key) it carries (:meth:`DeliveryOrder.join`): ``order:<subscription>:<endpoint>:<key>``, a sorted set
  by sequence. A delivery task attempts only at the head of each of its lines (:meth:`~DeliveryOrder.turn`,
  taken before the delivery's claim). Otherwise it keeps its task's arguments in ``order-wake:...`` and
  puts itself back for a while; a delivery that leaves its lines, delivered, dead-lettered or dropped
  (:meth:`~DeliveryOrder.leave`), wakes each new head that waits: it publishes a copy of its task at
  once, then counts the wake-up (``woken``, :meth:`~DeliveryOrder.woken`), so the copy it woke from is
  stale and ends when it comes (a copy that could not be published leaves that one to come at its time).
  Put back, a waiter sleeps only as a safety net (a wake-up lost with a worker killed between leaving
  and publishing): 8x ``delivery_busy_delay_s`` for the next in line, that many times more for each one
  ahead of it, never past the head's own next run (:meth:`~DeliveryOrder.expect`: a retry's backoff, a busy
  endpoint's turn) nor over half the visibility timeout (a task held longer for its countdown would be
  handed out twice). Retries, busy deferrals, a worker killed (its message comes back after the
  visibility timeout, still in its lines) and a dispatcher restart (same transition, same sequence;
  joining again changes nothing) keep the order.
- **What follows a dead letter.** A dead-lettered delivery leaves its lines like a delivered one: the
  key's next notification (say the resolve of a firing PagerDuty never took) is still sent, and its
  sequence shows the receiver the gap. A delivery whose key already had a later notification go to the
  endpoint - a dead letter replayed after that - is never sent (it would reopen, out of order, what was
  closed: a PagerDuty incident nothing resolves): it is dropped, logged with the reason ``superseded``.
  Each line keeps the highest sequence let go (``hw`` in ``order-state:...``) for that.
- **A head that never comes back.** A delivery whose message was lost is sent again by the outbox
  (``notifier.outbox``); one whose note went too (a Redis that lost its data, a task failed on a Redis error no
  wait cures) would hold its lines for ever. A delivery waiting behind a head that is overdue (past the run it
  last announced) notes when it first saw it so (``stall``); a head still overdue, without a sign of life, for
  :func:`lost_after_s` after that - by when the outbox would have sent a live note's delivery again - is taken
  for lost: it leaves the line, the waiter goes on, logged and counted (``delivery_order_head_lost``,
  ``tocsin_delivery_order_lost_total``). Were it to come back after all, a later one having gone, it is
  superseded as above.

Every key of a line, and a waiter's wake key, carries the subscription's partition tag
(``core.redis_schema``), so each script touches one slot (:meth:`~DeliveryOrder.leave` names the new
heads' wake keys inside the script, from a prefix in that slot, as the sink's script does its marks).
Each script is one round trip of O(log n) work per key of the notification.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import redis

from core.redis_schema import RedisKeys
from core.settings import Settings
from notifier.notification import Notification
from notifier.outbox import silent_after_s

ORDER_TTL_S = 30 * 24 * 3600  # a line's keys outlive a quiet month, like a delivery's final mark

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# Every script: KEYS[1] the member's wake hash (``task``: its task's arguments while it waits; ``woken``: how often
# it was woken), then per line its sorted set and its state hash (KEYS[2i], KEYS[2i + 1]); ARGV[1] the member (the
# notification id), ARGV[2] the TTL (ms).

# ARGV[3..]: the member's sequence in each line. It joins each line it is not in whose highest sequence let go is
# below its own.
_JOIN = _NOW + """
for i = 1, (#KEYS - 1) / 2 do
  local line, state, seq = KEYS[2 * i], KEYS[2 * i + 1], tonumber(ARGV[2 + i])
  if seq > tonumber(redis.call('HGET', state, 'hw') or '0') and redis.call('ZADD', line, 'NX', seq, ARGV[1]) == 1 then
    redis.call('HSETNX', state, 'at:' .. ARGV[1], now)
  end
  redis.call('PEXPIRE', line, ARGV[2])
  redis.call('PEXPIRE', state, ARGV[2])
end
return 1
"""

# ARGV[3..8]: the member's task arguments (kept while it waits, for the head to wake it), how often this copy of
# its task was woken, how long a waiter next in line sleeps unless woken (those further back: as many times as
# there are ahead of them) and the longest any may (ms), the margin after a head's planned run (ms), how long a
# waiter sees a head overdue before taking it for lost (ms); from ARGV[9] its sequences. Returns {0, lost
# heads...}: go (each line's highest sequence let go is now this one); {1, ms, lost heads...}: look again in so
# long, unless woken first; {2, sequence}: superseded, a later sequence went already; {3}: a stale copy (another,
# woken since, carries on). A member not in a line (a replayed dead letter) joins it.
_TURN = _NOW + """
local member, ttl, task = ARGV[1], ARGV[2], ARGV[3]
local sleep, most, margin, lost = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local lines = (#KEYS - 1) / 2
if tonumber(ARGV[4]) < tonumber(redis.call('HGET', KEYS[1], 'woken') or '0') then return {3} end
for i = 1, lines do
  local hw = tonumber(redis.call('HGET', KEYS[2 * i + 1], 'hw') or '0')
  if tonumber(ARGV[8 + i]) < hw then return {2, hw} end
end
local wait, gone = -1, {}
for i = 1, lines do
  local line, state = KEYS[2 * i], KEYS[2 * i + 1]
  if not redis.call('ZSCORE', line, member) then redis.call('ZADD', line, tonumber(ARGV[8 + i]), member) end
  while true do
    local head = redis.call('ZRANGE', line, 0, 0)[1]
    if head == member then break end
    local at = tonumber(redis.call('HGET', state, 'at:' .. head) or '')
    if not at then
      at = now
      redis.call('HSET', state, 'at:' .. head, now)
    end
    local behind = sleep * redis.call('ZRANK', line, member)  -- woken when it is next: the further back, the longer
    if at > now then
      wait = math.max(wait, behind, math.min(at - now, lost) + margin)
      break
    end
    local sign = head .. '|' .. at .. '|'
    local stall = redis.call('HGET', state, 'stall')
    local since = stall and string.sub(stall, 1, #sign) == sign and tonumber(string.sub(stall, #sign + 1))
    if not (since and now - since > lost) then
      if not since then redis.call('HSET', state, 'stall', sign .. now) end
      wait = math.max(wait, behind)
      break
    end
    redis.call('ZREM', line, head)
    redis.call('HDEL', state, 'at:' .. head, 'stall')
    gone[#gone + 1] = head
  end
end
for i = 1, lines do
  local state = KEYS[2 * i + 1]
  if wait < 0 then
    if tonumber(ARGV[8 + i]) > tonumber(redis.call('HGET', state, 'hw') or '0') then
      redis.call('HSET', state, 'hw', ARGV[8 + i])
    end
    redis.call('HSET', state, 'at:' .. member, now)
  end
  redis.call('PEXPIRE', KEYS[2 * i], ttl)
  redis.call('PEXPIRE', state, ttl)
end
if wait < 0 then
  redis.call('HDEL', KEYS[1], 'task')
  return {0, unpack(gone)}
end
redis.call('HSET', KEYS[1], 'task', task)
redis.call('PEXPIRE', KEYS[1], ttl)
return {1, math.min(wait, most), unpack(gone)}
"""

# ARGV[3]: in how many ms the member's task runs next. Noted only while the member is in its lines.
_EXPECT = _NOW + """
for i = 1, (#KEYS - 1) / 2 do
  if redis.call('ZSCORE', KEYS[2 * i], ARGV[1]) then
    redis.call('HSET', KEYS[2 * i + 1], 'at:' .. ARGV[1], now + tonumber(ARGV[3]))
    redis.call('PEXPIRE', KEYS[2 * i + 1], ARGV[2])
  end
end
return 1
"""

# ARGV[3]: the prefix of a member's wake hash (the member's id follows). The member leaves its lines; returns, for
# each new head that waits, its id, its task's arguments and how often it was woken so far. Nothing of the heads
# changes here: the caller wakes each with a copy of its task, then marks it woken (_WOKEN), so a copy it failed
# to publish costs a wait, never the delivery.
_LEAVE = """
local woken, seen = {}, {}
redis.call('DEL', KEYS[1])
for i = 1, (#KEYS - 1) / 2 do
  if redis.call('ZREM', KEYS[2 * i], ARGV[1]) == 1 then
    redis.call('HDEL', KEYS[2 * i + 1], 'at:' .. ARGV[1])
    local head = redis.call('ZRANGE', KEYS[2 * i], 0, 0)[1]
    local task = head and not seen[head] and redis.call('HGET', ARGV[3] .. head, 'task')
    if task then
      seen[head] = true
      woken[#woken + 1] = head
      woken[#woken + 1] = task
      woken[#woken + 1] = redis.call('HGET', ARGV[3] .. head, 'woken') or '0'
    end
  end
end
return woken
"""

# KEYS: the wake hashes of heads just woken; ARGV: per head the task arguments _LEAVE read and the woken count its
# new copy carries. Copies woken fewer times are stale from now on; the arguments are dropped unless the head
# has since kept newer ones (its new copy, already waiting again).
_WOKEN = """
for i = 1, #KEYS do
  if redis.call('HGET', KEYS[i], 'task') == ARGV[2 * i - 1] then redis.call('HDEL', KEYS[i], 'task') end
  if tonumber(redis.call('HGET', KEYS[i], 'woken') or '0') < tonumber(ARGV[2 * i]) then
    redis.call('HSET', KEYS[i], 'woken', ARGV[2 * i])
  end
end
return 1
"""


@dataclass(frozen=True)
class Turn:
    """Whether a delivery may attempt now: ``wait_s`` set, not yet (look again then, unless woken first);
    ``superseded_by`` set, never (a later sequence of one of its keys went to the endpoint already); ``stale``,
    not this copy of its task; ``lost``: heads ahead of it taken for lost on the way."""

    wait_s: float | None = None
    superseded_by: int | None = None
    lost: tuple[str, ...] = ()
    stale: bool = False  # this copy of the task is stale: another, woken since, carries the delivery on


def places(notification: Notification) -> list[tuple[str, int]]:
    """(key, sequence) of each alert that has a place in a line: a subscription's, numbered by the dispatcher
    (test alerts, the watchdog's and deliveries queued before sequences existed have none)."""
    if notification.subscription_id is None:
        return []
    return [(alert.key, alert.sequence) for alert in notification.alerts if alert.sequence is not None]


def reserve(client: redis.Redis, keys: RedisKeys, subscription_id: int, alert_keys: list[str],
            restart: Mapping[str, int] | None = None) -> list[int]:
    """The next sequence of each key, in one transaction (a key named twice gets two).

    ``restart``: keys whose counter, if it has none, starts after the given number rather than at 1 - those whose
    state was lost (a Redis node that came back empty took the counter along, and deliveries numbered before may
    still be in flight: a new number must not fall below theirs, see :func:`restart_after`).
    """
    pipe = client.pipeline(transaction=True)  # one hash: one slot
    for key in alert_keys:
        if restart and key in restart:
            pipe.hsetnx(keys.sequences(subscription_id), key, restart[key])
        pipe.hincrby(keys.sequences(subscription_id), key, 1)
    replies = pipe.execute() if alert_keys else []
    numbers: list[int] = []
    it = iter(replies)
    for key in alert_keys:
        if restart and key in restart:
            next(it)  # HSETNX's answer
        numbers.append(int(next(it)))
    return numbers


def restart_after(now: float) -> int:
    """Where a key's lost counter starts again: the clock in milliseconds. Numbers a key was given before (from 1,
    or from an earlier restart, one per notification) stay below it: a key is not notified once a millisecond."""
    return int(now * 1000)


class DeliveryOrder:
    """The lines of one deployment (see the module's docstring)."""

    def __init__(self, client: redis.Redis, keys: RedisKeys, settings: Settings) -> None:
        self.redis, self.keys, self.settings = client, keys, settings
        self._join = client.register_script(_JOIN)
        self._turn = client.register_script(_TURN)
        self._expect = client.register_script(_EXPECT)
        self._leave = client.register_script(_LEAVE)
        self._woken = client.register_script(_WOKEN)

    def _keys(self, notification: Notification, endpoint_id: int) -> tuple[list[str], list[int]]:
        """The member's wake key then its lines' keys, and its sequence in each line; ([], []): it has none."""
        subscription_id = notification.subscription_id
        own = places(notification)
        if subscription_id is None or not own:
            return [], []
        keys = [self.keys.order_wake(subscription_id, endpoint_id, notification.notification_id)]
        for key, _ in own:
            keys += [self.keys.order_line(subscription_id, endpoint_id, key),
                     self.keys.order_state(subscription_id, endpoint_id, key)]
        return keys, [sequence for _, sequence in own]

    def join(self, notification: Notification, endpoint_ids: list[int]) -> None:
        """Put ``notification`` in its lines to each endpoint (before its deliveries are enqueued)."""
        for endpoint_id in endpoint_ids:
            keys, sequences = self._keys(notification, endpoint_id)
            if keys:
                self._join(keys=keys, args=[notification.notification_id, ORDER_TTL_S * 1000, *sequences])

    def turn(self, notification: Notification, endpoint_id: int, task: str, woken: int) -> Turn:
        """Whether the delivery of ``notification`` to the endpoint may attempt now (see :class:`Turn`); ``task``:
        its task's arguments (JSON), kept while it waits for the delivery ahead of it to wake it; ``woken``: how
        often the copy asking was woken (its task's argument)."""
        keys, sequences = self._keys(notification, endpoint_id)
        if not keys:
            return Turn()
        s = self.settings
        reply = self._turn(keys=keys, args=[
            notification.notification_id, ORDER_TTL_S * 1000, task, woken, round(waiter_sleep_s(s) * 1000),
            round(longest_sleep_s(s) * 1000), round(s.delivery_busy_min_delay_s * 1000),
            round(lost_after_s(s) * 1000), *sequences])
        status = int(reply[0])
        if status == 0:
            return Turn(lost=tuple(reply[1:]))
        if status == 1:
            return Turn(wait_s=int(reply[1]) / 1000, lost=tuple(reply[2:]))
        if status == 2:
            return Turn(superseded_by=int(reply[1]))
        return Turn(stale=True)

    def expect(self, notification: Notification, endpoint_id: int, in_s: float) -> None:
        """Note that the delivery's task runs again in ``in_s`` (what says a head is overdue)."""
        keys, _ = self._keys(notification, endpoint_id)
        if keys:
            self._expect(keys=keys, args=[notification.notification_id, ORDER_TTL_S * 1000, round(in_s * 1000)])

    def woken_count(self, notification: Notification, endpoint_id: int) -> int:
        """How often the delivery of ``notification`` to the endpoint was woken: a copy of its task carrying fewer
        wake-ups is stale (0 for one in no line)."""
        keys, _ = self._keys(notification, endpoint_id)
        return int(self.redis.hget(keys[0], "woken") or 0) if keys else 0

    def leave(self, notification: Notification, endpoint_id: int) -> list[Waiter]:
        """The delivery ended for good (delivered, dead-lettered, dropped): out of its lines. Returns the deliveries
        now at the head of one of them that wait to be woken: wake each with a copy of its task, then
        :meth:`woken`."""
        keys, _ = self._keys(notification, endpoint_id)
        if not keys:
            return []
        assert notification.subscription_id is not None  # _keys() gives none without it
        prefix = self.keys.order_wake(notification.subscription_id, endpoint_id, "")
        reply = self._leave(keys=keys, args=[notification.notification_id, ORDER_TTL_S * 1000, prefix])
        return [Waiter(reply[i], reply[i + 1], int(reply[i + 2]) + 1) for i in range(0, len(reply), 3)]

    def woken(self, notification: Notification, endpoint_id: int, waiters: list[Waiter]) -> None:
        """Mark ``waiters`` (from :meth:`leave` of ``notification``) woken: their copies that are not the ones just
        published are stale from now on."""
        if waiters:
            assert notification.subscription_id is not None  # leave() gives no waiters without it
            self._woken(keys=[self.keys.order_wake(notification.subscription_id, endpoint_id, w.member)
                              for w in waiters],
                        args=[value for w in waiters for value in (w.task, w.woken)])


@dataclass(frozen=True)
class Waiter:
    """A delivery at the head of a line, waiting to be woken: its notification id, its task's arguments (JSON) and
    the woken count its new copy carries."""

    member: str
    task: str
    woken: int


def longest_sleep_s(settings: Settings) -> float:
    """The longest a waiting delivery puts itself back for: half the broker's visibility timeout, as a task held
    for its countdown longer than that would be handed out a second time."""
    return settings.delivery_visibility_timeout_s / 2


def waiter_sleep_s(settings: Settings) -> float:
    """How long a delivery waiting behind another sleeps unless woken when that one leaves (or later, if the one
    ahead runs next later): the furthest turn in an endpoint's line, 8x ``delivery_busy_delay_s``, within
    :func:`longest_sleep_s`."""
    return min(8 * settings.delivery_busy_delay_s, longest_sleep_s(settings))


def lost_after_s(settings: Settings) -> float:
    """How long a waiter sees its head overdue before taking it for lost: twice the time after which the outbox sends
    a silent delivery again, plus a dispatcher's round: the outbox has sent the head again by then unless its note
    was lost too, or every dispatcher was away (``notifier.outbox``)."""
    return 2 * silent_after_s(settings) + settings.dispatcher_claim_interval_s
