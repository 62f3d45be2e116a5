"""Subscribers hear when their stream's evaluation goes stale, and when it is fresh again.

A silent subscription cannot tell "nothing crossed" from "nothing was evaluated". So when the
dead man's switch (``web.watchdog``) judges a stream's evaluation stale, each active
subscription on that stream gets one ``stale`` notice at each of its endpoints, and one
``stale_resolved`` notice when the evaluation is fresh again
(``notifier.notification.stale_notice``). A stream is stale while:

- ``down`` fires: the evaluator driver is gone, so every stream (``trades`` and each declared one);
- ``stalled`` fires: the built-in ``trades`` query's clock stands while records arrive;
- the ``stream`` rule names it: its own query stalled or keeps failing.

The streams told stale are kept in Redis (``ops:stale``) and diffed like incidents
(``web.watchdog.changes``), so a stale period sends its two notices once, not one per
sample; the notices' ids derive from the subscription, stream, start and state, so a
notice queued twice (a crash between queueing and recording) is delivered once.
"""

from __future__ import annotations

import json

import redis
import structlog
from celery import Celery

from core.redis_replies import text_hash
from core.redis_schema import RedisKeys
from core.settings import Settings
from core.stream_names import TRADES
from notifier.deliveries import binding, enqueue
from notifier.notification import STALE, STALE_RESOLVED, stale_notice
from notifier.outbox import Outbox
from subscriptions.db import session_scope
from subscriptions.paging import routes_on_streams
from web.watchdog import RuleStatus, changes, stream_findings

log = structlog.get_logger("watchdog")


def stale_streams(samples: list[dict], starts: list[float], statuses: dict[str, RuleStatus], settings: Settings,
                  now: float) -> dict[str, RuleStatus]:
    """The streams whose evaluation is stale now, each with since when and why."""
    names = {TRADES, *((samples[-1].get("streams") or {}) if samples else {})}
    found: dict[str, RuleStatus] = {}
    down, stalled = statuses["down"], statuses["stalled"]
    if down.firing:
        found = {name: RuleStatus(True, down.since, f"the evaluator is down: {down.detail}") for name in names}
    elif stalled.firing:
        found[TRADES] = RuleStatus(True, stalled.since, stalled.detail)
    for name, (since, detail) in stream_findings(samples, starts, settings, now).items():
        found.setdefault(name, RuleStatus(True, since, detail))
    return found


def told_stale(client: redis.Redis, settings: Settings) -> dict[str, dict]:
    """The streams whose subscribers were told ``stale`` and not yet its end: ``{stream: {"since", "detail"}}``."""
    return {name: json.loads(v) for name, v in text_hash(client.hgetall(RedisKeys(settings).stale_notices)).items()}


def announce(settings: Settings, client: redis.Redis, samples: list[dict], starts: list[float],
             statuses: dict[str, RuleStatus], celery: Celery | None, now: float) -> None:
    """Tell the subscribers of each stream that went stale or fresh since the last sample, then record it."""
    keys = RedisKeys(settings)
    before = told_stale(client, settings)
    stale = stale_streams(samples, starts, statuses, settings, now)
    after, news = changes(before, {name: stale.get(name, RuleStatus(False)) for name in {*before, *stale}}, now)
    if news and celery is not None:  # enqueued before the change is recorded (see web.watchdog.watch)
        with session_scope(settings.database_url) as session:
            routes = routes_on_streams(session, {name for name, _, _ in news})
        outbox = Outbox(client, keys, settings)
        for name, state, period in news:
            log.warning("stream_stale" if state == "firing" else "stream_fresh", stream=name, since=period["since"],
                        subscriptions=len(routes.get(name, [])), detail=period.get("detail"))
            for route in routes.get(name, []):
                notice = stale_notice({"id": route.subscription_id, "name": route.name, "condition": route.condition},
                                      name, STALE if state == "firing" else STALE_RESOLVED, period["since"],
                                      period.get("detail", ""), now).to_json()
                for endpoint in route.endpoints:
                    enqueue(celery, outbox, notice, endpoint.id, binding(endpoint))
    pipe = client.pipeline()
    pipe.delete(keys.stale_notices)
    if after:
        pipe.hset(keys.stale_notices, mapping={name: json.dumps(period) for name, period in after.items()})
    pipe.execute()
