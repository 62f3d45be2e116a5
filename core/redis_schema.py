"""Where things live in Redis, in one place for every writer and reader.

- ``subscriptions:version``: the newest catalog version published; ``subscriptions:changes``:
  a Stream of the catalog's changes, entry id ``<version>-0``, so stream order is version order;
  ``subscriptions:snapshot`` / ``subscriptions:snapshot-version``: the whole catalog at some
  version the change log reaches back to, for new or lagging readers (see ``core.catalog_log``;
  written by the subscriptions service, read by the evaluator);
- ``alerts``: a Stream of transitions (written by the evaluator sink, consumed by
  the notifier's dispatcher in the ``notifier`` group);
- ``alerts:dead``: stream entries the dispatcher could not read as a transition, with the reason;
- ``alert:<id>``: de-duplication marks, so a replayed micro-batch adds nothing;
- ``firing:<subscription>``: a hash key -> latest firing transition;
- ``history:<subscription>``: a Stream of the subscription's newest transitions
  (``HISTORY_LENGTH``), for its alert history;
- ``counters:<subscription>`` and ``stats:evaluator``: counters for dashboards;
- ``policy:<subscription>``: per key, what the subscriber was last told, and
  ``decision:<alert>``: what the alert policy decided for a transition, so that a
  re-handled transition is decided the same way (see ``notifier.dispatcher``);
- ``deliveries:*``, ``delivered:*``, ``sending:*`` and ``inflight:*``: see ``notifier.deliveries``;
- ``celery:*``: the Celery broker's keys, among them each delivery lane's queue
  (:func:`lane_queue`, :func:`celery_queue_keys`; see ``notifier.app``);
- ``ops:samples``: the operators' dashboard samples (see ``web.ops``), and
  ``ops:watchdog``: the dead man's switch's open incidents (see ``web.watchdog``);
- ``evaluator:starts``: when the evaluator job last started (newest first);
- ``previews`` and ``preview:<request>``: condition previews asked of the
  evaluator's shards and their answers (see ``web.conditions``);
- ``rate:*``: rate-limit and sign-in lock-out counters (see ``web.limits``);
- ``flash:<session>``: a secret to show once on the next page (see ``web.pages.common``).
"""

from __future__ import annotations

from core.settings import Settings

NOTIFIER_GROUP = "notifier"
HISTORY_LENGTH = 10_000  # transitions kept per subscription for its alert history


LANES = ("alerts", "tests")  # the delivery lanes, each a Celery queue of its own (see ``notifier.app``)


def lane_queue(settings: Settings, lane: str) -> str:
    """The broker queue of a delivery lane."""
    if lane not in LANES:
        raise ValueError(f"unknown delivery lane {lane!r}; lanes: {', '.join(LANES)}")
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


def shard_clocks(stats: dict[str, str]) -> list[int]:
    """Every shard's last evaluated boundary, from the ``stats:evaluator`` hash."""
    return [int(v) for k, v in stats.items() if k.startswith("shard_") and k.endswith("_evaluated_at")]


class RedisKeys:
    def __init__(self, settings: Settings) -> None:
        k = settings.redis_key
        self.catalog_version = k("subscriptions", "version")
        self.catalog_snapshot = k("subscriptions", "snapshot")
        self.catalog_snapshot_version = k("subscriptions", "snapshot-version")
        self.catalog_changes = k("subscriptions", "changes")
        self.alerts_stream = k("alerts")
        self.alerts_dead = k("alerts", "dead")  # stream entries the dispatcher could not read, with the reason
        self.evaluator_stats = k("stats", "evaluator")
        self.delivery_stats = k("stats", "delivery")
        self.dead_letters = k("deliveries", "dead")
        self.ops_samples = k("ops", "samples")
        self.previews = k("previews")
        self.ops_sampler_lock = k("ops", "sampler-lock")
        self.rate_limits = k("rate")  # the prefix of the `limits` library's counters
        self.evaluator_starts = k("evaluator", "starts")
        self.watchdog_state = k("ops", "watchdog")
        self._k = k
        # What the sink's script prepends to a subscription id (the keys below, named inside the script).
        self.firing_prefix = k("firing", "")
        self.history_prefix = k("history", "")
        self.counters_prefix = k("counters", "")

    def alert_mark(self, alert_id: str) -> str:
        return self._k("alert", alert_id)

    def firing(self, subscription_id: int) -> str:
        return self._k("firing", subscription_id)

    def history(self, subscription_id: int) -> str:
        return self._k("history", subscription_id)

    def counters(self, subscription_id: int) -> str:
        return self._k("counters", subscription_id)

    def delivery_log(self, subscription_id: int) -> str:
        return self._k("deliveries", subscription_id)

    def endpoint_log(self, endpoint_id: int) -> str:
        return self._k("deliveries", "endpoint", endpoint_id)

    def delivered(self, notification_id: str, endpoint_id: int) -> str:
        return self._k("delivered", notification_id, endpoint_id)

    def sending(self, notification_id: str, endpoint_id: int) -> str:
        return self._k("sending", notification_id, endpoint_id)

    def inflight_endpoint(self, endpoint_id: int) -> str:
        return self._k("inflight", "endpoint", endpoint_id)

    def inflight_owner(self, owner_id: int) -> str:
        return self._k("inflight", "owner", owner_id)

    def key_states(self, subscription_id: int) -> str:
        return self._k("policy", subscription_id)

    def preview_answers(self, request_id: str) -> str:
        return self._k("preview", request_id)

    def flash(self, web_session_id: str) -> str:
        return self._k("flash", web_session_id)

    def decision(self, alert_id: str) -> str:
        return self._k("decision", alert_id)
