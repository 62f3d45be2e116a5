"""Dependencies injected into routes: settings, database session, Redis, services."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

import redis
from celery import Celery
from fastapi import Depends, Request
from sqlalchemy.orm import Session

from infra.redis_schema import RedisKeys
from infra.settings import Settings
from notifier.deliveries import DeliveryRecords
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


def get_celery(request: Request) -> Celery:
    return request.app.state.celery


def get_records(
    redis_client: Annotated[redis.Redis, Depends(get_redis)],
    settings: Annotated[Settings, Depends(get_settings)],
) -> DeliveryRecords:
    return DeliveryRecords(redis_client, RedisKeys(settings))


def get_service(
    session: Annotated[Session, Depends(get_db)],
    settings: Annotated[Settings, Depends(get_settings)],
    redis_client: Annotated[redis.Redis, Depends(get_redis)],
) -> SubscriptionService:
    return SubscriptionService(session, settings, redis_client)


SettingsDep = Annotated[Settings, Depends(get_settings)]
RedisDep = Annotated[redis.Redis, Depends(get_redis)]
ServiceDep = Annotated[SubscriptionService, Depends(get_service)]
CeleryDep = Annotated[Celery, Depends(get_celery)]
RecordsDep = Annotated[DeliveryRecords, Depends(get_records)]
