"""Delivery endpoints of every registered kind (``notifier.channels``), their secrets and test alerts.

Kinds that sign their deliveries get a secret, shown once and rotatable.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response, status

from notifier.channels import endpoint_kinds, preview
from notifier.deliveries import ATTEMPT_LOG_LENGTH, enqueue_test_alert
from subscriptions.routing import EndpointRoute
from subscriptions.schemas import (
    EndpointCreated,
    EndpointIn,
    EndpointKindOut,
    EndpointOut,
    EndpointTemplateIn,
    TemplatePreviewIn,
    TemplatePreviewOut,
    TestFireOut,
)
from web.deps import CeleryDep, IdPath, OutboxDep, RecordsDep, ServiceDep, SettingsDep, UserDep
from web.limits import LimiterDep, limit_previews, limit_test_alerts

router = APIRouter(prefix="/api/endpoints", tags=["endpoints"])


@router.post("", status_code=status.HTTP_201_CREATED, response_model=EndpointCreated)
def create_endpoint(data: EndpointIn, service: ServiceDep) -> EndpointCreated:
    """The signing secret of a kind that signs is generated unless given, and shown only in this response."""
    return EndpointCreated.model_validate(service.create_endpoint(data))


@router.get("/kinds", response_model=list[EndpointKindOut])
def list_endpoint_kinds() -> list[EndpointKindOut]:
    """The kinds of endpoint this deployment delivers to, default first."""
    return [EndpointKindOut.of(kind) for kind in endpoint_kinds()]


@router.post("/preview-template", response_model=TemplatePreviewOut)
def preview_template(data: TemplatePreviewIn, request: Request, settings: SettingsDep, user: UserDep,
                     limiter: LimiterDep) -> TemplatePreviewOut:
    """Render a message template (null: the kind's own message) against a sample notification.

    A template the sandbox refuses is ``ok: false`` with the error and its line (the same
    check saving it makes); ``payload`` is what the kind's receiver would get.
    """
    limit_previews(limiter, request, user.id)
    shown = preview(data.kind, data.template, data.state, settings)
    return TemplatePreviewOut(ok=shown.ok, text=shown.text, error=shown.error, line=shown.line, payload=shown.payload)


@router.get("", response_model=list[EndpointOut])
def list_endpoints(service: ServiceDep) -> list[EndpointOut]:
    return [EndpointOut.model_validate(e) for e in service.list_endpoints()]


@router.get("/{endpoint_id}", response_model=EndpointOut)
def get_endpoint(endpoint_id: IdPath, service: ServiceDep) -> EndpointOut:
    return EndpointOut.model_validate(service.get_endpoint(endpoint_id))


@router.patch("/{endpoint_id}", response_model=EndpointOut)
def set_endpoint_template(endpoint_id: IdPath, data: EndpointTemplateIn, service: ServiceDep) -> EndpointOut:
    """Set (or, with null, clear) the endpoint's message template: 422 on ``template``, with the line, if refused."""
    return EndpointOut.model_validate(service.set_template(endpoint_id, data.template))


@router.post("/{endpoint_id}/rotate-secret", response_model=EndpointCreated)
def rotate_secret(endpoint_id: IdPath, service: ServiceDep) -> EndpointCreated:
    """A new signing secret, shown only in this response; the old one stops working (422 for kinds without)."""
    return EndpointCreated.model_validate(service.rotate_secret(endpoint_id))


@router.delete("/{endpoint_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_endpoint(endpoint_id: IdPath, service: ServiceDep) -> Response:
    service.delete_endpoint(endpoint_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/{endpoint_id}/test", status_code=status.HTTP_202_ACCEPTED, response_model=TestFireOut)
def send_test_alert(endpoint_id: IdPath, request: Request, service: ServiceDep, celery: CeleryDep,
                    outbox: OutboxDep, limiter: LimiterDep) -> TestFireOut:
    """Queue a made-up alert (key ``TEST``, marked ``"test": true``) through the real delivery path."""
    endpoint = service.get_endpoint(endpoint_id)
    limit_test_alerts(limiter, request, service.owner.id)
    return TestFireOut(notification_id=enqueue_test_alert(celery, outbox, EndpointRoute.of(endpoint)),
                       endpoint_id=endpoint.id, queued=True)


@router.get("/{endpoint_id}/deliveries")
def endpoint_deliveries(
    endpoint_id: IdPath,
    service: ServiceDep,
    records: RecordsDep,
    limit: Annotated[int, Query(ge=1, le=ATTEMPT_LOG_LENGTH)] = 100,
) -> dict:
    """Every delivery attempt at this endpoint, test alerts included, newest first."""
    service.get_endpoint(endpoint_id)
    return {"endpoint_id": endpoint_id, "deliveries": records.endpoint_log(endpoint_id, limit)}
