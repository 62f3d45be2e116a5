"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from core.evaluator_status import evaluator_status
from core.redis_outage import is_transient
from core.redis_replies import text_hash
from core.redis_schema import RedisKeys
from core.settings import Settings
from ingest.kafka import topic_end_offsets
from subscriptions.db import engine_for
from web.deps import RedisDep, SettingsDep, web_pool
from web.ops import STREAM_PROBE_TIMEOUT_S

router = APIRouter(tags=["operations"])


@router.get("/healthz")
def healthz() -> dict:
    """The process answers."""
    return {"status": "ok"}


def _check_database(settings: Settings) -> None:
    with engine_for(settings.database_url, web_pool(settings)).connect() as connection:
        connection.execute(text("select 1"))


def _check_stream(settings: Settings) -> None:
    """The broker answers and the event topic exists."""
    topic_end_offsets(settings, settings.events_topic, timeout_s=STREAM_PROBE_TIMEOUT_S, wait_for_topic=False)


@router.get("/readyz")
async def readyz(request: Request, settings: SettingsDep, redis_client: RedisDep, response: Response) -> dict:
    """Database, Redis and the event stream answer, and the evaluator is evaluating: it has evaluated a batch
    since it started and its heartbeat is fresh (503 naming the failing check otherwise)."""
    checks: dict[str, str] = {}
    evaluator: dict | None = None
    stats: dict = {}
    # Redis answers a keyed read, not only PING: a cluster that lost a primary still answers PING on every live
    # node while refusing every key (CLUSTERDOWN).
    for name, check in (("database", lambda: _check_database(settings)),
                        ("redis", lambda: stats.update(redis_client.hgetall(RedisKeys(settings).evaluator_stats))),
                        ("stream", lambda: _check_stream(settings))):
        try:
            await run_in_threadpool(check)
            checks[name] = "ok"
        except Exception as exc:  # noqa: BLE001 - any failure means not ready
            checks[name] = f"error: {exc}"
            if name == "redis" and is_transient(exc):
                request.app.state.redis_outage.failed(exc)
    if checks["redis"] == "ok":
        request.app.state.redis_outage.recovered()
        status = evaluator_status(text_hash(stats), settings, time.time())
        checks["evaluator"] = "ok" if status.ready else f"{status.state}: {status.reason}"
        evaluator = status.as_dict()
    else:
        checks["evaluator"] = "unknown: Redis does not answer"
    ready = all(v == "ok" for v in checks.values())
    response.status_code = 200 if ready else 503
    return {"status": "ready" if ready else "not ready", "checks": checks, "evaluator": evaluator}


@router.get("/metrics", include_in_schema=False)
def metrics() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
