"""Subscription CRUD, pause/resume, mute, and the alerts and deliveries of each."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Response, status

from notifier.deliveries import ATTEMPT_LOG_LENGTH
from subscriptions.alerts import AlertViews, HistoryFilter, valid_cursor
from subscriptions.errors import FieldError
from subscriptions.models import Subscription
from subscriptions.schemas import MuteIn, SubscriptionIn, SubscriptionOut
from subscriptions.streams import stream_of
from web.admission import admission_status
from web.deps import IdPath, KeysDep, RecordsDep, RedisDep, ServiceDep

router = APIRouter(prefix="/api/subscriptions", tags=["subscriptions"])


def subscription_out(subscription: Subscription) -> SubscriptionOut:
    return SubscriptionOut.model_validate(
        {
            **{c: getattr(subscription, c) for c in ("id", "name", "condition", "keys", "active")},
            "stream": stream_of(subscription),
            "endpoint_ids": sorted(e.id for e in subscription.endpoints),
            "policy": subscription.policy or {},
            "created_at": subscription.created_at,
            "updated_at": subscription.updated_at,
        }
    )


@router.post("", status_code=status.HTTP_201_CREATED, response_model=SubscriptionOut)
def create_subscription(data: SubscriptionIn, service: ServiceDep) -> SubscriptionOut:
    return subscription_out(service.create(data))


@router.get("", response_model=list[SubscriptionOut])
def list_subscriptions(service: ServiceDep) -> list[SubscriptionOut]:
    return [subscription_out(s) for s in service.list()]


@router.get("/{subscription_id}", response_model=SubscriptionOut)
def get_subscription(subscription_id: IdPath, service: ServiceDep) -> SubscriptionOut:
    return subscription_out(service.get(subscription_id))


@router.put("/{subscription_id}", response_model=SubscriptionOut)
def update_subscription(subscription_id: IdPath, data: SubscriptionIn, service: ServiceDep) -> SubscriptionOut:
    return subscription_out(service.update(subscription_id, data))


@router.post("/{subscription_id}/pause", response_model=SubscriptionOut)
def pause_subscription(subscription_id: IdPath, service: ServiceDep) -> SubscriptionOut:
    return subscription_out(service.set_active(subscription_id, False))


@router.post("/{subscription_id}/resume", response_model=SubscriptionOut)
def resume_subscription(subscription_id: IdPath, service: ServiceDep) -> SubscriptionOut:
    return subscription_out(service.set_active(subscription_id, True))


@router.post("/{subscription_id}/mute", response_model=SubscriptionOut)
def mute_subscription(subscription_id: IdPath, data: MuteIn, service: ServiceDep) -> SubscriptionOut:
    """Hold notifications back until a time (null unmutes); keys keep being evaluated."""
    return subscription_out(service.set_muted(subscription_id, data.until))


@router.delete("/{subscription_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_subscription(subscription_id: IdPath, service: ServiceDep) -> Response:
    service.delete(subscription_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/{subscription_id}/deliveries")
def delivery_log(
    subscription_id: IdPath,
    service: ServiceDep,
    records: RecordsDep,
    limit: Annotated[int, Query(ge=1, le=ATTEMPT_LOG_LENGTH)] = 100,
) -> dict:
    """Every delivery attempt (status code, latency, error) and policy suppression, newest first."""
    service.get(subscription_id)
    return {"subscription_id": subscription_id, "deliveries": records.log(subscription_id, limit)}


@router.get("/{subscription_id}/firing")
def firing_keys(subscription_id: IdPath, service: ServiceDep, redis_client: RedisDep, keys: KeysDep) -> dict:
    """Keys currently in the condition, with the transition that put them there (keys of the subscription's stream);
    ``admission``: on how many of its stream's shards it is not evaluated yet (nothing fires there): they have not
    evaluated a catalog from before its last change (``unread_shards``), or not admitted it (``waiting_shards``)."""
    subscription = service.get(subscription_id)
    stream = stream_of(subscription)
    return {"subscription_id": subscription_id, "stream": stream,
            "firing": AlertViews(redis_client, keys).firing(subscription_id),
            "admission": admission_status(redis_client, keys, stream, subscription_id,
                                          subscription.catalog_version).to_dict()}


@router.get("/{subscription_id}/alerts")
def alert_history(
    subscription_id: IdPath,
    service: ServiceDep,
    redis_client: RedisDep,
    keys: KeysDep,
    state: Literal["firing", "resolved"] | None = None,
    key: Annotated[str | None, Query(max_length=64)] = None,
    since: Annotated[int | None, Query(ge=0, description="evaluated at or after (epoch ms)")] = None,
    until: Annotated[int | None, Query(ge=0, description="evaluated before (epoch ms)")] = None,
    limit: Annotated[int, Query(ge=1, le=1_000)] = 100,
    before: Annotated[str | None, Query(max_length=41, description="the cursor of the previous page")] = None,
) -> dict:
    """Transitions of this subscription (keys of its stream), newest first, filtered; page on with ``next`` as
    ``before``."""
    subscription = service.get(subscription_id)
    if before is not None and not valid_cursor(before):
        raise FieldError("before", "not a cursor: pass the 'next' of the previous page")
    where = HistoryFilter(state=state, key=key, since_ms=since, until_ms=until)
    alerts, cursor = AlertViews(redis_client, keys).history(subscription_id, where, limit, before)
    return {"subscription_id": subscription_id, "stream": stream_of(subscription), "alerts": alerts, "next": cursor}
