"""Where things live in Redis, in one place for every writer and reader.

- ``subscriptions:version`` / ``subscriptions:snapshot``: the active catalog the
  evaluator loads (written by the subscriptions service);
- ``alerts``: a Stream of transitions (written by the evaluator sink, consumed by
  the notifier's dispatcher in the ``notifier`` group);
- ``alert:<id>``: de-duplication marks, so a replayed micro-batch adds nothing;
- ``firing:<subscription>``: a hash key -> latest firing transition;
- ``counters:<subscription>`` and ``stats:evaluator``: counters for dashboards;
- ``policy:<subscription>``: per key, what the subscriber was last told, and
  ``decision:<alert>``: what the alert policy decided for a transition, so that a
  re-handled transition is decided the same way (see ``notifier.dispatcher``);
- ``deliveries:*`` and ``delivered:*``: see ``notifier.deliveries``.
"""

from __future__ import annotations

from infra.settings import Settings

NOTIFIER_GROUP = "notifier"


class RedisKeys:
    def __init__(self, settings: Settings) -> None:
        k = settings.redis_key
        self.catalog_version = k("subscriptions", "version")
        self.catalog_snapshot = k("subscriptions", "snapshot")
        self.alerts_stream = k("alerts")
        self.evaluator_stats = k("stats", "evaluator")
        self.delivery_stats = k("stats", "delivery")
        self.dead_letters = k("deliveries", "dead")
        self._k = k

    def alert_mark(self, alert_id: str) -> str:
        return self._k("alert", alert_id)

    def firing(self, subscription_id: int) -> str:
        return self._k("firing", subscription_id)

    def counters(self, subscription_id: int) -> str:
        return self._k("counters", subscription_id)

    def delivery_log(self, subscription_id: int) -> str:
        return self._k("deliveries", subscription_id)

    def delivered(self, notification_id: str, endpoint_id: int) -> str:
        return self._k("delivered", notification_id, endpoint_id)

    def sending(self, notification_id: str, endpoint_id: int) -> str:
        return self._k("sending", notification_id, endpoint_id)

    def key_states(self, subscription_id: int) -> str:
        return self._k("policy", subscription_id)

    def decision(self, alert_id: str) -> str:
        return self._k("decision", alert_id)
