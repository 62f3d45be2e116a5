"""Delivery endpoints (webhooks)."""

from __future__ import annotations

from fastapi import APIRouter, status

from subscriptions.schemas import EndpointCreated, EndpointIn, EndpointOut
from web.deps import ServiceDep

router = APIRouter(prefix="/api/endpoints", tags=["endpoints"])


@router.post("", status_code=status.HTTP_201_CREATED, response_model=EndpointCreated)
def create_endpoint(data: EndpointIn, service: ServiceDep) -> EndpointCreated:
    return EndpointCreated.model_validate(service.create_endpoint(data))


@router.get("", response_model=list[EndpointOut])
def list_endpoints(service: ServiceDep) -> list[EndpointOut]:
    return [EndpointOut.model_validate(e) for e in service.list_endpoints()]
