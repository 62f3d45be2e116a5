"""Backtest jobs on a Redis Cluster: a job and its account's active set share the owner's slot, so one script admits
a job against the account's limit; the whole lifecycle runs on the cluster."""

from __future__ import annotations

import time

import pytest
import redis

from core.settings import Settings
from subscriptions.backtests import BacktestJobs
from subscriptions.errors import Conflict
from tests.notifier.test_backtests import _request


def test_a_backtests_lifecycle_on_the_cluster(cluster_settings: Settings, cluster_client: redis.Redis) -> None:
    jobs = BacktestJobs(cluster_client, cluster_settings)
    now = int(time.time() * 1000)
    first = jobs.submit(11, _request(cluster_settings, now - 60_000, now))
    with pytest.raises(Conflict):
        jobs.submit(11, _request(cluster_settings, now - 60_000, now))
    assert jobs.claim(11, first.id) is not None
    assert jobs.progress(11, first.id, 10, 20, now) is True
    jobs.finish(11, first.id, {"firings": 3})
    done = jobs.get(11, first.id)
    assert done.state == "done" and done.result == {"firings": 3} and done.records_read == 10
    second = jobs.submit(11, _request(cluster_settings, now - 60_000, now))  # the first gave its place back
    assert jobs.cancel(11, second.id).state == "cancelled"
