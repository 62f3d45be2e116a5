"""Dependencies injected into routes: settings, database session, Redis, services."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

import redis
from fastapi import Depends, Request
from sqlalchemy.orm import Session

from infra.settings import Settings
from subscriptions.db import session_factory
from subscriptions.service import SubscriptionService


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_db(settings: Annotated[Settings, Depends(get_settings)]) -> Iterator[Session]:
    session = session_factory(settings.database_url)()
    try:
        yield session
    finally:
        session.close()


def get_redis(request: Request) -> redis.Redis:
    return request.app.state.redis


def get_service(
    session: Annotated[Session, Depends(get_db)],
    settings: Annotated[Settings, Depends(get_settings)],
    redis_client: Annotated[redis.Redis, Depends(get_redis)],
) -> SubscriptionService:
    return SubscriptionService(session, settings, redis_client)


SettingsDep = Annotated[Settings, Depends(get_settings)]
RedisDep = Annotated[redis.Redis, Depends(get_redis)]
ServiceDep = Annotated[SubscriptionService, Depends(get_service)]
