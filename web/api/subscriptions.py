"""Subscription CRUD, pause/resume, and the keys currently firing."""

from __future__ import annotations

import json

from typing import Annotated

from fastapi import APIRouter, Query, Response, status

from infra.redis_schema import RedisKeys
from notifier.deliveries import ATTEMPT_LOG_LENGTH
from subscriptions.models import Subscription
from subscriptions.schemas import MuteIn, SubscriptionIn, SubscriptionOut
from web.deps import RecordsDep, RedisDep, ServiceDep, SettingsDep

router = APIRouter(prefix="/api/subscriptions", tags=["subscriptions"])


def _out(subscription: Subscription) -> SubscriptionOut:
    return SubscriptionOut.model_validate(
        {
            **{c: getattr(subscription, c) for c in ("id", "name", "condition", "keys", "active")},
            "endpoint_ids": sorted(e.id for e in subscription.endpoints),
            "policy": subscription.policy or {},
            "created_at": subscription.created_at,
            "updated_at": subscription.updated_at,
        }
    )


@router.post("", status_code=status.HTTP_201_CREATED, response_model=SubscriptionOut)
def create_subscription(data: SubscriptionIn, service: ServiceDep) -> SubscriptionOut:
    return _out(service.create(data))


@router.get("", response_model=list[SubscriptionOut])
def list_subscriptions(service: ServiceDep) -> list[SubscriptionOut]:
    return [_out(s) for s in service.list()]


@router.get("/{subscription_id}", response_model=SubscriptionOut)
def get_subscription(subscription_id: int, service: ServiceDep) -> SubscriptionOut:
    return _out(service.get(subscription_id))


@router.put("/{subscription_id}", response_model=SubscriptionOut)
def update_subscription(subscription_id: int, data: SubscriptionIn, service: ServiceDep) -> SubscriptionOut:
    return _out(service.update(subscription_id, data))


@router.post("/{subscription_id}/pause", response_model=SubscriptionOut)
def pause_subscription(subscription_id: int, service: ServiceDep) -> SubscriptionOut:
    return _out(service.set_active(subscription_id, False))


@router.post("/{subscription_id}/resume", response_model=SubscriptionOut)
def resume_subscription(subscription_id: int, service: ServiceDep) -> SubscriptionOut:
    return _out(service.set_active(subscription_id, True))


@router.post("/{subscription_id}/mute", response_model=SubscriptionOut)
def mute_subscription(subscription_id: int, data: MuteIn, service: ServiceDep) -> SubscriptionOut:
    """Hold notifications back until a time (null unmutes); keys keep being evaluated."""
    return _out(service.set_muted(subscription_id, data.until))


@router.delete("/{subscription_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_subscription(subscription_id: int, service: ServiceDep) -> Response:
    service.delete(subscription_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/{subscription_id}/deliveries")
def delivery_log(
    subscription_id: int,
    service: ServiceDep,
    records: RecordsDep,
    limit: Annotated[int, Query(ge=1, le=ATTEMPT_LOG_LENGTH)] = 100,
) -> dict:
    """Every delivery attempt (status code, latency, error) and policy suppression, newest first."""
    service.get(subscription_id)
    return {"subscription_id": subscription_id, "deliveries": records.log(subscription_id, limit)}


@router.get("/{subscription_id}/firing")
def firing_keys(subscription_id: int, service: ServiceDep, redis_client: RedisDep, settings: SettingsDep) -> dict:
    """Keys currently in the condition, with the transition that put them there."""
    service.get(subscription_id)
    raw = redis_client.hgetall(RedisKeys(settings).firing(subscription_id))
    return {"subscription_id": subscription_id, "firing": {k: json.loads(v) for k, v in raw.items()}}
