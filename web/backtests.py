"""Backtests as the web app starts them: the job admitted for its account, then queued on the backtests lane.

Shared by the API (``web.api.backtests``) and the subscription form's panel (``web.pages.backtests``).
"""

from __future__ import annotations

import time

import redis
from celery import Celery
from sqlalchemy.orm import Session

from core.settings import Settings
from notifier.app import BACKTEST_TASK
from subscriptions.backtests import BacktestIn, BacktestJobs, BacktestStatus, backtest_request
from subscriptions.models import User


def start_backtest(session: Session, settings: Settings, client: redis.Redis, celery: Celery, user: User,
                   data: BacktestIn) -> BacktestStatus:
    """Check, admit and queue a backtest (FieldError on a bad field, Conflict beyond the account's limit). A job the
    broker would not take is failed with the reason, so it never holds the account's place."""
    request = backtest_request(session, settings, client, user, data, time.time())
    jobs = BacktestJobs(client, settings)
    status = jobs.submit(user.id, request)
    try:
        celery.send_task(BACKTEST_TASK, args=(user.id, status.id), queue=celery.conf.tocsin_lanes["backtests"])
    except Exception as exc:
        jobs.fail(user.id, status.id, f"could not be queued: {exc}")
        raise
    return status
