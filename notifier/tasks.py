"""The delivery task: one notification to one endpoint, retried with backoff, every attempt recorded.

Tasks are acknowledged late and may be redelivered (a worker killed mid-task, a
dispatcher re-handling what it had not acknowledged, a retry held past the
visibility timeout), so a delivery's final outcome (delivered, dead-lettered,
dropped) is marked per ``notification id + endpoint`` and a marked delivery never
runs again. A task whose arguments are not a delivery (see ``notifier.notification``)
is dead-lettered whole. A delivery that exhausts its retries, or is refused for
good, goes to the dead-letter set, from which operators replay it.

Each attempt goes through the channel of its endpoint's kind (``notifier.channels``),
which gets the typed notification and a read-only view of the endpoint.

Never silence: whatever goes wrong in a task - a receiver's odd reply, a
template or header error, a bug - ends as a recorded retry or a dead letter with
its reason (a Redis error no wait changes, such as WRONGTYPE, included). When the
records themselves cannot be written (Redis unreachable, out of memory, failing over),
the task cannot record anything: it waits a moment
and puts its message back on its queue (or, if even that fails, leaves it
unacknowledged for the visibility timeout to restore), so the delivery runs again
once Redis answers - at least once, never lost. An attempt that reached its receiver instead waits in its thread
for Redis to take its records (``_Delivery.recorded``): put back, it would be sent again. Only if Redis refuses even the
records of a failure for good is the task failed, logged with its whole notification
(``delivery_store_error``, ``tocsin_delivery_store_errors_total``) for replay.
A delivery whose endpoint was deleted, changed hands or changed (a rotated secret)
since it was queued is dropped, and the drop is recorded.

Order: a delivery of a subscription's notification attempts only when every earlier notification of
its keys to the same endpoint is delivered, dead-lettered or dropped; until then it waits, woken
by the one ahead of it when that one ends (``notifier.order``). A copy woken fewer times than its
line counts is stale and ends; a delivery superseded by a later notification of one of its keys,
already sent, is dropped with that reason.

Isolation: an attempt holds one of ``delivery_endpoint_concurrency`` slots of its
endpoint and one of ``delivery_owner_concurrency`` slots of the endpoint's owner;
a delivery that finds either full gives its worker thread back (not counted as an
attempt; only a quick endpoint busy with itself is first waited for, briefly, in the
thread and in a spare slot of its owner: ``busy_wait_s``) and looks again about when a slot should be free: when its own
endpoint is full, at its turn in the endpoint's line (each one slot's worth of the endpoint's time after the
one before: see ``notifier.deliveries``), else after ``delivery_busy_delay_s``, doubling while it keeps finding the owner
full, up to 8x ``delivery_busy_delay_s`` (see ``busy_delay_s``).
"""

from __future__ import annotations

import functools
import json
import logging
import math
import random
import time
import uuid
from collections.abc import Callable

import redis
import redis.exceptions as redis_errors
import structlog
from celery import Task
from celery.exceptions import Reject
from celery.signals import worker_ready
from kombu.exceptions import OperationalError
from prometheus_client import Counter, Histogram

from core.metrics import serve_metrics
from core.redis_client import connect
from core.redis_outage import TRANSIENT, Outage, is_transient
from core.redis_schema import RedisKeys
from core.settings import Settings, get_settings
from notifier.app import DELIVER_TASK, app, queue_for
from notifier.attempt import Attempt
from notifier.channels import EndpointView, channel_for, claim_ttl_s
from notifier.deliveries import Busy, DeliveryRecords, binding
from notifier.notification import MalformedNotificationError, Notification
from notifier.order import DeliveryOrder, Turn, longest_sleep_s, lost_after_s, places
from notifier.outbox import Outbox, noted_headers
from subscriptions.channel_kinds import UnknownKindError
from subscriptions.db import session_scope
from subscriptions.routing import endpoint_route

log = structlog.get_logger(__name__)

ATTEMPTS = Counter("tocsin_delivery_attempts_total", "Delivery attempts", ["kind", "outcome"])
LATENCY = Histogram("tocsin_delivery_latency_seconds", "Latency of delivery attempts", ["kind"])
DEFERRED = Counter("tocsin_delivery_deferred_total", "Deliveries deferred because their endpoint or owner was busy",
                   ["cap"])
BUSY_POLL_S = 0.01  # how often a delivery waiting in its thread for a quick endpoint's slot looks (one script call)
WAITED = Counter("tocsin_delivery_order_waits_total",
                 "Deliveries put back because an earlier notification of one of their keys was not delivered yet")
ORDER_LOST = Counter("tocsin_delivery_order_lost_total",
                     "Heads of a delivery line taken for lost (overdue for notifier.order.lost_after_s) and let go past")
REQUEUED = Counter("tocsin_delivery_requeued_total", "Deliveries put back on their queue because Redis was unreachable")


class StoreAway(Reject):
    """A delivery put back on its queue because its records' store is away. Counted (``REQUEUED``) and logged once
    per outage (``redis_outage``): Celery's own warning and traceback for every rejection are dropped
    (:class:`QuietStoreAway`), or an outage would write one per queued delivery every
    ``TOCSIN_DELIVERY_STORE_WAIT_S``."""


class QuietStoreAway(logging.Filter):
    """Drops Celery's log record of a :class:`StoreAway` rejection (``celery.app.trace``); any other passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], StoreAway))


logging.getLogger("celery.app.trace").addFilter(QuietStoreAway())


@worker_ready.connect
def _serve_metrics(**_: object) -> None:
    """The worker's metrics; a worker of the test-alert lane alone serves none (the port is the alert lane's)."""
    settings = get_settings()
    serve_metrics(app.conf.get("tocsin_metrics_port", settings.metrics_port_worker), settings.metrics_bind_address)


@functools.lru_cache(maxsize=4)
def _redis(url: str, cluster: bool, timeout_s: float) -> redis.Redis:
    """One client (and connection pool) per worker process, not one per task."""
    return connect(url, cluster, decode_responses=True, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)


def backoff_s(retries: int, base_s: float, cap_s: float) -> float:
    """Exponential backoff with full jitter: uniform in [0, min(cap, base * 2^retries)]."""
    return random.uniform(0, min(cap_s, base_s * 2**retries))


def retry_delay_s(attempt: Attempt, retries: int, settings: Settings) -> float:
    """The receiver's ``Retry-After`` if it gave a usable one, else backoff; always finite and capped."""
    delay = attempt.retry_after_s
    if delay is None or not math.isfinite(delay):
        delay = backoff_s(retries, settings.delivery_backoff_base_s, settings.delivery_backoff_max_s)
    return min(max(delay, 0.0), settings.delivery_backoff_max_s)


def furthest_turn_s(settings: Settings) -> float:
    """The furthest turn in an endpoint's line; one that finds the line longer looks again about that long later
    (x0.5-1.5, without a turn)."""
    return 8 * settings.delivery_busy_delay_s


def busy_delay_s(settings: Settings, busy: Busy, deferrals: int) -> float:
    """When a delivery that found no slot looks again, after ``deferrals`` earlier finds.

    Its own endpoint full and a turn in its line (``Busy.turn_s``, handed out by the slot
    script: one slot's worth of the endpoint's time after the delivery before it): at its
    turn. A flood to one endpoint then costs a worker about one look per delivery, not one
    every few hundred milliseconds each (120 deliveries to a receiver answering in 240 ms
    kept another tenant's deliveries 1-2 s behind their looks). The line longer than
    ``furthest_turn_s``: that long, without a turn.

    Otherwise (the endpoint's time not known yet, or a wait in the thread given up), its own endpoint full:
    twice that endpoint's last attempt time (a receiver answering in
    20 ms has a slot again in milliseconds, so a burst to it is not held seconds behind
    itself), at least ``delivery_busy_min_delay_s`` - which is also where it starts when no
    attempt of the endpoint has ended yet (a first burst), doubling until one has - and at
    most ``delivery_busy_delay_s``; its owner full (busy with other endpoints, whose times
    this one does not know): ``delivery_busy_delay_s``. Never more than 8x
    ``delivery_busy_delay_s``, and jittered so deliveries deferred together do not come back
    together.
    """
    if busy.turn_s is not None:
        return max(busy.turn_s, 0.001)
    if busy.line_full:
        deferrals = 30
    first = settings.delivery_busy_delay_s
    if busy.endpoint_full:
        took = busy.last_attempt_s or 0.0
        first = min(first, max(settings.delivery_busy_min_delay_s, 2 * took))
    return min(first * 2 ** min(deferrals, 30), furthest_turn_s(settings)) * random.uniform(0.5, 1.5)


def busy_wait_s(settings: Settings, busy: Busy) -> float:
    """How long a delivery that found no slot waits for one in its thread (0: it gives the thread back at once).

    Only one that holds an owner slot to wait in (``Busy.waiting``: its own endpoint is full,
    quick - twice its last attempt time within ``delivery_busy_wait_s`` - and its owner has
    a slot to spare), twice that time: a slot is milliseconds away. Deferred, it came back
    to find a newer delivery in the slot, again and again (one waited 9 s at 5/s to an
    endpoint taking 180 ms). Waiting takes an owner slot, so one owner never holds more
    threads, sending or waiting, than its cap (a flood to a 240 ms receiver, every thread
    waiting, left another tenant at p50 12.6 s before that); a slow or hostile endpoint,
    or a busy owner, never holds a thread.
    """
    if not busy.waiting or busy.last_attempt_s is None:
        return 0.0
    return min(2 * busy.last_attempt_s, settings.delivery_busy_wait_s)


def load_endpoint(settings: Settings, endpoint_id: int) -> EndpointView | None:
    """The endpoint as it is now (the one place the worker reads an endpoint and its secret)."""
    with session_scope(settings.database_url) as session:
        endpoint = endpoint_route(session, endpoint_id)
    if endpoint is None:
        return None
    return EndpointView(endpoint.kind, endpoint.target, endpoint.signing_secret(settings), endpoint.owner_id,
                        binding(endpoint)["generation"], endpoint.id, endpoint.template)


def stale_reason(endpoint: EndpointView | None, owner_id: int | None, generation: str | None) -> str | None:
    """Why a delivery queued for (owner, generation) must not go to this endpoint any more, if it must not.

    Deliveries queued before they carried an owner (``None``) are checked for existence only.
    """
    if endpoint is None:
        return "endpoint deleted"
    if owner_id is not None and endpoint.owner_id != owner_id:
        return "endpoint owner changed"
    if generation is not None and endpoint.generation != generation:
        return "endpoint changed since enqueue (secret rotated)"
    return None


def read_delivery(notification: object, endpoint_id: object, attempt: object, deferrals: object,
                  extra: tuple, unknown: dict, woken: object = 0) -> Notification:
    """The notification of task arguments that are a delivery; :class:`MalformedNotificationError` says why not."""
    if extra or unknown:
        raise MalformedNotificationError(f"unexpected arguments {list(extra) + sorted(unknown)!r}"[:500])
    typed = Notification.from_json(notification)
    if type(endpoint_id) is not int or endpoint_id < 1:
        raise MalformedNotificationError(f"endpoint_id {endpoint_id!r} is not an id")
    if type(attempt) is not int or attempt < 1 or any(type(n) is not int or n < 0 for n in (deferrals, woken)):
        raise MalformedNotificationError("attempt, deferrals and woken must be counts")
    return typed


#: Redis unreachable or not answering for now, as the delivery records (redis-py) or the broker (kombu) report it
#: (down, timing out, loading, a read-only replica or a master down while failing over, out of memory): nothing
#: can be recorded or re-queued with a countdown, so the task is put back, not failed (a failed task is
#: acknowledged: lost). Any other Redis error is a reply no wait changes (WRONGTYPE, a script's bug): put back, the
#: task would come round for ever holding a worker thread each time, so it ends as any other failure (below).
STORE_ERRORS = (*TRANSIENT, redis.OutOfMemoryError, redis_errors.RedisClusterException, OperationalError)
"""Redis (or the broker) away, failing over or full: the delivery is put back, never dropped. A bare
``RedisClusterException`` is no cluster node answering; its subclasses (a cross-slot call) are bugs, not waited on."""
@functools.cache
def _outage() -> Outage:
    """This worker process's view of Redis (its threads share it)."""
    settings = get_settings()
    return Outage("worker", settings, _redis(settings.redis_url, settings.redis_cluster, settings.redis_socket_timeout_s))


def store_away(exc: BaseException) -> bool:
    """Whether ``exc`` says the records' store (or the broker) is away for now, not that the call is wrong."""
    return isinstance(exc, STORE_ERRORS) and (is_transient(exc)
                                              or not isinstance(exc, redis_errors.RedisClusterException))


STORE_BROKEN = Counter("tocsin_delivery_store_errors_total",
                       "Deliveries whose records Redis refused for a reason no wait changes (WRONGTYPE, a script)")


@app.task(bind=True, name=DELIVER_TASK, acks_late=True, max_retries=None)
def deliver(self: Task, notification: dict | None = None, endpoint_id: int | None = None, *extra: object,
            owner_id: int | None = None, generation: str | None = None, attempt: int = 1, deferrals: int = 0,
            woken: int = 0, **unknown: object) -> str:
    settings = get_settings()
    try:
        result = _deliver(self, settings, notification, endpoint_id, extra, owner_id, generation, attempt, deferrals,
                          woken, unknown)
    except Exception as exc:
        if store_away(exc):
            REQUEUED.inc()
            _outage().failed(exc)  # logged once per outage, not per delivery put back
            _outage().refresh()
            time.sleep(settings.delivery_store_wait_s)  # not a hot loop while Redis is away
            raise StoreAway(exc, requeue=True) from exc
        if isinstance(exc, redis.RedisError):  # during an attempt a recorded retry; here not even that was written
            STORE_BROKEN.inc()
            log.exception("delivery_store_error", endpoint_id=endpoint_id, notification=notification)
        raise
    _outage().recovered()
    return result


def _deliver(self: Task, settings: Settings, notification: dict | None, endpoint_id: int | None, extra: tuple,
             owner_id: int | None, generation: str | None, attempt: int, deferrals: int, woken: int,
             unknown: dict) -> str:
    records = DeliveryRecords(_redis(settings.redis_url, settings.redis_cluster, settings.redis_socket_timeout_s),
                              RedisKeys(settings))
    try:
        typed = read_delivery(notification, endpoint_id, attempt, deferrals, extra, unknown, woken)
    except MalformedNotificationError as exc:  # never silence: a task that is not a delivery is a dead letter, with why
        reason = str(exc)
        letter = records.malformed({"notification": notification, "endpoint_id": endpoint_id, "extra": extra,
                                    "owner_id": owner_id, "generation": generation, "attempt": attempt,
                                    "woken": woken, **unknown}, reason)
        ATTEMPTS.labels("unknown", "dead").inc()
        log.error("delivery_malformed", reason=reason, dead_letter=letter)
        return "malformed"
    assert type(endpoint_id) is int  # checked by read_delivery; for the type checker
    delivery = _Delivery(self, settings, records, typed, endpoint_id, {"owner_id": owner_id, "generation": generation},
                         attempt, deferrals, woken)
    nid = typed.notification_id
    turn = None
    if places(typed):  # in lines: its turn comes before its claim, so a copy waiting or stale never holds the claim
        if records.finished(nid, endpoint_id):
            delivery.leave()  # a copy that died between its final mark and leaving its lines
            return "duplicate"
        turn = delivery.turn()
        if turn.stale:
            return "stale copy"
        if turn.wait_s is not None:  # a notification of one of its keys is ahead of it, not yet delivered
            WAITED.inc()
            delivery.again(turn.wait_s, attempt, deferrals)
            return "waiting"
    claimed, finished = records.claim(nid, endpoint_id, claim_ttl_s(settings))
    if finished:
        delivery.leave()  # a copy that died between its final mark and leaving its lines
        return "duplicate"
    if not claimed:
        # Another copy is sending right now (or died doing so): look again once it must be done.
        delivery.again(claim_ttl_s(settings), attempt)
        return "sending elsewhere"
    try:
        return delivery.run(turn)
    except Exception as exc:
        if store_away(exc):
            raise
        log.exception("delivery_failed_unexpectedly", notification=nid, endpoint_id=endpoint_id)
        return delivery.failed(None, Attempt(False, True, 0.0, error=f"internal error: {type(exc).__name__}: {exc}"))
    finally:
        records.release(nid, endpoint_id)


class _Delivery:
    """One run of the task, with the ways it can end."""

    def __init__(self, task: Task, settings: Settings, records: DeliveryRecords, notification: Notification,
                 endpoint_id: int, bound: dict, attempt: int, deferrals: int, woken: int = 0) -> None:
        self.task, self.settings, self.records = task, settings, records
        self.order = DeliveryOrder(records.redis, records.keys, settings)
        self.outbox = Outbox(records.redis, records.keys, settings)
        self.notification, self.endpoint_id, self.bound, self.number = notification, endpoint_id, bound, attempt
        self.payload = notification.to_json()  # as queued: what retries carry and records keep
        self.deferrals, self.woken = deferrals, woken

    def again(self, countdown: float, attempt: int, deferrals: int = 0) -> None:
        """Send this delivery again later, in its lane, as attempt number ``attempt``, and tell its lines when (a
        sign of life, and the time a delivery waiting behind it looks again: see ``notifier.order``), and the
        outbox (a sign of life: ``notifier.outbox``).

        A new message, published before this one is acknowledged (late): a crash in between
        runs the delivery twice at worst (its claim and final mark keep the sends one at a
        time and stop them once one succeeded). Not Celery's ``Task.retry``, which turns a
        failed publish into ``Reject(requeue=False)``: the message was removed if the broker
        took writes again by then, else left for the visibility timeout (~18 min). A failed
        publish here is a store error: the task is put back after ``delivery_store_wait_s``.
        ``retry`` also builds a traceback for every call, a fifth of a worker's time when a
        flood to one endpoint is deferred again and again.
        """
        self.order.expect(self.notification, self.endpoint_id, countdown)
        noted = self.outbox.alive(self.notification.notification_id, self.endpoint_id, countdown)
        self.task.apply_async(args=(self.payload, self.endpoint_id), kwargs=self.arguments(attempt, deferrals),
                              countdown=countdown, queue=queue_for(self.task.app, self.payload),
                              headers=noted_headers(noted))

    def arguments(self, attempt: int, deferrals: int) -> dict:
        """The task's keyword arguments for its run as attempt number ``attempt``."""
        return {**self.bound, "attempt": attempt, "deferrals": deferrals, "woken": self.woken}

    def leave(self) -> None:
        """Out of its lines (``notifier.order``), waking what waited behind it: a copy of each such delivery's task,
        now; once published, the copy it woke from is stale and ends when it comes (a publish that fails leaves
        that copy to come at its time)."""
        waiters = self.order.leave(self.notification, self.endpoint_id)
        for waiter in waiters:
            task = json.loads(waiter.task)
            noted = self.outbox.alive(waiter.member, self.endpoint_id)
            self.task.apply_async(args=(task["notification"], task["endpoint_id"]),
                                  kwargs={**task["kwargs"], "woken": waiter.woken},
                                  queue=queue_for(self.task.app, task["notification"]), headers=noted_headers(noted))
        self.order.woken(self.notification, self.endpoint_id, waiters)

    def take_slot(self, owner_id: int, token: str) -> Busy | None:
        """A slot of the endpoint and of its owner, waited for in the thread only as ``busy_wait_s`` allows."""
        settings = self.settings
        take = functools.partial(self.records.take_slot, self.endpoint_id, owner_id, token,
                                 settings.delivery_endpoint_concurrency, settings.delivery_owner_concurrency,
                                 claim_ttl_s(settings), settings.delivery_busy_wait_s, furthest_turn_s(settings))
        busy = take()
        if busy is None or not busy.waiting:
            return busy
        deadline = time.monotonic() + busy_wait_s(settings, busy)
        try:
            while time.monotonic() < deadline:
                time.sleep(BUSY_POLL_S)
                busy = take()
                if busy is None:
                    return None
        finally:
            if busy is not None:  # it gives up, or failed: the owner slot it waited in goes back
                self.records.free_slot(self.endpoint_id, owner_id, token, None)
        return busy

    def turn(self) -> Turn:
        """Its turn in its lines (``notifier.order``), its task's arguments kept there while it waits."""
        task = {"notification": self.payload, "endpoint_id": self.endpoint_id,
                "kwargs": self.arguments(self.number, self.deferrals)}
        turn = self.order.turn(self.notification, self.endpoint_id, json.dumps(task), self.woken)
        for head in turn.lost:
            ORDER_LOST.inc()
            log.error("delivery_order_head_lost", notification=self.notification.notification_id,
                      endpoint_id=self.endpoint_id, lost=head, after_s=lost_after_s(self.settings))
        return turn

    def run(self, turn: Turn | None = None) -> str:
        """Attempt the delivery, given its ``turn`` in its lines (``None``: it has none, or it is not asked)."""
        endpoint = load_endpoint(self.settings, self.endpoint_id)
        reason = stale_reason(endpoint, self.bound["owner_id"], self.bound["generation"])
        if reason is not None:
            return self.dropped("unknown" if endpoint is None else endpoint.kind, reason)
        assert endpoint is not None  # stale_reason names a missing endpoint; this tells the type checker
        try:
            channel = channel_for(endpoint.kind, self.settings)
        except UnknownKindError:  # stored, but no channel serves it (any more): no retry can help
            return self.failed(endpoint.kind, Attempt(False, False, 0.0, error=f"no channel for kind {endpoint.kind!r}"))
        if turn is not None and turn.superseded_by is not None:
            return self.dropped(endpoint.kind, f"superseded: a later notification of one of its keys (sequence "
                                               f"{turn.superseded_by}) went to this endpoint first")
        token = uuid.uuid4().hex
        busy = self.take_slot(endpoint.owner_id, token)
        if busy is not None:
            DEFERRED.labels("endpoint" if busy.endpoint_full else "owner").inc()
            # A turn in the endpoint's line is a place, not a failed look: it does not double a later delay (a
            # delivery given three turns, then finding its owner full, waited 16 s, not 1-3 s).
            looked_in_vain = busy.turn_s is None
            self.again(busy_delay_s(self.settings, busy, self.deferrals), self.number,
                       self.deferrals + looked_in_vain)
            return "deferred"
        attempt: Attempt | None = None
        try:
            attempt = channel.send(self.notification, endpoint)
        finally:
            took_s = None if attempt is None else attempt.latency_ms / 1000
            self.recorded(lambda: self.records.free_slot(self.endpoint_id, endpoint.owner_id, token, took_s))
        LATENCY.labels(endpoint.kind).observe(attempt.latency_ms / 1000)
        if attempt.ok:
            sent = attempt
            self.recorded(lambda: self.records.delivered(self.payload, self.endpoint_id, endpoint.kind, sent,
                                                         self.number))
            self.recorded(self.leave)
            ATTEMPTS.labels(endpoint.kind, "delivered").inc()
            return "delivered"
        return self.failed(endpoint.kind, attempt)

    def recorded(self, write: Callable[[], object]) -> None:
        """``write`` what an attempt left to record, waiting out a store outage in this thread.

        Put back on its queue instead (as a delivery that could not record its claim is), a delivery that reached
        its receiver would run again with neither its final mark nor its claim written, and be sent twice: a Redis
        Cluster node killed while a worker recorded a delivery did that (``test_node_loss``, in CI). Held at most
        half the broker's visibility timeout, after which the broker would hand the message to another worker
        anyway; then it is put back as before (at least once).
        """
        _outage().ride_out(write, transient=store_away, for_s=longest_sleep_s(self.settings))

    def dropped(self, kind: str, reason: str) -> str:
        """Never sent, for ``reason``: recorded, and out of its lines."""
        self.records.dropped(self.payload, self.endpoint_id, reason, self.number)
        self.leave()
        ATTEMPTS.labels(kind, "dropped").inc()
        log.warning("delivery_dropped", notification=self.notification.notification_id,
                    endpoint_id=self.endpoint_id, reason=reason)
        return "dropped"

    def failed(self, kind: str | None, attempt: Attempt) -> str:
        if not attempt.retryable or self.number > self.settings.delivery_max_retries:
            self.records.dead(self.payload, self.endpoint_id, kind, attempt, self.number, self.bound)
            self.leave()  # what follows a dead letter goes (notifier.order)
            ATTEMPTS.labels(kind or "unknown", "dead").inc()
            log.warning("delivery_dead", notification=self.notification.notification_id,
                        endpoint_id=self.endpoint_id, **attempt.detail())
            return "dead"
        self.records.attempt(self.payload, self.endpoint_id, kind, attempt, self.number, "retry")
        ATTEMPTS.labels(kind or "unknown", "retry").inc()
        self.again(retry_delay_s(attempt, self.number - 1, self.settings), self.number + 1)
        return "retry"
