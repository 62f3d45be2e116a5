"""Running a backtest on the ``backtests`` lane: a stream's history read back from Kafka, evaluated exactly as the live
query evaluates it (``evaluator.backtest``), the subscription's alert policy applied to what it would have sent.

A job is admitted by the web app (``subscriptions.backtests``) and queued as :data:`BACKTEST_TASK`. The
worker reads the range and the warm-up before it (``ingest.history``) in chunks of record time, so the
chart has a point per chunk; after each chunk it records its progress and stops if the job was
cancelled. The lane's worker runs at a lower CPU priority (``backtest_worker_nice``), so live evaluation
keeps the cores it needs; docs/backtests.md has the measured cost.

The result: the counts (transitions, notifications under the policy, per key, per day), the first
``backtest_transitions_listed`` transitions with whether each would have been notified (and why not), and,
for the ``backtest_chart_keys`` keys with most transitions, the value at every chunk's last boundary with
the firings and resolutions marked. Cool-down and send-resolved apply as the dispatcher applies them
(``notifier.policy.decide``), on event time; a mute does not (it is about when, not whether).
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections import Counter
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import redis
import structlog

from core.redis_client import make_redis
from core.settings import Settings, get_settings
from core.streams import topic_name
from evaluator.spec import Condition, SubscriptionSpec
from evaluator.transition import Transition
from notifier.app import BACKTEST_TASK, app
from notifier.policy import KeyState, decide
from subscriptions.backtests import BacktestJobs, BacktestRequest

if TYPE_CHECKING:
    from evaluator.backtest import Backtest

KEYS_LISTED = 50  # per-key counts shown: the keys with most firings

log = structlog.get_logger("notifier")


def run_backtest(settings: Settings, client: redis.Redis, owner_id: int, job_id: str) -> None:
    """Run one queued job to its end (done, failed or cancelled); nothing if it is no longer queued."""
    jobs = BacktestJobs(client, settings)
    request = jobs.claim(owner_id, job_id)
    if request is None:
        return
    started = time.monotonic()
    try:
        result = _run(settings, jobs, owner_id, job_id, request)
    except Exception as exc:  # noqa: BLE001 - the job fails with the reason, the worker goes on
        log.warning("backtest_failed", job=job_id, owner=owner_id, error=repr(exc))
        jobs.fail(owner_id, job_id, f"{type(exc).__name__}: {exc}")
        return
    if result is None:
        jobs.cancelled(owner_id, job_id)
        log.info("backtest_cancelled", job=job_id, owner=owner_id)
        return
    result["elapsed_s"] = round(time.monotonic() - started, 3)
    result["records_per_s"] = round(result["records"] / max(result["elapsed_s"], 1e-9))
    jobs.finish(owner_id, job_id, result)
    log.info("backtest_done", job=job_id, owner=owner_id, records=result["records"], seconds=result["elapsed_s"],
             transitions=result["transitions_total"])


def chunk_ms(settings: Settings, start_ms: int, end_ms: int) -> int:
    """Record time per chunk: the range in at most ``backtest_chart_points`` chunks, whole panes, one pane at least."""
    pane = settings.pane_ms
    return max(math.ceil((end_ms - start_ms) / settings.backtest_chart_points / pane), 1) * pane


def _run(settings: Settings, jobs: BacktestJobs, owner_id: int, job_id: str,
         request: BacktestRequest) -> dict[str, Any] | None:
    # Here, not at the top: every worker imports this module (the app includes it), and only the backtests lane's
    # run one; the delivery lanes need neither pandas nor Arrow (tests/notifier/test_worker_imports.py)
    from evaluator.backtest import Backtest, warm_up_ms
    from ingest.history import history_span, read_history

    condition = Condition.from_dict(request.condition_spec)
    keys = frozenset(request.keys) if request.keys is not None else None
    spec = SubscriptionSpec(request.subscription_id, condition, keys, request.condition)
    first = max(request.start_ms - warm_up_ms(condition, settings), 0)
    span = history_span(settings, topic_name(request.stream, settings), first, request.end_ms)
    backtest = Backtest.of(spec, settings, request.stream_schema, len(span.offsets), request.start_ms)
    total = span.records
    jobs.progress(owner_id, job_id, 0, total, None)
    until = time.monotonic() + settings.backtest_max_run_s
    with contextlib.closing(read_history(settings, span, chunk_ms(settings, request.start_ms, request.end_ms))) as chunks:
        for chunk in chunks:  # closed on leaving: the reader's consumer with it, not when collected
            backtest.feed(chunk)
            if not jobs.progress(owner_id, job_id, backtest.tally.records, total, backtest.evaluated_at):
                return None  # cancelled
            if time.monotonic() > until:
                raise TimeoutError(f"stopped after {settings.backtest_max_run_s:g} s with {backtest.tally.records:,} "
                                   f"of {total:,} records read: narrow the range or the keys")
    return summary(settings, request, backtest)


def summary(settings: Settings, request: BacktestRequest, backtest: Backtest) -> dict[str, Any]:
    """The result a user reads (see the module doc)."""
    condition = Condition.from_dict(request.condition_spec)
    decided = apply_policy(request, backtest.transitions)
    firing = Counter(t.key for t, _ in decided if t.state == "firing")
    resolved = Counter(t.key for t, _ in decided if t.state == "resolved")
    notified = Counter(t.key for t, why in decided if why is None)
    days: dict[str, Counter] = {}
    for t, why in decided:
        day = days.setdefault(datetime.fromtimestamp(t.evaluated_at / 1000, UTC).date().isoformat(), Counter())
        day[t.state] += 1
        day["notified"] += why is None
    charted = sorted(set(firing) | set(resolved), key=lambda k: (-(firing[k] + resolved[k]), k))
    charted = (sorted(request.keys) if request.keys is not None and len(request.keys) <= settings.backtest_chart_keys
               else charted)[:settings.backtest_chart_keys]
    tally = backtest.tally
    listed = settings.backtest_transitions_listed
    behind = backtest.evaluated_at is None or backtest.evaluated_at < request.end_ms - settings.watermark_delay_ms - \
        chunk_ms(settings, request.start_ms, request.end_ms) - settings.pane_ms
    return {
        "stream": request.stream, "condition": request.condition, "start_ms": request.start_ms,
        "end_ms": request.end_ms, "evaluated_to": backtest.evaluated_at,
        "records": tally.records, "events": tally.events, "dead_lettered": tally.dead,
        "dead_reasons": dict(tally.dead_reasons), "late_dropped": tally.late_dropped,
        # event time stopped short of the range's end: some partition's records (or heartbeats) stopped, as they
        # would have held the live query back
        "stopped_short": behind,
        "transitions_total": len(decided), "firings": sum(firing.values()), "resolutions": sum(resolved.values()),
        "notifications": sum(notified.values()), "keys_firing": len(firing),
        "per_key": [{"key": k, "firing": firing[k], "resolved": resolved[k], "notified": notified[k]}
                    for k in sorted(firing, key=lambda k: (-firing[k], k))[:KEYS_LISTED]],
        "per_day": [{"day": d, "firing": c["firing"], "resolved": c["resolved"], "notified": c["notified"]}
                    for d, c in sorted(days.items())],
        "transitions": [{"key": t.key, "state": t.state, "kind": t.kind, "at": t.evaluated_at, "value": t.value,
                         "alert_id": t.alert_id, "notified": why is None, "not_notified_because": why}
                        for t, why in decided[:listed]],
        "transitions_listed": min(listed, len(decided)),
        "chart": {
            "thresholds": [x for x in (condition.low, condition.high) if x is not None],
            "keys": [{"key": k, "points": backtest.samples.get(k, []),
                      "marks": [[t.evaluated_at, t.state, t.value] for t in backtest.transitions if t.key == k]}
                     for k in charted],
        },
    }


def apply_policy(request: BacktestRequest, transitions: list[Transition]) -> list[tuple[Transition, str | None]]:
    """Each transition with None (it would have been notified) or why not, per key in order, on event time; every
    key starts told nothing (a resolve before any firing is not sent)."""
    policy = request.policy.model_copy(update={"muted_until": None})
    states: dict[str, KeyState] = {}
    decided = []
    for t in transitions:
        why, states[t.key] = decide(policy, states.get(t.key, KeyState()), t.state, t.evaluated_at / 1000, t.alert_id)
        decided.append((t, why))
    return decided


@app.task(name=BACKTEST_TASK, acks_late=False, ignore_result=True)
def backtest(owner_id: int, job_id: str) -> None:
    """The lane's task: acknowledged when taken, so a worker lost mid-run does not run the job again (the job is
    failed as lost, ``subscriptions.backtests``)."""
    run_backtest(get_settings(), _redis(), owner_id, job_id)


@functools.cache
def _redis() -> redis.Redis:
    """One client (and connection pool) per worker process."""
    return make_redis(get_settings(), decode_responses=True)
