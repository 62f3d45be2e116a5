"""Backtests: how often a condition would have fired on a stream's history (docs/backtests.md)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, status
from fastapi.concurrency import run_in_threadpool

from subscriptions.backtests import BacktestIn, BacktestJobs, BacktestStatus
from web.backtests import start_backtest
from web.deps import CeleryDep, DbDep, RedisDep, SettingsDep, UserDep
from web.limits import LimiterDep, limit_backtests

router = APIRouter(prefix="/api/backtests", tags=["backtests"])

JobId = Annotated[str, Path(pattern=r"^[0-9a-f]{32}$", description="the id the backtest was started with")]


@router.post("", status_code=status.HTTP_202_ACCEPTED, response_model=BacktestStatus)
async def create_backtest(data: BacktestIn, db: DbDep, settings: SettingsDep, redis_client: RedisDep,
                          celery: CeleryDep, user: UserDep, limiter: LimiterDep) -> BacktestStatus:
    """Start a backtest; poll it with GET until its ``state`` is no longer ``queued`` or ``running``.

    409 when the account already has ``backtest_max_active`` backtests queued or running; 429 beyond
    ``rate_backtest_account``; 422 naming the field for a bad condition or range."""
    await run_in_threadpool(limit_backtests, limiter, user.id)
    return await run_in_threadpool(start_backtest, db, settings, redis_client, celery, user, data)


@router.get("/{job_id}", response_model=BacktestStatus)
def get_backtest(job_id: JobId, settings: SettingsDep, redis_client: RedisDep, user: UserDep) -> BacktestStatus:
    """Its state, progress (records read of the total, the last boundary evaluated) and, once done, its result."""
    return BacktestJobs(redis_client, settings).get(user.id, job_id)


@router.delete("/{job_id}", response_model=BacktestStatus)
def cancel_backtest(job_id: JobId, settings: SettingsDep, redis_client: RedisDep, user: UserDep) -> BacktestStatus:
    """Cancel it: a queued one at once, a running one after the chunk it is reading (``state`` says when)."""
    return BacktestJobs(redis_client, settings).cancel(user.id, job_id)
