"""The subscription form's backtest panel: start a backtest of the condition as typed, watch it run, read its result.

The panel polls the job's fragment every second while it runs (htmx); the chart is drawn by
``tocsin.js`` (uPlot) from the result the fragment carries.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Form, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse

from core.stream_names import TRADES
from subscriptions.backtests import BacktestIn, BacktestJobs, BacktestStatus
from subscriptions.errors import Conflict, FieldError, NotFound
from subscriptions.language import ConditionError
from subscriptions.policy import AlertPolicy
from web.backtests import start_backtest
from web.deps import CeleryDep, DbDep, RedisDep, SettingsDep
from web.limits import LimiterDep, limit_backtests
from web.pages.common import TEMPLATES, Page, PagePrincipal, render

router = APIRouter(include_in_schema=False)

#: The ranges the panel offers, in hours (the API takes any range within retention).
RANGES_H = (1, 6, 24, 72, 168)
TEMPLATES.env.globals["backtest_ranges"] = RANGES_H  # the subscription form's choices


@router.post("/backtests", response_class=HTMLResponse)
def backtest_fragment(request: Request, principal: Page, db: DbDep, settings: SettingsDep, redis_client: RedisDep,
                      celery: CeleryDep, limiter: LimiterDep, condition: Annotated[str, Form()] = "",
                      keys: Annotated[str, Form()] = "", stream: Annotated[str, Form()] = TRADES,
                      hours: Annotated[float, Form(gt=0, le=24 * 366)] = 1,
                      cooldown_s: Annotated[str, Form()] = "0",
                      send_resolved: Annotated[str | None, Form()] = None) -> HTMLResponse:
    try:
        limit_backtests(limiter, principal.user.id)
        policy = AlertPolicy(cooldown_s=int(cooldown_s or 0), send_resolved=send_resolved is not None)
        now = time.time()
        data = BacktestIn(stream=stream, condition=condition or None, keys=keys.replace(",", " ").split() or None,
                          start=now - hours * 3600, end=now, policy=policy)
        job = start_backtest(db, settings, redis_client, celery, principal.user, data)
    except HTTPException as exc:
        return render(request, "_backtest.html", principal, job=None, error=exc.detail, status_code=exc.status_code)
    except (ConditionError, FieldError, Conflict, ValueError) as exc:
        return render(request, "_backtest.html", principal, job=None, error=str(exc))
    return render(request, "_backtest.html", principal, job=job, error=None)


@router.get("/backtests/{job_id}", response_class=HTMLResponse)
async def backtest_progress(job_id: str, request: Request, principal: Page, settings: SettingsDep,
                            redis_client: RedisDep) -> HTMLResponse:
    return await _job_fragment(request, principal, BacktestJobs(redis_client, settings).get, job_id)


@router.post("/backtests/{job_id}/cancel", response_class=HTMLResponse)
async def backtest_cancel(job_id: str, request: Request, principal: Page, settings: SettingsDep,
                          redis_client: RedisDep) -> HTMLResponse:
    return await _job_fragment(request, principal, BacktestJobs(redis_client, settings).cancel, job_id)


async def _job_fragment(request: Request, principal: PagePrincipal, call: Callable[[int, str], BacktestStatus],
                        job_id: str) -> HTMLResponse:
    """The job's fragment after ``call`` (a read or a cancel) on it, off the event loop (Redis)."""
    try:
        job = await run_in_threadpool(call, principal.user.id, job_id)
    except NotFound as exc:
        return render(request, "_backtest.html", principal, job=None, error=str(exc), status_code=404)
    return render(request, "_backtest.html", principal, job=job, error=None)
