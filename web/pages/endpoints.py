"""The endpoints page: add, test, rotate the secret of and delete the places alerts are delivered to."""

from __future__ import annotations

import html
from typing import Annotated

from fastapi import APIRouter, Form, HTTPException, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import ValidationError

from notifier.deliveries import enqueue_test_alert
from subscriptions.errors import Forbidden
from subscriptions.routing import EndpointRoute
from subscriptions.schemas import EndpointIn
from web.deps import CeleryDep, IdPath, KeysDep, RecordsDep, RedisDep
from web.limits import LimiterDep, limit_test_alerts
from web.pages.common import Page, PageService, flash, form_errors, render, take_flash

router = APIRouter(include_in_schema=False)


@router.get("/endpoints", response_class=HTMLResponse)
def endpoints_page(request: Request, principal: Page, service: PageService,
                   redis_client: RedisDep, keys: KeysDep) -> HTMLResponse:
    return render(request, "endpoints.html", principal, endpoints=service.list_endpoints(), errors={}, values={},
                  secret=take_flash(redis_client, keys, principal).get("secret"))


@router.post("/endpoints")
def create_endpoint(request: Request, principal: Page, service: PageService, redis_client: RedisDep,
                    keys: KeysDep, kind: Annotated[str, Form()] = "", target: Annotated[str, Form()] = "") -> Response:
    try:
        endpoint = service.create_endpoint(EndpointIn(kind=kind, target=target.strip()))
    except ValidationError as exc:
        errors = form_errors(exc)
    except Forbidden as exc:
        errors = {"form": str(exc)}
    else:
        if endpoint.secret:
            flash(redis_client, keys, principal, secret={"target": endpoint.target, "value": endpoint.secret})
        return RedirectResponse("/endpoints", status_code=status.HTTP_303_SEE_OTHER)
    return render(request, "endpoints.html", principal, endpoints=service.list_endpoints(), errors=errors,
                  values={"kind": kind, "target": target}, secret=None, status_code=422)


@router.post("/endpoints/{endpoint_id}/rotate")
def rotate_endpoint_secret(endpoint_id: IdPath, principal: Page, service: PageService,
                           redis_client: RedisDep, keys: KeysDep) -> Response:
    endpoint = service.rotate_secret(endpoint_id)
    flash(redis_client, keys, principal, secret={"target": endpoint.target, "value": endpoint.secret})
    return RedirectResponse("/endpoints", status_code=status.HTTP_303_SEE_OTHER)


@router.post("/endpoints/{endpoint_id}/test", response_class=HTMLResponse)
def test_endpoint(request: Request, endpoint_id: IdPath, principal: Page, service: PageService,
                  celery: CeleryDep, limiter: LimiterDep) -> HTMLResponse:
    endpoint = service.get_endpoint(endpoint_id)
    try:
        limit_test_alerts(limiter, request, principal.user.id)
    except HTTPException as exc:
        return HTMLResponse(f'<span class="error">{html.escape(exc.detail)}</span>', status_code=exc.status_code,
                            headers=exc.headers)
    queued = enqueue_test_alert(celery, EndpointRoute.of(endpoint))
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
