"""Where things live in Redis, in one place for every writer and reader.

- ``subscriptions:version``: the newest catalog version published; ``subscriptions:changes``:
  a Stream of the catalog's changes, entry id ``<version>-0``, so stream order is version order;
  ``subscriptions:snapshot`` / ``subscriptions:snapshot-version``: the whole catalog at some
  version the change log reaches back to, for new or lagging readers (see ``core.catalog_log``;
  written by the subscriptions service, read by the evaluator);
- ``alerts``: a Stream of transitions (written by the evaluator sink, consumed by
  the notifier's dispatcher in the ``notifier`` group), one per slot partition
  (:meth:`RedisKeys.partition`; see :class:`RedisKeys` for the hash tags and docs/redis.md);
- ``alerts:dead``: stream entries the dispatcher could not read as a transition, with the reason;
- ``alert:<id>``: de-duplication marks, so a replayed micro-batch adds nothing;
- ``firing:<subscription>``: a hash key -> latest firing transition;
- ``history:<subscription>``: a Stream of the subscription's newest transitions
  (``HISTORY_LENGTH``), for its alert history;
- ``counters:<subscription>`` and ``stats:evaluator``: counters for dashboards (in ``stats:evaluator`` a declared
  stream's query has fields of its own, :func:`stream_stat`: shard clocks, start, failures);
- ``policy:<subscription>``: per key, what the subscriber was last told, and
  ``decision:<alert>``: what the alert policy decided for a transition, so that a
  re-handled transition is decided the same way (see ``notifier.dispatcher``);
- ``sequence:<subscription>``: per key, the last ``sequence`` given to a notification of it, and
  ``order:<subscription>:<endpoint>:<key>`` / ``order-state:...``: each endpoint's line of a key's
  notifications not yet delivered, and ``order-wake:<subscription>:<endpoint>:<notification>``: the task of
  one waiting in its lines (see ``notifier.order``);
- ``deliveries:*``, ``delivered:*``, ``sending:*`` and ``inflight:*``: see ``notifier.deliveries``;
- ``celery:*``: the Celery broker's keys, among them each delivery lane's queue
  (:func:`lane_queue`, :func:`celery_queue_keys`; see ``notifier.app``);
- ``ops:samples``: the operators' dashboard samples (see ``web.ops``), and
  ``ops:watchdog``: the dead man's switch's open incidents (see ``web.watchdog``);
- ``evaluator:starts``: when the evaluator job last started (newest first);
- ``streams:schemas`` / ``streams:version``: the stream registry, a hash stream name -> ``StreamSchema`` JSON
  and a counter bumped with every rewrite (written by ``subscriptions.streams``, read by the evaluator's
  stream supervisor, see docs/evaluator-streams.md); ``streams:series:<name>``: a stream's active series
  (``core.series_limit``, kept by the evaluator's parser);
- ``previews`` and ``preview:<request>``: condition previews asked of the
  evaluator's shards and their answers (see ``web.conditions``);
- ``rate:*``: rate-limit and sign-in lock-out counters (see ``web.limits``);
- ``requests:<account or credential>``: the requests an account has in progress, a sorted set of leases
  (see ``web.tenants``);
- ``flash:<session>``: a secret to show once on the next page (see ``web.pages.common``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from core.settings import Settings
from core.stream_names import TRADES

NOTIFIER_GROUP = "notifier"
HISTORY_LENGTH = 10_000  # transitions kept per subscription for its alert history
SEEN_BUCKET_MS = 600_000  # ten minutes of evaluation time per seen set: one expires without a long free


def seen_bucket(evaluated_at_ms: int) -> int:
    """The ten minutes (since the epoch) whose ``seen`` set holds an alert evaluated at ``evaluated_at_ms``: a replayed
    transition has the same time, so it is always checked against the set its first write went to. Ten minutes, not
    a day: Redis frees an expired set in one go, and a day's of a busy deployment would block it for seconds."""
    return evaluated_at_ms // SEEN_BUCKET_MS


#: The worker lanes, each a Celery queue of its own (see ``notifier.app``): alert deliveries, test deliveries, and
#: backtests (``notifier.backtests``: long CPU work, kept off the delivery lanes).
LANES = ("alerts", "tests", "backtests")


def lane_queue(settings: Settings, lane: str) -> str:
    """The broker queue of a worker lane."""
    if lane not in LANES:
        raise ValueError(f"unknown worker lane {lane!r}; lanes: {', '.join(LANES)}")
    base = settings.redis_key("deliveries")
    return base if lane == "alerts" else f"{base}:{lane}"


def celery_key_prefix(settings: Settings) -> str:
    """The prefix of every key the Celery broker writes (its Redis transport's ``global_keyprefix``)."""
    return settings.redis_key("celery") + ":"


def celery_queue_keys(settings: Settings, lane: str = "alerts") -> tuple[str, str]:
    """The Redis list a lane's queue lives in, and the hash of tasks workers hold unacknowledged."""
    prefix = celery_key_prefix(settings)
    return prefix + lane_queue(settings, lane), prefix + "unacked"


def shard_clock_field(shard: int) -> str:
    """The field of ``stats:evaluator`` holding a shard's last evaluated boundary (written by the sink)."""
    return f"shard_{shard}_evaluated_at"


def shard_clocks(stats: dict[str, str], stream: str = TRADES) -> list[int]:
    """Every shard's last evaluated boundary of ``stream``'s query, from the ``stats:evaluator`` hash."""
    prefix = stream_stat(stream, "shard_")
    return [int(v) for k, v in stats.items() if k.startswith(prefix) and k.endswith("_evaluated_at")]


#: ``stats:evaluator`` fields ``admission_waiting:<stream>:<shard>``: new subscriptions each shard has not admitted
#: yet after its last batch (``evaluator.admission``; written by the shard operator).
ADMISSION_WAITING = "admission_waiting"


def admission_waiting_field(stream: str, shard: int) -> str:
    return f"{ADMISSION_WAITING}:{stream}:{shard}"


#: ``stats:evaluator`` fields ``catalog_version:<stream>:<shard>``: the version of the catalog the shard's last batch
#: evaluated (written by the shard operator); a subscription last changed at a later version is not evaluated there
#: yet. Versions, not times: the web hosts' and the executors' clocks need not agree.
CATALOG_READ_VERSION = "catalog_version"


def catalog_read_field(stream: str, shard: int) -> str:
    return f"{CATALOG_READ_VERSION}:{stream}:{shard}"


def _of_kind(fields: Mapping[Any, Any], kind: str) -> Iterator[tuple[str, str]]:
    """``(rest, value)`` of each ``<kind>:<rest>`` field of a ``stats:evaluator`` reply (fields and values as bytes
    or text)."""
    for name, value in fields.items():
        named, _, rest = (name.decode() if isinstance(name, bytes) else name).partition(":")
        if named == kind:
            yield rest, value.decode() if isinstance(value, bytes) else str(value)


def per_shard(fields: Mapping[Any, Any], kind: str) -> dict[str, dict[int, str]]:
    """Per stream and shard, the ``<kind>:<stream>:<shard>`` fields: every shard that reported is listed."""
    found: dict[str, dict[int, str]] = {}
    for rest, value in _of_kind(fields, kind):
        stream, _, shard = rest.rpartition(":")
        found.setdefault(stream, {})[int(shard)] = value
    return found


def admission_waiting_by_shard(fields: Mapping[Any, Any]) -> dict[str, dict[int, int]]:
    """Per stream and shard, the subscriptions not admitted yet after the shard's last batch, 0 or not."""
    return {stream: {shard: int(v) for shard, v in shards.items()}
            for stream, shards in per_shard(fields, ADMISSION_WAITING).items()}


def admission_waiting(fields: Mapping[Any, Any]) -> dict[str, int]:
    """Per stream, the subscriptions its shards have not admitted yet (summed: each shard admits for its keys)."""
    return {stream: sum(shards.values()) for stream, shards in admission_waiting_by_shard(fields).items()}


#: ``stats:evaluator`` fields ``handoff_waiting:<stream>`` and ``handoff_stored:<stream>``: transitions a query's sink
#: handed over to be stored after their batch and not stored yet, and a total of those stored since (both written
#: by ``evaluator.spark.handoff`` as they change).
HANDOFF_WAITING = "handoff_waiting"
HANDOFF_STORED = "handoff_stored"


def handoff_field(kind: str, stream: str) -> str:
    return f"{kind}:{stream}"


def handoff_counts(fields: Mapping[Any, Any], kind: str) -> dict[str, int]:
    """Per stream, the handoff's ``kind`` count (:data:`HANDOFF_WAITING` or :data:`HANDOFF_STORED`), from a
    ``stats:evaluator`` reply."""
    return {stream: int(value) for stream, value in _of_kind(fields, kind)}


def stream_stat(stream: str, field: str) -> str:
    """A field of ``stats:evaluator`` for a declared stream's query (``trades`` keeps the plain field names, which
    readiness and the dashboards read): ``stream:<name>:<field>``."""
    return field if stream == TRADES else f"stream:{stream}:{field}"


#: Fields (:func:`stream_stat`) the stream supervisor writes for a declared stream's query: when it last started
#: (wall time), and while it keeps failing ``{"failures": in a row, "since": the first one's wall time, "error"}``
#: as JSON (removed once the query has run well for a while, its schema changed or the stream is gone).
QUERY_STARTED_AT = "query_started_at"
QUERY_FAILING = "query_failing"


def partition_tag(settings: Settings, name: str) -> str:
    """A hash tag: every key carrying it is in one Redis Cluster slot (namespaced, so deployments spread)."""
    return "{" + settings.redis_key(name) + "}"


class RedisKeys:
    """Every key name. Keys that one atomic script or transaction touches together share a hash tag.

    Without a cluster and with one partition (the default) no key carries a tag: the names are
    those of a single Redis. Otherwise (``redis_cluster`` or ``redis_partitions`` > 1):

    - the catalog's four keys carry ``{<ns>:catalog}`` (its scripts read and write them together);
    - a subscription's keys (firing, history, counters, policy, sequences, delivery log and delivery
      order), its alerts' dedupe and decision marks, and the alert stream they go to carry ``{<ns>:p<n>}``,
      ``n`` the subscription's :meth:`partition`: the sink's script, the dispatcher's decision
      transaction and the order scripts each touch one partition, so one slot;
    - a delivery's ``delivered`` and ``sending`` marks carry ``{<notification id>}`` (claimed together),
      and an owner's in-flight sets (its own and its endpoints') ``{<ns>:owner:<id>}``;
    - a stream's series set is its own tag, and its publisher tokens' sets carry it (one script admits a batch);
    - the deliveries queued and not ended, and their tasks, carry ``{<ns>:pending}`` (``notifier.outbox``).

    Everything else is one key per command (streams, hashes, lists, counters), in any slot.
    """

    def __init__(self, settings: Settings) -> None:
        k = settings.redis_key
        self.partitions = settings.redis_partitions
        self.tagged = settings.redis_cluster or settings.redis_partitions > 1
        catalog = partition_tag(settings, "catalog")
        c = (lambda *parts: k(catalog, *parts)) if self.tagged else k
        self.catalog_version = c("subscriptions", "version")
        self.catalog_snapshot = c("subscriptions", "snapshot")
        self.catalog_snapshot_version = c("subscriptions", "snapshot-version")
        self.catalog_changes = c("subscriptions", "changes")
        registry = partition_tag(settings, "streams")  # rewritten with its version in one transaction
        r = (lambda *parts: k(registry, *parts)) if self.tagged else k
        self.stream_schemas = r("streams", "schemas")
        self.streams_version = r("streams", "version")
        self.stream_ids = r("streams", "ids")  # name -> the streams row's id: a stream declared again has a new one
        self.evaluator_stats = k("stats", "evaluator")
        self.delivery_stats = k("stats", "delivery")
        self.dead_letters = k("deliveries", "dead")
        pending = partition_tag(settings, "pending")  # one script takes silent deliveries from both (notifier.outbox)
        self.pending_deliveries = k(pending, "deliveries", "pending") if self.tagged else k("deliveries", "pending")
        self.pending_tasks = k(pending, "deliveries", "pending-tasks") if self.tagged else k("deliveries", "pending-tasks")
        self.ops_samples = k("ops", "samples")
        self.previews = k("previews")
        self.ops_sampler_lock = k("ops", "sampler-lock")
        self.rate_limits = k("rate")  # the prefix of the `limits` library's counters
        self.requests_in_progress = k("requests")  # the prefix of each account's leases (web.tenants)
        self.evaluator_starts = k("evaluator", "starts")
        self.watchdog_state = k("ops", "watchdog")
        self.process_restarts = k("ops", "restarts")  # the local runner's restarts per process (core.restarts)
        self.stale_notices = k("ops", "stale")  # streams whose subscribers were told "stale" (web.stale)
        self.clock_ahead = k("ops", "clock-ahead")  # sources dating records ahead of the clock (core.clock_ahead)
        self._k = k
        self._tags = [partition_tag(settings, f"p{n}") for n in range(self.partitions)]
        self.layout = k("layout")  # the key layout alerts are written in (see :func:`claim_layout`)

    def series(self, stream: str) -> str:
        """A stream's active series and their newest event times (``core.series_limit``). Its publisher tokens'
        own sets (:meth:`token_series`) carry it as their hash tag: one script admits a batch against both."""
        name = self._k("streams", "series", stream)
        return "{" + name + "}" if self.tagged else name

    def token_series(self, stream: str, token: int | str) -> str:
        """The series one publisher token keeps active in ``stream`` (``core.series_limit``; ``"*"``: a pattern
        matching every token's)."""
        return f"{self.series(stream)}:token:{token}"

    # -- slot partitions ---------------------------------------------------------------------------

    def partition(self, subscription_id: int) -> int:
        """The slot partition of a subscription's keys and of the alert stream its transitions go to."""
        return subscription_id % self.partitions

    def _p(self, partition: int, *parts: str | int) -> str:
        return self._k(self._tags[partition], *parts) if self.tagged else self._k(*parts)

    def _s(self, subscription_id: int, *parts: str | int) -> str:
        return self._p(self.partition(subscription_id), *parts)

    def rank_state(self, subscription_id: int) -> str:
        """A rank subscription's merge state (``evaluator.rank.RankState`` as JSON): each shard's last list, its first
        ``k``, lists waiting for a shard to evaluate their boundary."""
        return self._s(subscription_id, "rank", subscription_id)

    def rank_waiting(self, stream: str) -> str:
        """The rank subscriptions of ``stream``'s query whose state holds lists waiting for a shard (a set of ids)."""
        return self._k("rank-waiting", stream)

    def admission_waiting(self, stream: str, shard: int) -> str:
        """The subscriptions one shard of ``stream``'s query has not admitted yet (a set of ids; ``evaluator.admission``;
        written by ``evaluator.spark.waiting``, read by a subscription's page)."""
        return self._k("admission", "waiting", stream, shard)

    def alerts_stream_of(self, partition: int) -> str:
        """The alert stream of one partition (the dispatcher reads them all, in the ``notifier`` group)."""
        return self._p(partition, "alerts")

    @property
    def alerts_streams(self) -> list[str]:
        return [self.alerts_stream_of(n) for n in range(self.partitions)]

    @property
    def alerts_stream(self) -> str:
        """The alert stream, when there is one partition (the default)."""
        if self.partitions != 1:
            raise ValueError("the alert stream is partitioned: use alerts_stream_of(partition) or alerts_streams")
        return self.alerts_stream_of(0)

    def alerts_dead_of(self, partition: int) -> str:
        """Entries of a partition's stream the dispatcher could not read, with the reason (dead-lettered
        and acknowledged in one transaction, so in the stream's slot)."""
        return self._p(partition, "alerts", "dead")

    @property
    def alerts_dead(self) -> str:
        if self.partitions != 1:
            raise ValueError("the alert stream is partitioned: use alerts_dead_of(partition)")
        return self.alerts_dead_of(0)

    # What the sink's script prepends to a seen bucket or subscription id (the keys below, named inside the script).
    def seen_prefix(self, partition: int) -> str:
        return self._p(partition, "seen", "")

    def mark_prefix(self, partition: int) -> str:
        """One key per stored alert id: the dedupe marks of the sink before ``seen`` sets (2026-11-29). Never written
        now; read only by the first batch a sink runs, the one batch that can replay a batch they recorded."""
        return self._p(partition, "alert", "")

    def firing_prefix(self, partition: int) -> str:
        return self._p(partition, "firing", "")

    def history_prefix(self, partition: int) -> str:
        return self._p(partition, "history", "")

    def counters_prefix(self, partition: int) -> str:
        return self._p(partition, "counters", "")

    # -- per subscription --------------------------------------------------------------------------

    def seen(self, subscription_id: int, bucket: int) -> str:
        """The ids of the alerts the sink stored in the subscription's partition whose evaluation time is in
        ``bucket`` (:func:`seen_bucket`): what a replayed batch is checked against (``evaluator.spark.sink``)."""
        return self._s(subscription_id, "seen", bucket)

    def alert_mark(self, subscription_id: int, alert_id: str) -> str:
        return self._s(subscription_id, "alert", alert_id)

    def firing(self, subscription_id: int) -> str:
        return self._s(subscription_id, "firing", subscription_id)

    def history(self, subscription_id: int) -> str:
        return self._s(subscription_id, "history", subscription_id)

    def counters(self, subscription_id: int) -> str:
        return self._s(subscription_id, "counters", subscription_id)

    def delivery_log(self, subscription_id: int) -> str:
        return self._s(subscription_id, "deliveries", subscription_id)

    def key_states(self, subscription_id: int) -> str:
        return self._s(subscription_id, "policy", subscription_id)

    def decision(self, subscription_id: int, alert_id: str) -> str:
        return self._s(subscription_id, "decision", alert_id)

    def sequences(self, subscription_id: int) -> str:
        """Per key, the last sequence given to a notification of the key (``notifier.order``)."""
        return self._s(subscription_id, "sequence", subscription_id)

    def order_line(self, subscription_id: int, endpoint_id: int, key: str) -> str:
        """The notifications of one key not yet delivered to one endpoint, by sequence (``notifier.order``)."""
        return self._s(subscription_id, "order", subscription_id, endpoint_id, key)

    def order_state(self, subscription_id: int, endpoint_id: int, key: str) -> str:
        """That line's highest sequence let go, its members' next expected runs and a stalled head's signature."""
        return self._s(subscription_id, "order-state", subscription_id, endpoint_id, key)

    def order_wake(self, subscription_id: int, endpoint_id: int, notification_id: str) -> str:
        """The task of a delivery waiting in its lines, for the one ahead to wake it (the order scripts name
        others' from the prefix this is with an empty ``notification_id``)."""
        return self._s(subscription_id, "order-wake", subscription_id, endpoint_id, notification_id)

    # -- per delivery, endpoint, owner ---------------------------------------------------------------

    def _n(self, notification_id: str) -> str:
        return "{" + notification_id + "}" if self.tagged else notification_id

    def delivered(self, notification_id: str, endpoint_id: int) -> str:
        return self._k("delivered", self._n(notification_id), endpoint_id)

    def sending(self, notification_id: str, endpoint_id: int) -> str:
        return self._k("sending", self._n(notification_id), endpoint_id)

    def endpoint_log(self, endpoint_id: int) -> str:
        return self._k("deliveries", "endpoint", endpoint_id)

    def _o(self, owner_id: int) -> str:
        return "{" + self._k("owner", owner_id) + "}" if self.tagged else str(owner_id)

    def inflight_endpoint(self, owner_id: int, endpoint_id: int) -> str:
        """In the owner's slot: one script takes a slot of the endpoint and of its owner together."""
        return self._k("inflight", "endpoint", self._o(owner_id), endpoint_id) if self.tagged else \
            self._k("inflight", "endpoint", endpoint_id)

    def inflight_owner(self, owner_id: int) -> str:
        return self._k("inflight", "owner", self._o(owner_id))

    def attempt_time(self, owner_id: int, endpoint_id: int) -> str:
        """How long the endpoint's last attempt took; in the owner's slot, read by the script that takes slots."""
        return self._k("inflight", "took", self._o(owner_id), endpoint_id) if self.tagged else \
            self._k("inflight", "took", endpoint_id)

    def endpoint_turn(self, owner_id: int, endpoint_id: int) -> str:
        """The last turn handed to a delivery that found the endpoint full; in the owner's slot, like the above."""
        return self._k("inflight", "turn", self._o(owner_id), endpoint_id) if self.tagged else \
            self._k("inflight", "turn", endpoint_id)

    def handoff(self, stream: str) -> str:
        """The ids of a query's handoff pieces, oldest first (``evaluator.spark.handoff``); each piece is at
        :meth:`handoff_piece`, in this list's slot (one script pops both)."""
        name = self._k("handoff", stream)
        return "{" + name + "}" if self.tagged else name

    def handoff_piece(self, stream: str, piece_id: str) -> str:
        return f"{self.handoff(stream)}:{piece_id}"

    def backtest(self, owner_id: int, job_id: str) -> str:
        """A backtest job's hash, in its owner's slot with :meth:`backtests_active` (one transaction admits a job)."""
        return self._k("backtest", self._o(owner_id), job_id)

    def backtests_active(self, owner_id: int) -> str:
        """The owner's queued and running backtests (job ids)."""
        return self._k("backtests", "active", self._o(owner_id))

    def preview_answers(self, request_id: str) -> str:
        return self._k("preview", request_id)

    def flash(self, web_session_id: str) -> str:
        return self._k("flash", web_session_id)


class LayoutMismatch(RuntimeError):
    """This process's key layout is not the one the deployment's alerts are written in."""


def layout_of(keys: RedisKeys) -> str:
    return f"partitions={keys.partitions};tagged={int(keys.tagged)}"


def claim_layout(client: Any, keys: RedisKeys) -> None:
    """Record the key layout on first use, and refuse to start in another one.

    The sink writes a subscription's alerts to its partition's stream and the dispatcher reads the
    streams its own ``TOCSIN_REDIS_PARTITIONS`` names: a sink and a dispatcher configured apart (or a
    setting changed on a running deployment) would leave streams nobody reads, so alerts would be
    silently lost. Both call this at start-up; the first records the layout, a different one stops.
    """
    mine = layout_of(keys)
    client.set(keys.layout, mine, nx=True)
    recorded = client.get(keys.layout)
    recorded = recorded.decode() if isinstance(recorded, bytes) else recorded
    if recorded is not None and recorded != mine:
        raise LayoutMismatch(
            f"Redis holds this deployment's alerts in the layout {recorded!r} ({keys.layout}), but this process "
            f"is configured for {mine!r} (TOCSIN_REDIS_PARTITIONS / TOCSIN_REDIS_CLUSTER): alerts written in one "
            f"would never be read in the other. Set them back, or drain the alert streams and delete {keys.layout} "
            f"to change the layout (docs/redis.md)")
