"""Turns transitions in the Redis alert stream into notifications and delivery tasks.

Reads the stream in a consumer group, so every transition is handed out once and
stays pending until acknowledged. Transitions of one subscription, evaluation
and state are collected for ``dispatcher_group_wait_ms`` (the evaluator writes an
evaluation's transitions from several tasks), passed through the owner's silences
(``notifier.silences``) and the subscription's alert policy, and sent as one notification per endpoint when the policy groups
keys, else one per key.

Each notified transition, and each reminder, gets its key's next ``sequence``, and each
notification is put in its lines to each endpoint before its deliveries are enqueued, so an
endpoint gets a key's notifications in that order (``notifier.order``).

A key with no policy state at all (lost with a Redis node that came back empty) is not one whose firing
was held back: its resolution is sent, marked ``state_unknown`` on its alert, logged and counted
(``notifier.policy``, docs/redis.md).

Crash safety: the policy decision for each transition, including the id of the
notification it joins and its sequence, is stored before any task is enqueued, and entries are
acknowledged only after. A restarted dispatcher re-handles its pending entries,
finds their decisions, and rebuilds the same notifications; the worker drops any
it already delivered.

Several dispatchers (each with its own ``dispatcher_consumer`` name) share the
group: each entry is handed to one of them. A dispatcher that dies leaves its
entries pending; every ``dispatcher_claim_interval_s`` the others claim entries
idle for ``dispatcher_claim_idle_ms`` (XAUTOCLAIM) and handle them as above, so the
stored decisions and the worker's delivered marks keep each alert delivered once.

Every delivery is noted in the outbox before its task is queued, and at the same interval the
dispatcher sends again those that went silent - a task the broker lost (``notifier.outbox``).

An entry whose dispatch fails every time (a subscription whose routing raises, a bug) is not
tried forever: once XPENDING counts ``dispatcher_max_deliveries`` deliveries of it (reads and
claims), the next claim or pending read dead-letters it to the partition's ``alerts:dead``
stream with its last error, counts it (``tocsin_dispatcher_undeliverable_total``) and logs it
once. A failing subscription costs its own entries only: routes are looked up one subscription at
a time when the batch lookup fails, and a group's failure does not stop the others. An outage (the
broker, Redis or the database away) is no fault of the entries: their groups go back to the buffer
and are tried again without another delivery, so an outage never dead-letters an alert.

The stream is one per slot partition (``core.redis_schema``); a dispatcher reads
them all. On a single Redis one XREADGROUP covers every partition; on a Redis
Cluster a command touches one slot, so partitions are read one by one and the
blocking read waits on one partition at a time, in turn (docs/redis.md).
"""

from __future__ import annotations

import contextlib
import json
import signal
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import redis
import structlog
from celery import Celery
from kombu.exceptions import OperationalError as BrokerError
from prometheus_client import Counter, Gauge
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.orm import Session

from core import cli
from core.logs import configure_logging
from core.metrics import serve_metrics
from core.redis_client import is_cluster, make_redis
from core.redis_eviction import check_eviction
from core.redis_outage import TRANSIENT, Outage, is_transient
from core.redis_replies import text_hash
from core.redis_schema import HISTORY_LENGTH, NOTIFIER_GROUP, RedisKeys, claim_layout
from core.settings import Settings, get_settings
from evaluator.transition import Transition
from notifier.app import make_celery
from notifier.deliveries import DeliveryRecords, binding, enqueue_notification
from notifier.notification import Notification, make_notification, notification_id
from notifier.order import DeliveryOrder, reserve, restart_after
from notifier.outbox import Outbox
from notifier.policy import KeyState, decide, reminder_due, resolves_unknown
from notifier.resend import PENDING, resend_silent
from notifier.silences import SilenceCache, silenced_decision
from subscriptions.db import session_factory
from subscriptions.policy import AlertPolicy
from subscriptions.routing import Route, forget_subscription, routes, routes_with_reminders

log = structlog.get_logger("dispatcher")

TRANSITIONS = Counter("tocsin_dispatcher_transitions_total", "Transitions handled", ["outcome"])
NOTIFICATIONS = Counter("tocsin_dispatcher_notifications_total", "Notifications enqueued", ["kind"])
CLAIMED = Counter("tocsin_dispatcher_claimed_total", "Pending entries claimed from dispatchers taken for dead")
BUFFERED = Gauge("tocsin_dispatcher_buffered_transitions", "Transitions waiting to be grouped")
FAILED = Counter("tocsin_dispatcher_failed_rounds_total", "Rounds that failed and are retried (entries stay pending)")
UNDELIVERABLE = Counter("tocsin_dispatcher_undeliverable_total",
                        "Entries dead-lettered after dispatcher_max_deliveries deliveries without an acknowledgement")
UNKNOWN_STATE = Counter("tocsin_dispatcher_unknown_state_resolutions_total",
                        "Resolutions sent without a record that their firing was notified (the key's policy state "
                        "was lost, e.g. with a Redis node that came back empty): marked state_unknown")

OUTAGES: tuple[type[Exception], ...] = (*TRANSIENT, OperationalError, InterfaceError, BrokerError)
"""Failures of a service, not of the entries: a group that met one is tried again from the buffer."""

DECISION_TTL_S = 7 * 24 * 3600
MAX_ID = 2**63  # database ids are positive signed 64-bit integers


_StreamReply = list[tuple[str, list[tuple[str, dict[str, str]]]]] | None  # XREADGROUP, decoded
_Entries = Sequence[tuple[str, dict[str, str] | None]]  # (entry id, fields), as XAUTOCLAIM and XREADGROUP give them


@dataclass
class _Group:
    first_seen: float
    entries: list[tuple[str, dict]] = field(default_factory=list)


def _info(route: Route) -> dict:
    return {"id": route.subscription_id, "name": route.name, "condition": route.condition}


class Dispatcher:
    def __init__(self, settings: Settings, celery: Celery | None = None) -> None:
        self.settings = settings
        self.keys = RedisKeys(settings)
        self.redis = make_redis(settings, decode_responses=True)
        self.one_command = not is_cluster(self.redis)  # one XREADGROUP may name every partition's stream
        self.records = DeliveryRecords(self.redis, self.keys)
        self.order = DeliveryOrder(self.redis, self.keys, settings)
        self.outbox = Outbox(self.redis, self.keys, settings)
        self.celery = celery or make_celery(settings)
        self.sessions = session_factory(settings.database_url)
        self.buffer: dict[tuple, _Group] = {}
        self.buffered: set[tuple[int, str]] = set()  # (partition, entry id) in the buffer: a claim adds none twice
        self.last_error: dict[tuple[int, str], str] = {}  # (partition, entry id) -> why its last dispatch failed
        self.silences = SilenceCache(settings.silence_cache_s)
        self.next_reminder = 0.0
        self.next_claim = 0.0
        # No resends until a silence after the start or after Redis was last away: a worker that sent a delivery
        # while Redis was away waits to record it, its claim expired meanwhile; sent again before it records, the
        # delivery would reach its receiver twice (notifier.tasks._Delivery.recorded).
        self.resend_from = time.monotonic() + self.outbox.silent_after_s
        self.turn = 0  # the partition the next blocking read waits on, on a cluster
        self.running = True
        self.outage = Outage("dispatcher", settings, self.redis)
        # Started (or restarted) while a node is away - a failover under way - it waits for Redis, as the sink does,
        # rather than exiting before it has read anything
        self.outage.ride_out(lambda: claim_layout(self.redis, self.keys))  # partitions this one does not read: refuse
        self.outage.ride_out(lambda: check_eviction(self.redis, "dispatcher"))  # a node that may drop alerts: refuse
        self.outage.ride_out(self.create_groups)

    def create_groups(self) -> None:
        """The consumer group on every partition's stream (from its first entry), unless it is there."""
        for stream in self.keys.alerts_streams:
            try:
                self.redis.xgroup_create(stream, NOTIFIER_GROUP, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    # -- reading and grouping ------------------------------------------------------------------

    def _xreadgroup(self, partitions: list[int], pending: bool, block_ms: int | None) -> int:
        response: _StreamReply = self.redis.xreadgroup(  # type: ignore[assignment]  # redis-py types every reply shape at once
            NOTIFIER_GROUP,
            self.settings.dispatcher_consumer,
            {self.keys.alerts_stream_of(p): "0" if pending else ">" for p in partitions},
            count=500,
            block=None if pending else block_ms,
        )
        partition_of = {self.keys.alerts_stream_of(p): p for p in partitions}
        if pending:  # re-read after a restart: an entry that brought every run down goes no further either
            return sum([self._buffer(partition_of[stream], self._bounded(partition_of[stream], entries))
                        for stream, entries in response or []])
        return sum([self._buffer(partition_of[stream], entries) for stream, entries in response or []])

    def read(self, block_ms: int | None, pending: bool = False) -> int:
        """Buffer one read's worth of entries; ``pending`` re-reads this consumer's unacknowledged ones."""
        partitions = list(range(self.keys.partitions))
        if self.one_command:
            read = self._xreadgroup(partitions, pending, block_ms)
        else:
            read = sum(self._xreadgroup([p], pending, None) for p in partitions)
            if not read and not pending and block_ms is not None:  # wait on one partition, each in turn
                self.turn = (self.turn + 1) % len(partitions)
                read = self._xreadgroup([self.turn], False, max(1, block_ms // len(partitions)))
        BUFFERED.set(sum(len(g.entries) for g in self.buffer.values()))
        return read

    def claim(self) -> int:
        """Buffer the entries other (dead) dispatchers read and left pending past ``dispatcher_claim_idle_ms``."""
        claimed = 0
        for partition, stream in enumerate(self.keys.alerts_streams):
            start = "0-0"
            while True:
                reply = self.redis.xautoclaim(stream, NOTIFIER_GROUP, self.settings.dispatcher_consumer,
                                              self.settings.dispatcher_claim_idle_ms, start, count=500)
                start, entries = reply[0], reply[1]
                taken = self._buffer(partition, self._bounded(partition, entries, claimed=True))
                if taken:
                    CLAIMED.inc(taken)
                    log.warning("pending_entries_claimed", stream=stream, entries=taken)
                claimed += taken
                if start == "0-0":
                    break
        BUFFERED.set(sum(len(g.entries) for g in self.buffer.values()))
        return claimed

    def _bounded(self, partition: int, entries: _Entries, claimed: bool = False) -> _Entries:
        """``entries`` less those delivered more than ``dispatcher_max_deliveries`` times, which are dead-lettered.

        ``claimed``: XAUTOCLAIM gave them, and counted a delivery of each, also of those this dispatcher holds
        in its buffer (waiting for their group, or for a service to come back): for those the count is put back,
        so an outage longer than the claim idle time does not run an alert up to the bound.
        """
        live = [(entry_id, fields) for entry_id, fields in entries if fields is not None]
        if not live:
            return entries
        stream = self.keys.alerts_stream_of(partition)
        pipe = self.redis.pipeline(transaction=False)  # one stream: one slot
        for entry_id, _ in live:
            pipe.xpending_range(stream, NOTIFIER_GROUP, min=entry_id, max=entry_id, count=1)
        counts = {entry_id: (reply[0]["times_delivered"] if reply else 0)
                  for (entry_id, _), reply in zip(live, pipe.execute(), strict=True)}
        held = [entry_id for entry_id, _ in live if (partition, entry_id) in self.buffered and counts[entry_id] > 1]
        if claimed and held:
            for entry_id in held:  # JUSTID: this XCLAIM counts no delivery; RETRYCOUNT sets the count
                pipe.xclaim(stream, NOTIFIER_GROUP, self.settings.dispatcher_consumer, 0, [entry_id],
                            retrycount=counts[entry_id] - 1, justid=True)
            pipe.execute()
        most = self.settings.dispatcher_max_deliveries
        over = {entry_id for entry_id, _ in live if counts[entry_id] > most and (partition, entry_id) not in self.buffered}
        for entry_id, fields in live:
            if entry_id in over:
                self._give_up(partition, entry_id, fields or {}, counts[entry_id] - 1)
        return [(entry_id, fields) for entry_id, fields in entries if entry_id not in over]

    def _give_up(self, partition: int, entry_id: str, fields: dict[str, str], attempts: int) -> None:
        """Dead-letter an entry that was delivered ``attempts`` times and never dispatched, with the reason."""
        error = self.last_error.pop((partition, entry_id), None)
        reason = (f"not dispatched after {attempts} deliveries (dispatcher_max_deliveries "
                  f"{self.settings.dispatcher_max_deliveries}): {error or 'its dispatcher failed or died each time'}")
        self._dead_letter(partition, entry_id, fields, reason)
        UNDELIVERABLE.inc()
        TRANSITIONS.labels("undeliverable").inc()
        log.error("undeliverable_transition_dead_lettered", entry_id=entry_id, partition=partition, reason=reason)

    def _dead_letter(self, partition: int, entry_id: str, fields: dict[str, str], reason: str) -> None:
        """Move an entry to the partition's dead letters with ``reason`` and acknowledge it, in one transaction."""
        raw = json.dumps(fields)[: self.settings.dead_letter_raw_bytes]
        pipe = self.redis.pipeline(transaction=True)  # both keys in the partition's slot
        pipe.xadd(self.keys.alerts_dead_of(partition), {"entry_id": entry_id, "reason": reason, "entry": raw},
                  maxlen=HISTORY_LENGTH, approximate=True)
        pipe.xack(self.keys.alerts_stream_of(partition), NOTIFIER_GROUP, entry_id)
        pipe.execute()

    def _buffer(self, partition: int, entries: _Entries) -> int:
        """Add read or claimed entries to their groups; returns how many were new to the buffer."""
        now = time.monotonic()
        added = 0
        for entry_id, fields in entries:
            if (partition, entry_id) in self.buffered or fields is None:  # None: trimmed from the stream
                continue
            alert = self._parse(partition, entry_id, fields)
            if alert is None:
                continue
            # By the stream read, too: acknowledged where it was read (were the partitions ever renumbered).
            key = (alert["subscription_id"], alert["evaluated_at"], alert["state"], partition)
            self.buffer.setdefault(key, _Group(now)).entries.append((entry_id, alert))
            self.buffered.add((partition, entry_id))
            added += 1
        return added

    def _parse(self, partition: int, entry_id: str, fields: dict[str, str]) -> dict | None:
        """The entry's transition, or None once a malformed entry is dead-lettered with its reason and acknowledged.

        Only the evaluator's sink writes the stream, but one bad entry must not stop every alert behind it:
        a dispatcher that raised here would re-read the same pending entry after each restart, forever.
        """
        try:
            alert = Transition.from_json(fields["alert"]).to_dict()
            if not 0 < alert["subscription_id"] < MAX_ID:  # no database row has it: every dispatch would fail
                raise ValueError(f"subscription_id {alert['subscription_id']} is not a positive 64-bit id")
            return alert
        except (KeyError, ValueError, TypeError, RecursionError) as exc:
            reason = f"{type(exc).__name__}: {exc}"
            self._dead_letter(partition, entry_id, fields, reason)
            TRANSITIONS.labels("malformed").inc()
            log.error("malformed_transition_dead_lettered", entry_id=entry_id, reason=reason)
            return None

    def flush(self, force: bool = False) -> int:
        """Dispatch the groups that waited long enough (all of them if ``force``)."""
        wait_s = self.settings.dispatcher_group_wait_ms / 1000
        now = time.monotonic()
        due = [k for k, g in self.buffer.items() if force or now - g.first_seen >= wait_s]
        failure: Exception | None = None
        if due:
            with self.sessions() as session:
                known, broken = self._routes(session, {key[0] for key in due})
                self.silences.refresh(session, {route.owner_id for route in known.values()})
            for key in due:
                group = self.buffer.pop(key)
                try:
                    if key[0] in broken:
                        raise broken[key[0]]
                    self.dispatch(known.get(key[0]), group.entries, key[3])
                except OUTAGES:
                    # Not the entries' fault: tried again next round, not re-delivered - and first, as it was due
                    # first: behind a later group of its keys (their resolution), it would be decided after it.
                    self.buffer = {key: group, **self.buffer}
                    raise
                except Exception as exc:  # noqa: BLE001 - re-raised below, after the other groups
                    # Out of the buffer: they stay pending and a claim brings them back, up to the delivery bound.
                    failure = failure or exc
                    if len(self.last_error) > 100_000:  # reasons of entries others took over: bounded
                        self.last_error.clear()
                    for entry_id, _ in group.entries:
                        self.last_error[(key[3], entry_id)] = f"{type(exc).__name__}: {exc}"[:500]
                else:
                    for entry_id, _ in group.entries:
                        self.last_error.pop((key[3], entry_id), None)
                self.buffered.difference_update((key[3], entry_id) for entry_id, _ in group.entries)
        BUFFERED.set(sum(len(g.entries) for g in self.buffer.values()))
        if failure is not None:  # after the other groups went: one failing subscription holds up no other
            raise failure
        return len(due)

    def _routes(self, session: Session, ids: set[int]) -> tuple[dict[int, Route], dict[int, Exception]]:
        """The routes of ``ids``, and the error of each one whose routing fails (looked up alone then)."""
        try:
            return routes(session, ids), {}
        except OUTAGES:
            raise
        except Exception:  # noqa: BLE001 - one subscription's routing fails: look them up one by one
            session.rollback()
        known: dict[int, Route] = {}
        broken: dict[int, Exception] = {}
        for sid in ids:
            try:
                known.update(routes(session, {sid}))
            except OUTAGES:
                raise
            except Exception as exc:  # noqa: BLE001 - raised when its group is dispatched
                session.rollback()
                broken[sid] = exc
        return known, broken

    def _wait_ms(self) -> int:
        """How long the next read may block without holding a group past its wait."""
        block = self.settings.dispatcher_block_ms
        if not self.buffer:
            return block
        oldest = min(g.first_seen for g in self.buffer.values())
        remaining = self.settings.dispatcher_group_wait_ms - (time.monotonic() - oldest) * 1000
        return max(1, min(block, int(remaining)))

    # -- policy and enqueueing -----------------------------------------------------------------

    def dispatch(self, route: Route | None, entries: list[tuple[str, dict]], partition: int) -> None:
        """Decide and enqueue one group of transitions of one subscription (``None``: it was deleted), read from
        ``partition``'s stream."""
        alerts = [alert for _, alert in entries]
        if route is None:
            TRANSITIONS.labels("no_subscription").inc(len(alerts))
            # Deleted (ids are never reused): what the evaluator wrote before it saw the new catalog goes too.
            forget_subscription(self.redis, self.keys, alerts[0]["subscription_id"])
        else:
            assigned = self.decide(route.subscription_id, route.policy, alerts,
                                   lambda key, now: self.silences.silencing(route, key, now))
            by_notification: dict[str, list[dict]] = defaultdict(list)
            for alert in alerts:
                nid = assigned[alert["alert_id"]]
                if nid is not None:
                    by_notification[nid].append(alert)
            for nid, members in by_notification.items():
                self.enqueue(make_notification(_info(route), members, nid), route)
        self.redis.xack(self.keys.alerts_stream_of(partition), NOTIFIER_GROUP, *[entry_id for entry_id, _ in entries])

    def decide(self, subscription_id: int, policy: AlertPolicy, alerts: list[dict],
               silenced: Callable[[str, float], int | None] = lambda _key, _now: None) -> dict[str, str | None]:
        """The notification id each alert joins (None: suppressed), decided once per alert and stored.

        ``silenced(key, now)``: the silence holding the key's alerts back, if any (``notifier.silences``).
        """
        known = self.redis.mget([self.keys.decision(subscription_id, a["alert_id"]) for a in alerts])
        assigned = {a["alert_id"]: json.loads(raw)["notification"] for a, raw in zip(alerts, known, strict=True) if raw}
        for alert, raw in zip(alerts, known, strict=True):  # the episode and sequence of a decided transition
            decided = json.loads(raw) if raw else {}
            if decided.get("episode"):
                alert["episode_id"] = decided["episode"]
            if decided.get("sequence") is not None:
                alert["sequence"] = decided["sequence"]
            if decided.get("state_unknown"):
                alert["state_unknown"] = True
        fresh = [a for a, raw in zip(alerts, known, strict=True) if raw is None]
        if not fresh:
            return assigned
        states_key = self.keys.key_states(subscription_id)
        stored = self.redis.hmget(states_key, [a["key"] for a in fresh])
        now = time.time()
        reasons: dict[str, str | None] = {}
        silenced_with: dict[str, int] = {}
        unknown: list[dict] = []  # resolutions notified without a record of their firing (notifier.policy)
        pipe = self.redis.pipeline(transaction=True)  # the subscription's slot: its states, decisions and log
        counts = self.redis.pipeline(transaction=False)  # the deployment's counters, in a slot of their own
        for alert, raw in zip(fresh, stored, strict=True):
            state = KeyState.from_dict(json.loads(raw) if raw else None)
            blind = resolves_unknown(state, alert["state"])
            reason: str | None
            silence = silenced(alert["key"], now)
            if silence is not None and not (alert["state"] == "resolved" and state.open):  # see notifier.silences
                reason, state = silenced_decision(silence, state, alert["state"])
                silenced_with[alert["alert_id"]] = silence
            else:
                reason, state = decide(policy, state, alert["state"], now, alert["alert_id"])
            reasons[alert["alert_id"]] = reason
            if reason is None and state.episode:
                alert["episode_id"] = state.episode
            if reason is None and blind:
                alert["state_unknown"] = True
                unknown.append(alert)
            pipe.hset(states_key, alert["key"], json.dumps(state.to_dict()))
        notified = [a for a in fresh if reasons[a["alert_id"]] is None]
        shared = notification_id([a["alert_id"] for a in notified]) if policy.group and notified else None
        # Numbered before the decisions are stored with their numbers: a crash in between leaves a gap, never a
        # number given twice.
        # A key whose state was lost lost its counter too: it starts again above any number given before, so a
        # delivery numbered before the loss and still in flight is not taken for a later one (notifier.order).
        restart = {a["key"]: restart_after(now) for a in unknown}
        for alert, sequence in zip(notified, reserve(self.redis, self.keys, subscription_id,
                                                     [a["key"] for a in notified], restart), strict=True):
            alert["sequence"] = sequence
        for alert in fresh:
            reason = reasons[alert["alert_id"]]
            nid = None if reason is not None else shared or notification_id([alert["alert_id"]])
            assigned[alert["alert_id"]] = nid
            pipe.set(self.keys.decision(subscription_id, alert["alert_id"]),
                     json.dumps({"reason": reason, "notification": nid, "episode": alert.get("episode_id"),
                                 "sequence": alert.get("sequence"),
                                 **({"state_unknown": True} if alert.get("state_unknown") else {})}),
                     ex=DECISION_TTL_S)
            if reason is not None:
                self.records.suppressed(subscription_id, alert, reason, pipe, counts,
                                        silenced_with.get(alert["alert_id"]))
            TRANSITIONS.labels("notified" if reason is None else "suppressed").inc()
        pipe.execute()
        counts.execute()
        if unknown:
            UNKNOWN_STATE.inc(len(unknown))
            log.warning("resolution_with_unknown_state", subscription_id=subscription_id,
                        keys=sorted(a["key"] for a in unknown)[:20], alerts=len(unknown))
        return assigned

    def enqueue(self, notification: Notification, route: Route) -> None:
        """Queue one delivery per endpoint, each in its lines first (``notifier.order``): a delivery of a key's
        later notification, enqueued in turn, never finds this one missing from the line."""
        self.order.join(notification, [endpoint.id for endpoint in route.endpoints])
        for endpoint in route.endpoints:
            enqueue_notification(self.celery, self.outbox, notification, endpoint.id, binding(endpoint))
        NOTIFICATIONS.labels("reminder" if notification.reminder else notification.state).inc()

    def remind(self, session: Session) -> int:
        """Remind subscribers of keys still firing whose re-notify interval has passed."""
        now = time.time()
        sent = 0
        reminding = routes_with_reminders(session)
        self.silences.refresh(session, {route.owner_id for route in reminding})
        for route in reminding:
            policy = route.policy
            firing = self._firing(route.subscription_id)
            if not firing:
                continue
            keys = sorted(firing)
            states_key = self.keys.key_states(route.subscription_id)
            stored = self.redis.hmget(states_key, keys)
            # Only transitions the dispatcher has already decided on; the others are still on their way.
            handled = self.redis.mget([self.keys.decision(route.subscription_id, firing[k]["alert_id"]) for k in keys])
            due = [
                firing[k]
                for k, raw, decided in zip(keys, stored, handled, strict=True)
                if decided and reminder_due(policy, KeyState.from_dict(json.loads(raw) if raw else None), now)
                and self.silences.silencing(route, k, now) is None  # held back while silenced
            ]
            if not due:
                continue
            sequences = reserve(self.redis, self.keys, route.subscription_id, [a["key"] for a in due])
            due = [{**alert, "sequence": sequence} for alert, sequence in zip(due, sequences, strict=True)]
            for members in [due] if policy.group else [[a] for a in due]:
                nid = notification_id([a["alert_id"] for a in members], reminder_at=now)
                self.enqueue(make_notification(_info(route), members, nid, reminder=True), route)
                sent += 1
            # After enqueueing: a crash in between repeats a reminder rather than losing it.
            # A reminder opens (or continues) the episode of the firing it repeats, as that firing's alert id.
            self.redis.hset(states_key,
                            mapping={a["key"]: json.dumps(KeyState(now, True, a["alert_id"]).to_dict()) for a in due})
        return sent

    def _firing(self, subscription_id: int) -> dict[str, dict]:
        """The subscription's firing transitions by key; a value that is not one is skipped and logged.

        One bad value must not stop the reminders of every subscription after it, at every reminder round.
        """
        firing: dict[str, dict] = {}
        for key, raw in text_hash(self.redis.hgetall(self.keys.firing(subscription_id))).items():
            try:
                firing[key] = Transition.from_json(raw).to_dict()
            except (ValueError, TypeError, KeyError) as exc:
                TRANSITIONS.labels("malformed").inc()
                log.error("malformed_firing_transition_skipped", subscription_id=subscription_id, key=key,
                          reason=f"{type(exc).__name__}: {exc}")
        return firing

    # -- the loop ----------------------------------------------------------------------------------

    def drain_pending(self) -> None:
        while self.read(None, pending=True):
            self.flush(force=True)

    def run_once(self) -> None:
        if time.monotonic() >= self.next_claim:
            self.claim()
            PENDING.set(self.outbox.count())
            if time.monotonic() >= self.resend_from:
                resend_silent(self.settings, self.celery, self.outbox, self.records, self.order)
            self.next_claim = time.monotonic() + self.settings.dispatcher_claim_interval_s
        self.read(self._wait_ms())
        self.flush()
        if time.monotonic() >= self.next_reminder:
            with self.sessions() as session:
                self.remind(session)
            self.next_reminder = time.monotonic() + self.settings.dispatcher_remind_interval_s

    def run(self) -> None:
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "running", False))
        try:
            self.drain_pending()
        except Exception:  # as in the loop below: what failed stays pending and is claimed back
            FAILED.inc()
            log.exception("dispatch_failed")
        log.info("dispatcher_started", streams=self.keys.alerts_streams, consumer=self.settings.dispatcher_consumer)
        failures = 0  # rounds in a row that met Redis away
        while self.running:
            try:
                self.run_once()
                self.outage.recovered()
                failures = 0
            except (OperationalError, InterfaceError) as exc:  # routes and silences are read at each decision
                log.warning("database_unavailable", error=str(exc)[:500])  # buffered and pending entries wait
                time.sleep(1)
            except Exception as exc:
                if is_transient(exc):  # a timeout too: e.g. resumed after a stall
                    # A node lost, a failover, a restart: logged and counted once per outage (not per round),
                    # waited out with a bounded backoff; what was read stays buffered or pending.
                    self.outage.failed(exc)
                    self.outage.refresh()
                    self.resend_from = time.monotonic() + self.outbox.silent_after_s
                    failures += 1
                    time.sleep(self.outage.pause_s(failures))
                    continue
                FAILED.inc()
                if isinstance(exc, redis.ResponseError) and "NOGROUP" in str(exc):
                    # The stream went with its group (a Redis restarted without its data, a key deleted): the sink
                    # writes a new stream, which nobody would ever read without the group again.
                    log.error("consumer_group_missing", error=str(exc))
                    with contextlib.suppress(redis.RedisError):  # if Redis is away, the next round says so
                        self.create_groups()
                    continue
                # e.g. the Celery broker unreachable (kombu's OperationalError). A group whose dispatch failed left
                # the buffer but stays pending; claim() takes it back once idle for dispatcher_claim_idle_ms (its
                # own entries too) and dispatches it again.
                log.exception("dispatch_failed")
                time.sleep(1)
        self.flush(force=True)


def main(argv: list[str] | None = None) -> None:
    cli.no_arguments(__doc__, "python -m notifier.dispatcher", argv)
    configure_logging()
    settings = get_settings()
    serve_metrics(settings.metrics_port_dispatcher, settings.metrics_bind_address)
    with contextlib.suppress(KeyboardInterrupt):
        Dispatcher(settings).run()


if __name__ == "__main__":
    main()
