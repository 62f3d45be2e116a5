"""Fragments of the subscription form: a condition checked and described as it is typed, and its preview, both
on the stream the form has selected."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse

from core.stream_names import TRADES
from subscriptions.errors import FieldError
from subscriptions.language import ConditionError
from subscriptions.service import stream_schema
from web.conditions import describe, preview_matches, preview_schema
from web.deps import DbDep, RedisDep, SettingsDep
from web.limits import LimiterDep, limit_previews
from web.pages.common import Page, render

router = APIRouter(include_in_schema=False)


@router.post("/conditions/check", response_class=HTMLResponse)
def check_condition_fragment(request: Request, principal: Page, db: DbDep, settings: SettingsDep,
                             condition: Annotated[str, Form()] = "",
                             stream: Annotated[str, Form()] = TRADES) -> HTMLResponse:
    try:
        described = describe(condition, settings, stream_schema(db, settings, stream))
    except (ConditionError, FieldError) as exc:
        return render(request, "_condition.html", principal, described=None, error=str(exc))
    return render(request, "_condition.html", principal, described=described, error=None)


@router.post("/conditions/preview", response_class=HTMLResponse)
async def preview_fragment(request: Request, principal: Page, db: DbDep, settings: SettingsDep,
                           redis_client: RedisDep, limiter: LimiterDep, condition: Annotated[str, Form()] = "",
                           keys: Annotated[str, Form()] = "", stream: Annotated[str, Form()] = TRADES) -> HTMLResponse:
    try:
        await run_in_threadpool(limit_previews, limiter, request, principal.user.id)  # Redis, off the loop
    except HTTPException as exc:
        response = render(request, "_preview.html", principal, result=None, error=exc.detail,
                          status_code=exc.status_code)
        response.headers.update(exc.headers or {})
        return response
    try:
        schema = await run_in_threadpool(preview_schema, db, settings, stream)
        result = await preview_matches(condition, keys.replace(",", " ").split() or None, settings, redis_client,
                                       schema)
    except (ConditionError, FieldError) as exc:
        return render(request, "_preview.html", principal, result=None, error=str(exc))
    return render(request, "_preview.html", principal, result=result, error=None)
