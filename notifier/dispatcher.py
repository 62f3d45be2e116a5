"""Turns transitions in the Redis alert stream into delivery tasks.

Reads the stream in a consumer group, so every transition is handed out once and
stays pending until acknowledged: an entry is acknowledged only after its tasks
are enqueued, and a restarted dispatcher first re-handles what it left pending.
A redelivered entry may enqueue a task twice; the task itself de-duplicates.
"""

from __future__ import annotations

import json
import signal
import time

import redis
import structlog
from prometheus_client import Counter
from sqlalchemy.orm import Session

from infra.logs import configure_logging
from infra.metrics import serve_metrics
from infra.redis_schema import NOTIFIER_GROUP, RedisKeys
from infra.settings import Settings, get_settings
from subscriptions.db import session_factory
from subscriptions.models import Subscription

log = structlog.get_logger("dispatcher")

DISPATCHED = Counter("tocsin_dispatched_total", "Transitions turned into delivery tasks", ["outcome"])


class Dispatcher:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.keys = RedisKeys(settings)
        self.redis = redis.Redis.from_url(settings.redis_url, decode_responses=True)
        self.sessions = session_factory(settings.database_url)
        self.running = True
        try:
            self.redis.xgroup_create(self.keys.alerts_stream, NOTIFIER_GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def handle(self, session: Session, alert: dict) -> int:
        from notifier.tasks import deliver_webhook

        subscription = session.get(Subscription, alert["subscription_id"])
        if subscription is None:
            DISPATCHED.labels("no_subscription").inc()
            return 0
        payload = {**alert, "subscription_name": subscription.name, "condition": subscription.condition}
        for endpoint in subscription.endpoints:
            deliver_webhook.apply_async((payload, endpoint.id))
        DISPATCHED.labels("enqueued" if subscription.endpoints else "no_endpoint").inc()
        return len(subscription.endpoints)

    def run_once(self, block_ms: int | None = None, pending: bool = False) -> int:
        """Dispatch one read's worth of entries; ``pending`` re-reads this consumer's unacknowledged ones."""
        response = self.redis.xreadgroup(
            NOTIFIER_GROUP,
            self.settings.dispatcher_consumer,
            {self.keys.alerts_stream: "0" if pending else ">"},
            count=500,
            block=None if pending else (block_ms if block_ms is not None else self.settings.dispatcher_block_ms),
        )
        handled = 0
        with self.sessions() as session:
            for _stream, entries in response or []:
                for entry_id, fields in entries:
                    self.handle(session, json.loads(fields["alert"]))
                    self.redis.xack(self.keys.alerts_stream, NOTIFIER_GROUP, entry_id)
                    handled += 1
        return handled

    def run(self) -> None:
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "running", False))
        while self.run_once(pending=True):
            pass
        log.info("dispatcher_started", stream=self.keys.alerts_stream)
        while self.running:
            try:
                self.run_once()
            except redis.ConnectionError as exc:
                log.warning("redis_unavailable", error=str(exc))
                time.sleep(1)


def main() -> None:
    configure_logging()
    settings = get_settings()
    serve_metrics(settings.metrics_port_dispatcher)
    try:
        Dispatcher(settings).run()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
