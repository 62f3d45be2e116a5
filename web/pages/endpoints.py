"""The endpoints page: add, test, rotate the secret of and delete the places alerts are delivered to."""

from __future__ import annotations

import html
from typing import Annotated, Any

from fastapi import APIRouter, Form, HTTPException, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import ValidationError

from core.settings import Settings
from notifier.channels import endpoint_kind, preview
from notifier.deliveries import enqueue_test_alert
from subscriptions.errors import FieldError, Forbidden
from subscriptions.routing import EndpointRoute
from subscriptions.schemas import EndpointIn, EndpointTemplateIn, TemplatePreviewIn
from subscriptions.templating import FILTERS, VARIABLES, TemplateLimits
from web.deps import CeleryDep, IdPath, KeysDep, OutboxDep, RecordsDep, RedisDep, SettingsDep
from web.limits import LimiterDep, limit_previews, limit_test_alerts
from web.pages.common import Page, PageService, flash, form_errors, render, take_flash

router = APIRouter(include_in_schema=False)


def _page(request: Request, principal: Page, service: PageService, settings: Settings, status_code: int = 200,
          **context: Any) -> HTMLResponse:
    context = {"errors": {}, "values": {}, "secret": None, "template_errors": {}, **context}
    return render(request, "endpoints.html", principal, status_code, endpoints=service.list_endpoints(),
                  template_variables=VARIABLES, template_filters=[*FILTERS, "ms_time", "number"],
                  template_limits=TemplateLimits.from_settings(settings), **context)


@router.get("/endpoints", response_class=HTMLResponse)
def endpoints_page(request: Request, principal: Page, service: PageService, settings: SettingsDep,
                   redis_client: RedisDep, keys: KeysDep) -> HTMLResponse:
    return _page(request, principal, service, settings, secret=take_flash(redis_client, keys, principal).get("secret"))


@router.post("/endpoints")
def create_endpoint(request: Request, principal: Page, service: PageService, settings: SettingsDep,
                    redis_client: RedisDep, keys: KeysDep, kind: Annotated[str, Form()] = "",
                    target: Annotated[str, Form()] = "", secret: Annotated[str, Form()] = "",
                    template: Annotated[str, Form()] = "") -> Response:
    try:
        endpoint = service.create_endpoint(EndpointIn(kind=kind, target=target.strip(), secret=secret.strip() or None,
                                                      template=template or None))
    except ValidationError as exc:
        errors = form_errors(exc)
    except FieldError as exc:
        errors = {exc.field: str(exc)}
    except Forbidden as exc:
        errors = {"form": str(exc)}
    else:
        if endpoint.secret:
            flash(redis_client, keys, principal, secret={"target": endpoint.target, "value": endpoint.secret})
        return RedirectResponse("/endpoints", status_code=status.HTTP_303_SEE_OTHER)
    return _page(request, principal, service, settings, 422, errors=errors,
                 values={"kind": kind, "target": target, "template": template})


@router.post("/endpoints/template-preview", response_class=HTMLResponse)
def preview_template(request: Request, principal: Page, settings: SettingsDep, limiter: LimiterDep,
                     kind: Annotated[str, Form()] = "", template: Annotated[str, Form()] = "",
                     state: Annotated[str, Form()] = "firing") -> HTMLResponse:
    """The message a template makes of a sample notification, for the form (htmx)."""
    try:
        data = TemplatePreviewIn.model_validate({"kind": kind, "template": template or None, "state": state})
    except ValidationError as exc:
        return HTMLResponse(f'<p class="error">{html.escape("; ".join(form_errors(exc).values()))}</p>',
                            status_code=422)
    try:
        limit_previews(limiter, request, principal.user.id)
    except HTTPException as exc:
        return HTMLResponse(f'<span class="error">{html.escape(exc.detail)}</span>', status_code=exc.status_code,
                            headers=exc.headers)
    return render(request, "_template_preview.html", principal, kind=endpoint_kind(data.kind),
                  preview=preview(data.kind, data.template, data.state, settings))


@router.post("/endpoints/{endpoint_id}/template")
def set_endpoint_template(request: Request, endpoint_id: IdPath, principal: Page, service: PageService,
                          settings: SettingsDep, template: Annotated[str, Form()] = "") -> Response:
    try:
        service.set_template(endpoint_id, EndpointTemplateIn(template=template).template)
    except ValidationError as exc:
        message = "; ".join(form_errors(exc).values())
    except FieldError as exc:
        message = str(exc)
    else:
        return RedirectResponse("/endpoints", status_code=status.HTTP_303_SEE_OTHER)
    return _page(request, principal, service, settings, 422, template_errors={endpoint_id: message})


@router.post("/endpoints/{endpoint_id}/rotate")
def rotate_endpoint_secret(endpoint_id: IdPath, principal: Page, service: PageService,
                           redis_client: RedisDep, keys: KeysDep) -> Response:
    endpoint = service.rotate_secret(endpoint_id)
    flash(redis_client, keys, principal, secret={"target": endpoint.target, "value": endpoint.secret})
    return RedirectResponse("/endpoints", status_code=status.HTTP_303_SEE_OTHER)


@router.post("/endpoints/{endpoint_id}/test", response_class=HTMLResponse)
def test_endpoint(request: Request, endpoint_id: IdPath, principal: Page, service: PageService,
                  celery: CeleryDep, outbox: OutboxDep, limiter: LimiterDep) -> HTMLResponse:
    endpoint = service.get_endpoint(endpoint_id)
    try:
        limit_test_alerts(limiter, request, principal.user.id)
    except HTTPException as exc:
        return HTMLResponse(f'<span class="error">{html.escape(exc.detail)}</span>', status_code=exc.status_code,
                            headers=exc.headers)
    queued = enqueue_test_alert(celery, outbox, EndpointRoute.of(endpoint))
    return HTMLResponse(f'<span class="ok">Test alert queued ({queued[:8]}…); its delivery shows in the log below.'
                        '</span>')


@router.post("/endpoints/{endpoint_id}/delete")
def delete_endpoint(endpoint_id: IdPath, service: PageService) -> Response:
    service.delete_endpoint(endpoint_id)
    return Response(headers={"HX-Redirect": "/endpoints"})


@router.get("/endpoints/{endpoint_id}/deliveries", response_class=HTMLResponse)
def endpoint_deliveries_fragment(request: Request, endpoint_id: IdPath, principal: Page, service: PageService,
                                 records: RecordsDep) -> HTMLResponse:
    service.get_endpoint(endpoint_id)
    return render(request, "_deliveries.html", principal, deliveries=records.endpoint_log(endpoint_id, 20))
