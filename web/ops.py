"""What operators watch: samples of the pipeline's health over time, and the evaluator's load.

One web process at a time (a Redis lock per period) samples every
``dashboard_sample_s``: Kafka log ends against what the evaluator has read (lag,
input rate), the evaluator's micro-batch time and its candidates against exact
matches, the Celery queue, delivery outcomes and dead letters; and per declared stream
(``streams``) its query's slowest shard clock against its topic's log ends, and its
query's start and failures as the evaluator's stream supervisor records them. Samples go to a
capped Redis list the dashboard charts read, so every web process shows the same.
The sampling process then lets the dead man's switch judge the samples
(``web.watchdog``). Log ends come over one long-lived Kafka client per process and topic.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import defaultdict
from dataclasses import asdict, replace
from typing import Any

import redis
import structlog
from celery import Celery
from fastapi.concurrency import run_in_threadpool
from prometheus_client import Gauge
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.clock_ahead import recent as recent_clock_ahead
from core.evaluator_status import CATALOG_STUCK, CATALOG_STUCK_SINCE
from core.redis_client import broker_client
from core.redis_replies import text_hash
from core.redis_schema import (
    HANDOFF_STORED,
    HANDOFF_WAITING,
    QUERY_FAILING,
    QUERY_STARTED_AT,
    RedisKeys,
    admission_waiting,
    celery_queue_keys,
    handoff_counts,
    shard_clocks,
    stream_stat,
)
from core.settings import Settings
from core.stream_names import TRADES
from core.streams import topic_name
from evaluator.catalog import Catalog
from evaluator.shard import group_subscriptions
from evaluator.spec import Aggregate, Condition, SubscriptionSpec
from ingest.kafka import topic_end_offsets
from subscriptions.language import format_duration, format_expr, format_filters
from subscriptions.models import Subscription
from web import stale, watchdog
from web.watchdog import STREAM_COUNTERS

log = structlog.get_logger("ops")

STREAM_PROBE_TIMEOUT_S = 2.0  # how long asking the broker for log ends may take (dashboards, readiness)

#: The newest sample as Prometheus gauges, in the web process that takes samples.
SAMPLED = {name: Gauge(f"tocsin_{name}", text) for name, text in {
    "kafka_lag_records": "Event records in Kafka the evaluator has not read",
    "celery_queued_deliveries": "Deliveries waiting in the Celery queue",
    "celery_unacked_deliveries": "Deliveries held by workers (running or waiting to retry)",
    "dead_letters": "Deliveries that failed for good, waiting for an operator",
}.items()}


_probe_lock = threading.Lock()


def log_ends(settings: Settings, topic: str | None = None) -> dict[int, int]:
    """A topic's log ends (the event topic's by default), over a client of its own: none is kept between questions
    (``LogEndProbe``: a kept one crashed the process when its topic was deleted and created again)."""
    with _probe_lock:  # one question at a time: wait_for_probe waits for the one under way
        return topic_end_offsets(settings, topic or settings.events_topic, STREAM_PROBE_TIMEOUT_S, wait_for_topic=False)


def wait_for_probe() -> None:
    """Wait for the log-end question under way, if any (the web app's shutdown): the sampler's thread outlives a
    shutdown that does not wait, and in one process (the tests) it then opened databases of apps long gone beside
    new ones (Alembic is not thread-safe). A question is bounded by ``STREAM_PROBE_TIMEOUT_S``, its first connection
    included."""
    with _probe_lock:
        pass


def _number(raw: dict[str, str], name: str) -> float:
    try:
        return float(raw.get(name, 0) or 0)
    except ValueError:
        return 0.0


def _json_field(raw: dict[str, str], name: str) -> dict | None:
    try:
        value = json.loads(raw[name])
    except (KeyError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def stream_samples(settings: Settings, client: redis.Redis, evaluator: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Per declared stream (``trades`` aside: the sample's own fields are its), for the dead man's switch: the
    slowest shard clock of its query, its topic's log end (None when Kafka did not answer), and, when the
    evaluator's stream supervisor recorded them, when its query last started and its failures in a row."""
    declared = sorted(name for name in text_hash(client.hgetall(RedisKeys(settings).stream_schemas)) if name != TRADES)
    streams: dict[str, dict[str, Any]] = {}
    for name in declared:
        topic = topic_name(name, settings)
        try:
            log_end: int | None = sum(log_ends(settings, topic).values())
        except Exception:  # noqa: BLE001 - unknown this time (the rules read a missing log end as no news)
            log_end = None
        stream: dict[str, Any] = {"clock": min(shard_clocks(evaluator, name), default=None), "log_end": log_end}
        started = _number(evaluator, stream_stat(name, QUERY_STARTED_AT))
        if started:
            stream["started_at"] = started
        failing = _json_field(evaluator, stream_stat(name, QUERY_FAILING))
        if failing:
            stream["failing"] = failing
        streams[name] = stream
    return streams


def collect_sample(settings: Settings, client: redis.Redis, previous: dict | None) -> dict[str, Any]:
    """One sample; rates are taken against ``previous``."""
    keys = RedisKeys(settings)
    now = time.time()
    evaluator = text_hash(client.hgetall(keys.evaluator_stats))
    deliveries = text_hash(client.hgetall(keys.delivery_stats))
    queue, unacked = celery_queue_keys(settings)
    broker = broker_client(settings) if settings.broker_url != settings.redis_url else client  # Celery's own Redis
    waiting, stored = handoff_counts(evaluator, HANDOFF_WAITING), handoff_counts(evaluator, HANDOFF_STORED)
    sample: dict[str, Any] = {
        "t": round(now, 3),
        "batch_ms": round(_number(evaluator, "batch_seconds") * 1000, 1),
        "batch_id": int(_number(evaluator, "last_batch_id")),
        "last_batch_at": _number(evaluator, "last_batch_at") or None,
        "candidates": _number(evaluator, "candidates"),
        "matches": _number(evaluator, "matches"),
        "transitions": _number(evaluator, "transitions"),
        # new subscriptions the shards have not admitted yet (evaluator/admission.py), every stream's
        "admission_waiting": sum(admission_waiting(evaluator).values()),
        # evaluated transitions a sink handed over to be stored after their batch (evaluator/spark/handoff.py); per
        # stream with a total of those it stored since, the dead man's switch's progress signal
        "handoff_waiting": sum(waiting.values()),
        "handoff": {stream: [held, stored.get(stream, 0)] for stream, held in waiting.items()},
        "queued": broker.llen(queue),
        "unacked": broker.hlen(unacked),
        "dead_letters": client.hlen(keys.dead_letters),
        # for the dead man's switch (web.watchdog): the slowest shard's clock, the driver's heartbeat, refusals
        "clock": min(shard_clocks(evaluator), default=None),
        "heartbeat_at": _number(evaluator, "driver_heartbeat_at") or None,
        "catalog_stuck_since": _number(evaluator, CATALOG_STUCK_SINCE) or None,
        "catalog_stuck": _json_field(evaluator, CATALOG_STUCK),
        **{name: _number(evaluator, name) for name in STREAM_COUNTERS},
        **{outcome: _number(deliveries, outcome) for outcome in ("delivered", "retry", "dead", "suppressed")},
    }
    read = json.loads(evaluator.get("source_offsets") or "{}")
    sample["read"] = sum(int(v) for v in read.values())
    try:
        ends = log_ends(settings)
        sample["log_end"] = sum(ends.values())
        sample["lag"] = sum(max(end - int(read.get(str(p), 0)), 0) for p, end in ends.items())
        sample["kafka"] = "ok"
    except Exception as exc:  # noqa: BLE001 - the dashboard shows the broker as unreachable
        sample.update(log_end=None, lag=None, kafka=f"error: {exc}")
    sample["streams"] = stream_samples(settings, client, evaluator)
    sample["clock_ahead"] = [asdict(m) for m in recent_clock_ahead(client, keys, settings.watchdog_window_s, now)]
    if previous:
        dt = max(now - previous["t"], 1e-3)

        def rate(name: str) -> float | None:
            if sample.get(name) is None or previous.get(name) is None:
                return None
            return round(max(sample[name] - previous[name], 0) / dt, 2)

        sample["input_rate"] = rate("log_end")
        sample["evaluated_rate"] = rate("read")
        sample["candidate_rate"] = rate("candidates")
        sample["match_rate"] = rate("matches")
        done = {o: max(sample[o] - previous.get(o, 0), 0) for o in ("delivered", "retry", "dead")}
        attempts = sum(done.values())
        sample["success_rate"] = round(done["delivered"] / attempts, 4) if attempts else None
    return sample


def samples(client: redis.Redis, settings: Settings, limit: int | None = None) -> list[dict]:
    key = RedisKeys(settings).ops_samples
    return [json.loads(s) for s in client.lrange(key, -(limit or settings.dashboard_history), -1)]


def sample_once(settings: Settings, client: redis.Redis, celery: Celery | None = None) -> dict | None:
    """Take a sample unless another web process took this period's, and let the dead man's switch judge
    the history (notifying through ``celery`` when given); returns the sample."""
    keys = RedisKeys(settings)
    if not client.set(keys.ops_sampler_lock, "1", nx=True, px=int(settings.dashboard_sample_s * 900)):
        return None
    last = client.lindex(keys.ops_samples, -1)
    sample = collect_sample(settings, client, json.loads(last) if last else None)
    for gauge, field in (("kafka_lag_records", "lag"), ("celery_queued_deliveries", "queued"),
                         ("celery_unacked_deliveries", "unacked"), ("dead_letters", "dead_letters")):
        if sample.get(field) is not None:
            SAMPLED[gauge].set(sample[field])
    pipe = client.pipeline()
    pipe.rpush(keys.ops_samples, json.dumps(sample, separators=(",", ":")))
    pipe.ltrim(keys.ops_samples, -settings.dashboard_history, -1)
    pipe.execute()
    history, now = samples(client, settings, watchdog.samples_needed(settings)), time.time()
    statuses = watchdog.watch(settings, client, history, celery, now)
    stale.announce(settings, client, history, watchdog.job_starts(client, settings), statuses, celery, now)
    return sample


def refresh_gauges(settings: Settings, client: redis.Redis) -> None:
    """Every web process serves the dead man's switch and the stream counters on its ``/metrics``."""
    last = client.lindex(RedisKeys(settings).ops_samples, -1)
    watchdog.refresh_gauges(watchdog.open_incidents(client, settings), json.loads(last) if last else None)


async def run_sampler(settings: Settings, client: redis.Redis, celery: Celery | None = None) -> None:
    """Every sampling period: take the sample and let the dead man's switch judge it (``TOCSIN_WEB_SAMPLER``; one
    process a period, under the sampler lock), then refresh this process's gauges, which every web process serves."""
    if not settings.web_sampler:
        log.warning("web_sampler_off", detail="this web process runs no dead man's switch: keep TOCSIN_WEB_SAMPLER on "
                                              "in at least one, or nothing pages when evaluation stops")
    while True:
        try:
            if settings.web_sampler:
                await run_in_threadpool(sample_once, settings, client, celery)
            await run_in_threadpool(refresh_gauges, settings, client)
        except Exception as exc:  # noqa: BLE001 - sampling must not take the web app down
            log.warning("ops_sample_failed", error=str(exc))
        await asyncio.sleep(settings.dashboard_sample_s)


def _value_text(condition: Condition) -> str:
    """What a group computes per key, as the condition language writes it."""
    if condition.aggregate is Aggregate.EXPR:
        text = format_expr(condition.computes)
        return f"{text} as % of LAST({condition.percent_of})" if condition.percent_of else text
    return format_expr(condition.terms[0])


def subscription_load(session: Session) -> list[dict[str, Any]]:
    """Subscriptions of every user in the groups the evaluator answers with one shared lookup each
    (``evaluator.shard.group_subscriptions``: by the value they need per key), per stream and dimension filter
    (a substream: subscriptions on different ones never share a group), paused ones counted apart."""
    substreams: dict[tuple[str, str], list[SubscriptionSpec]] = defaultdict(list)
    active: set[int] = set()
    for sid, spec, is_active in session.execute(
            select(Subscription.id, Subscription.condition_spec, Subscription.active)):
        condition = Condition.from_dict(spec)
        substreams[condition.stream, condition.view].append(SubscriptionSpec(sid, condition))
        if is_active:
            active.add(sid)
    load = []
    for (stream, _), specs in substreams.items():
        for group in group_subscriptions(Catalog(0, tuple(specs))):
            c = group.template
            running = sum(1 for s in group.specs if s.id in active)
            load.append({"stream": stream, "filter": format_filters(replace(c, key_prefix=None)).removeprefix(" "),
                         "aggregate": c.aggregate.value, "attribute": c.attribute or "*", "value": _value_text(c),
                         "window_ms": c.window_ms, "window": format_duration(c.window_ms),
                         "active": running, "paused": len(group.specs) - running})
    return sorted(load, key=lambda g: (g["stream"], -g["active"], g["value"], g["window_ms"], g["filter"]))


def stream_load(load: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The load table's totals per stream: groups, active and paused subscriptions."""
    totals: dict[str, dict[str, Any]] = {}
    for g in load:
        row = totals.setdefault(g["stream"], {"stream": g["stream"], "groups": 0, "active": 0, "paused": 0})
        row["groups"] += 1
        row["active"] += g["active"]
        row["paused"] += g["paused"]
    return sorted(totals.values(), key=lambda r: r["stream"])
