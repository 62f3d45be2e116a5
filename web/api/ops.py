"""The operators' view of the platform: evaluator load, pipeline samples over time."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query
from sqlalchemy import func, select

from subscriptions.models import Subscription, User
from web.deps import DbDep, RedisDep, SettingsDep, get_operator
from web.ops import samples, subscription_load

router = APIRouter(prefix="/api/ops", tags=["operations"], dependencies=[Depends(get_operator)])


@router.get("/overview")
def overview(session: DbDep, redis_client: RedisDep, settings: SettingsDep) -> dict:
    """Subscriptions by (aggregate, attribute, window) across users, and the newest pipeline sample."""
    latest = samples(redis_client, settings, limit=1)
    return {
        "users": session.scalar(select(func.count()).select_from(User)),
        "subscriptions": session.scalar(select(func.count()).select_from(Subscription)),
        "load": subscription_load(session),
        "latest": latest[0] if latest else None,
    }


@router.get("/samples")
def pipeline_samples(redis_client: RedisDep, settings: SettingsDep,
                     limit: Annotated[int, Query(ge=1, le=10_000)] = 300) -> list[dict]:
    """Oldest first: input rate, evaluator rate and batch time, Kafka lag, CI candidates vs matches,
    Celery queue depth, delivery success rate and dead letters, one sample per ``dashboard_sample_s``."""
    return samples(redis_client, settings, limit)
