"""Fragments of the subscription form: a condition checked and described as it is typed, and its preview."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse

from subscriptions.language import ConditionError
from web.conditions import describe, preview_matches
from web.deps import RedisDep, SettingsDep
from web.limits import LimiterDep, limit_previews
from web.pages.common import Page, render

router = APIRouter(include_in_schema=False)


@router.post("/conditions/check", response_class=HTMLResponse)
def check_condition_fragment(request: Request, principal: Page, settings: SettingsDep,
                             condition: Annotated[str, Form()] = "") -> HTMLResponse:
    try:
        return render(request, "_condition.html", principal, described=describe(condition, settings), error=None)
    except ConditionError as exc:
        return render(request, "_condition.html", principal, described=None, error=str(exc))


@router.post("/conditions/preview", response_class=HTMLResponse)
async def preview_fragment(request: Request, principal: Page, settings: SettingsDep, redis_client: RedisDep,
                           limiter: LimiterDep, condition: Annotated[str, Form()] = "",
                           keys: Annotated[str, Form()] = "") -> HTMLResponse:
    try:
        await run_in_threadpool(limit_previews, limiter, request, principal.user.id)  # Redis, off the loop
    except HTTPException as exc:
        response = render(request, "_preview.html", principal, result=None, error=exc.detail,
                          status_code=exc.status_code)
        response.headers.update(exc.headers or {})
        return response
    try:
        result = await preview_matches(condition, keys.replace(",", " ").split() or None, settings, redis_client)
    except ConditionError as exc:
        return render(request, "_preview.html", principal, result=None, error=str(exc))
    return render(request, "_preview.html", principal, result=result, error=None)
