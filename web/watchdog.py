"""The dead man's switch: operators hear about it when evaluation stalls, degrades or stops.

An alerting platform's worst failure is silence, and a silent evaluator writes
nothing that could trip an alert of its own. So the web app's sampler (one
process at a time, under the sampler lock) judges every dashboard sample
against eight rules, like Prometheus' ``absent()`` and Alertmanager's watchdog:

- ``stalled``: the slowest shard's clock has not moved for ``watchdog_stall_s``
  (``watchdog_startup_s`` after the job starts) while records kept arriving (the
  Kafka log ends grew);
- ``degraded``: over ``watchdog_window_s`` more than ``watchdog_max_refused_share``
  of the records were dropped as too late, refused as from the future or
  dead-lettered (judged once ``watchdog_min_records`` arrived);
- ``restarting``: the job started more than ``watchdog_max_restarts`` times
  within ``watchdog_restart_window_s``;
- ``down``: the evaluator driver's heartbeat is older than ``evaluator_stale_s``
  (or it never sent one since the web app started watching);
- ``catalog``: for ``watchdog_catalog_s`` the shards have evaluated with a catalog
  older than the one published, because a change or snapshot no reader can decode
  (or a lost one) stops them from reaching it: subscription edits, new
  subscriptions and deletions silently do not take effect, so an operator must know
  (stuck readers keep their mark fresh; a stale one, left by readers that are gone, does not fire);
- ``stream``: a declared stream's own query (``trades`` is the rules above) is stalled, as ``stalled``
  says of its slowest shard clock and its topic's log ends (its query's last start counting as a job
  start), or has failed ``watchdog_stream_failures`` times in a row (the evaluator's stream supervisor
  restarts it with backoff and records the failures): its subscriptions are silent. One incident for
  all such streams; its detail names each.
- ``clock``: within ``watchdog_window_s`` a producer dated records ahead of the processing clock by more
  than ``clock_tolerance_ms`` (``core.clock_ahead``): their windows wait for the clock, so that
  producer's alerts come late by its lead. The detail names each stream with its partition (seen by the
  evaluator) or publisher token (seen by the web app).
- ``storage``: for ``watchdog_stall_s`` a sink's handoff (``evaluator.spark.handoff``) has held evaluated
  alerts without storing any of them (its stored total did not move): they reach nobody until it does.

The rules are pure functions of the samples (``evaluate``). An incident opens
when a rule starts firing and closes when it stops; each opening and closing is
sent once, through the delivery task, to every operator account at its own
address (an e-mail endpoint it owns, made for it if it has none:
``subscriptions.paging``) and to the endpoints in ``operator_endpoint_ids``, with
an id derived from the rule and the incident's start so that a duplicate enqueue is
dropped by the worker's delivered mark. A stream whose evaluation goes stale tells
its subscribers too (``web.stale``).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Any

import redis
import structlog
from celery import Celery
from prometheus_client import Gauge

from core.clock_ahead import ClockAhead
from core.redis_replies import text_hash
from core.redis_schema import RedisKeys
from core.settings import Settings
from notifier.deliveries import binding, enqueue
from notifier.notification import build_notification, notification_id
from notifier.outbox import Outbox
from subscriptions.db import session_scope
from subscriptions.paging import operator_mailboxes

log = structlog.get_logger("watchdog")

RULES = ("stalled", "degraded", "restarting", "down", "catalog", "stream", "clock", "storage")
#: Counters of records the evaluator did not turn into on-time events (``stats:evaluator``); missing means 0.
REFUSAL_COUNTERS = ("late_events_dropped", "future_events_refused", "future_heartbeats_refused", "dead_lettered")
#: ``series_refused`` is not a refusal counter of its own: its events are in ``dead_lettered``.
STREAM_COUNTERS = ("late_events_applied", "series_refused", "events_ahead_of_clock", *REFUSAL_COUNTERS)

RULE_FIRING = Gauge("tocsin_watchdog_firing", "1 while a dead man's switch rule fires", ["rule"])
RULE_SINCE = Gauge("tocsin_watchdog_firing_since_seconds", "Unix time the rule started firing (0: not firing)",
                   ["rule"])
STREAM = {name: Gauge(f"tocsin_stream_{name}", f"Evaluator total: {name.replace('_', ' ')}")
          for name in STREAM_COUNTERS}
JUDGED = Gauge("tocsin_watchdog_last_judged_timestamp_seconds",
               "Unix time of the last sample a web process took and let the dead man's switch judge (0: none): alert "
               "when it is minutes old, as nothing else pages while no web process samples")
#: Sampling periods without a new sample after which the /ops banner says the dead man's switch is not watching.
UNWATCHED_PERIODS = 5
for _rule in RULES:  # every rule's series from the start, at 0, so an alert on them never meets an absent series
    RULE_FIRING.labels(_rule)
    RULE_SINCE.labels(_rule)


@dataclass(frozen=True)
class RuleStatus:
    firing: bool
    since: float | None = None  # when the condition began (firing) or None
    detail: str = ""


def _first_with(samples: list[dict], field: str) -> dict | None:
    return next((s for s in samples if s.get(field) is not None), None)


def stalled(samples: list[dict], starts: list[float], settings: Settings, now: float) -> RuleStatus:
    """The slowest shard clock unchanged for ``watchdog_stall_s`` while the log ends grew."""
    if not samples:
        return RuleStatus(False)
    clock = samples[-1].get("clock")
    first_same = len(samples) - 1
    while first_same > 0 and samples[first_same - 1].get("clock") == clock:
        first_same -= 1
    last_start = max(starts, default=0.0)
    since = max(samples[first_same]["t"], last_start)
    base = _first_with([s for s in samples[first_same:] if s["t"] >= since], "log_end")
    newest = _first_with(samples[::-1], "log_end")
    arrived = 0 if base is None or newest is None else newest["log_end"] - base["log_end"]
    # no evaluation since the job (re)started: its first batch, with the backlog, is allowed longer
    limit = max(settings.watchdog_stall_s, settings.watchdog_startup_s) if since == last_start \
        else settings.watchdog_stall_s
    if now - since >= limit and arrived > 0:
        what = "no shard has evaluated yet" if clock is None else f"shard clock stuck at {clock}"
        return RuleStatus(True, since, f"{what} while {arrived} records arrived")
    return RuleStatus(False)


def degraded(samples: list[dict], settings: Settings, now: float) -> RuleStatus:
    """Too large a share of the window's records dropped, refused or dead-lettered."""
    window = [s for s in samples if s["t"] >= now - settings.watchdog_window_s and s.get("log_end") is not None]
    if len(window) < 2:
        return RuleStatus(False)
    base, newest = window[0], window[-1]
    refused = sum(max(newest.get(c, 0) - base.get(c, 0), 0) for c in REFUSAL_COUNTERS)
    records = max(newest["log_end"] - base["log_end"], refused)
    if records < settings.watchdog_min_records or refused <= settings.watchdog_max_refused_share * records:
        return RuleStatus(False)
    return RuleStatus(True, base["t"], f"{refused} of {records} records dropped, refused or dead-lettered "
                                       f"({refused / records:.1%} > {settings.watchdog_max_refused_share:.1%})")


def restarting(starts: list[float], settings: Settings, now: float) -> RuleStatus:
    """More job starts within the window than allowed."""
    recent = sorted(s for s in starts if s >= now - settings.watchdog_restart_window_s)
    if len(recent) <= settings.watchdog_max_restarts:
        return RuleStatus(False)
    return RuleStatus(True, recent[settings.watchdog_max_restarts],
                      f"{len(recent)} job starts in {settings.watchdog_restart_window_s:g} s")


def down(samples: list[dict], settings: Settings, now: float) -> RuleStatus:
    """No heartbeat from the evaluator driver for ``evaluator_stale_s``."""
    if not samples:
        return RuleStatus(False)
    heartbeat = samples[-1].get("heartbeat_at")
    since = heartbeat if heartbeat is not None else samples[0]["t"]
    if now - since < settings.evaluator_stale_s:
        return RuleStatus(False)
    detail = "no heartbeat from the evaluator since the web app started watching" if heartbeat is None \
        else f"no heartbeat from the evaluator for {now - heartbeat:.0f} s"
    return RuleStatus(True, since, detail)


def catalog(samples: list[dict], settings: Settings, now: float) -> RuleStatus:
    """The shards' catalog behind a published version they cannot reach, for ``watchdog_catalog_s``.

    Stuck workers rewrite their mark every few seconds (``seen_at``); one nobody rewrote for twice the rule's
    period (or three of their periods, if longer) was left by workers that are gone, and does not fire.
    """
    latest = samples[-1] if samples else {}
    since = latest.get("catalog_stuck_since")
    if since is None or now - since < settings.watchdog_catalog_s:
        return RuleStatus(False)
    stuck = latest.get("catalog_stuck") or {}
    seen_at, every_s = stuck.get("seen_at"), stuck.get("every_s")
    if (isinstance(seen_at, int | float) and isinstance(every_s, int | float)
            and now - seen_at > max(2 * settings.watchdog_catalog_s, 3 * every_s)):
        return RuleStatus(False)
    detail = (f"the evaluator holds subscription catalog version {stuck.get('held', '?')} of "
              f"{stuck.get('published', '?')} published, so later edits do not take effect: "
              f"{stuck.get('problem', 'reason unknown')}")
    return RuleStatus(True, since, detail)


def _of_stream(samples: list[dict], name: str) -> list[dict]:
    """The samples of one declared stream's query, in the shape ``stalled`` reads (those taken while it was declared)."""
    return [{"t": s["t"], **s["streams"][name]} for s in samples if name in (s.get("streams") or {})]


def stream_findings(samples: list[dict], starts: list[float], settings: Settings, now: float
                    ) -> dict[str, tuple[float, str]]:
    """Each declared stream whose query fails again and again, or whose slowest shard clock is still while its
    topic grows: ``{name: (since, detail)}``."""
    latest = (samples[-1].get("streams") or {}) if samples else {}
    found: dict[str, tuple[float, str]] = {}
    for name in sorted(latest):
        failing = latest[name].get("failing") or {}
        failures = failing.get("failures")
        if isinstance(failures, int) and failures >= settings.watchdog_stream_failures:
            since = failing.get("since")
            found[name] = (since if isinstance(since, int | float) else now,
                           f"stream {name}: its query failed {failures} times in a row "
                           f"(last: {str(failing.get('error') or 'no error given')[:200]})")
            continue
        started = latest[name].get("started_at")
        stuck = stalled(_of_stream(samples, name), [*starts, *([started] if started else [])], settings, now)
        if stuck.firing:
            found[name] = (stuck.since if stuck.since is not None else now, f"stream {name}: {stuck.detail}")
    return found


def stream(samples: list[dict], starts: list[float], settings: Settings, now: float) -> RuleStatus:
    """A declared stream's query failing again and again, or its slowest shard clock still while its topic grows."""
    found = stream_findings(samples, starts, settings, now).values()
    if not found:
        return RuleStatus(False)
    return RuleStatus(True, min(since for since, _ in found), "; ".join(detail for _, detail in found))


def clock(samples: list[dict], settings: Settings, now: float) -> RuleStatus:
    """A producer dated records ahead of the processing clock (beyond the tolerance) within the window."""
    marks = (samples[-1].get("clock_ahead") or []) if samples else []
    seen = [ClockAhead(**m) for m in marks if now - m["at"] <= settings.watchdog_window_s]
    if not seen:
        return RuleStatus(False)
    return RuleStatus(True, min(m.at for m in seen),
                      "; ".join(m.describe() for m in seen)
                      + f" (more than {settings.clock_tolerance_ms} ms: their windows wait for the clock, so these "
                        "alerts come late by that much; fix the producer's clock)")


def storage(samples: list[dict], settings: Settings, now: float) -> RuleStatus:
    """A stream's sink holding alerts handed over to be stored after their batch and storing none of them for
    ``watchdog_stall_s``: every sample since held some, and its stored total did not move (however much later
    batches add). Judged per stream: one that stores cannot hide another that does not."""
    latest = (samples[-1].get("handoff") or {}) if samples else {}
    found = []
    for name in sorted(latest):
        since = None
        before: list | None = None
        for sample in samples:
            counts = (sample.get("handoff") or {}).get(name)
            if counts is None:
                continue
            held, stored = counts
            if not held:
                since = None
            elif since is None or (before is not None and stored != before[1]):
                since = sample["t"]
            before = counts
        if since is not None and now - since >= settings.watchdog_stall_s:
            found.append((since, f"stream {name}: {latest[name][0]} evaluated alerts wait to be stored and none was "
                                 f"for {now - since:.0f} s"))
    if not found:
        return RuleStatus(False)
    return RuleStatus(True, min(since for since, _ in found),
                      "; ".join(detail for _, detail in found) + " (they reach nobody until they are; handoff_failed "
                      "in the evaluator's log says why, unless the evaluator is down)")


def samples_needed(settings: Settings) -> int:
    """How many of the newest samples the rules look at: their longest span, within the history kept."""
    span = max(settings.watchdog_stall_s, settings.watchdog_startup_s, settings.watchdog_window_s,
               settings.evaluator_stale_s)
    return min(math.ceil(span / settings.dashboard_sample_s) + 2, settings.dashboard_history)


def evaluate(samples: list[dict], starts: list[float], settings: Settings, now: float) -> dict[str, RuleStatus]:
    """Every rule's status from the samples (oldest first) and the job's start times."""
    return {
        "stalled": stalled(samples, starts, settings, now),
        "degraded": degraded(samples, settings, now),
        "restarting": restarting(starts, settings, now),
        "down": down(samples, settings, now),
        "catalog": catalog(samples, settings, now),
        "stream": stream(samples, starts, settings, now),
        "clock": clock(samples, settings, now),
        "storage": storage(samples, settings, now),
    }


def changes(open_incidents: dict[str, dict], statuses: dict[str, RuleStatus], now: float
            ) -> tuple[dict[str, dict], list[tuple[str, str, dict]]]:
    """The incidents open after ``statuses``, and each ``(rule, "firing"|"resolved", incident)`` to announce.

    An incident keeps the start it opened with while its rule goes on firing."""
    still_open: dict[str, dict] = {}
    announce: list[tuple[str, str, dict]] = []
    for rule, status in statuses.items():
        incident = open_incidents.get(rule)
        if status.firing:
            if incident is None:
                incident = {"since": status.since if status.since is not None else now, "detail": status.detail}
                announce.append((rule, "firing", incident))
            still_open[rule] = {**incident, "detail": status.detail}
        elif incident is not None:
            announce.append((rule, "resolved", {**incident, "resolved_at": now}))
    return still_open, announce


def notification(rule: str, state: str, incident: dict, now: float) -> dict:
    """An operator notification in the shape of every other (so e-mail and webhook render it alike)."""
    since_ms = int(incident["since"] * 1000)
    now_ms = int(now * 1000)
    alert: dict[str, Any] = {"alert_id": f"watchdog:{rule}:{since_ms}:{state}", "key": rule, "state": state, "value": None,
             "window_start": since_ms, "window_end": now_ms, "evaluated_at": now_ms}
    info = {"id": None, "name": f"Tocsin dead man's switch: {rule}", "condition": incident.get("detail", "")}
    return {**build_notification(info, [alert], notification_id([alert["alert_id"]])), "operator": True,
            "watchdog": {"rule": rule, "since": incident["since"], "detail": incident.get("detail", "")}}


def operator_targets(settings: Settings, client: redis.Redis) -> list[tuple[int, dict]]:
    """Where an incident goes, as (endpoint id, delivery binding): every operator account at its own address
    (``subscriptions.paging``; unless ``watchdog_email_operators`` is off) and the ``operator_endpoint_ids``.

    A database error propagates: the incident is then not recorded, so the next sample announces it again."""
    targets: list[tuple[int, dict]] = [(endpoint_id, {}) for endpoint_id in settings.operator_endpoint_ids]
    if settings.watchdog_email_operators:
        with session_scope(settings.database_url) as session:
            targets += [(endpoint.id, binding(endpoint)) for endpoint in operator_mailboxes(session, settings, client)
                        if endpoint.id not in settings.operator_endpoint_ids]
    return targets


def open_incidents(client: redis.Redis, settings: Settings) -> dict[str, dict]:
    """The incidents open now: ``{rule: {"since", "detail"}}`` (for the banner and the gauges)."""
    return {rule: json.loads(v) for rule, v in text_hash(client.hgetall(RedisKeys(settings).watchdog_state)).items()}


def job_starts(client: redis.Redis, settings: Settings) -> list[float]:
    return [float(s) for s in client.lrange(RedisKeys(settings).evaluator_starts, 0, -1)]


def watch(settings: Settings, client: redis.Redis, history: list[dict], celery: Celery | None,
          now: float | None = None) -> dict[str, RuleStatus]:
    """Judge the samples, record incidents opened or closed, and notify the operators of each once."""
    now = time.time() if now is None else now
    keys = RedisKeys(settings)
    statuses = evaluate(history, job_starts(client, settings), settings, now)
    still_open, announce = changes(open_incidents(client, settings), statuses, now)
    targets = operator_targets(settings, client) if announce and celery is not None else []
    outbox = Outbox(client, keys, settings)
    for rule, state, incident in announce:  # enqueued before the incident is recorded: a crash in between
        log.warning("watchdog", rule=rule, state=state, since=incident["since"], detail=incident.get("detail"))
        if celery is None:  # announces it again, with the same id, which the worker delivers once
            continue
        message = notification(rule, state, incident, now)
        for endpoint_id, bound in targets:
            enqueue(celery, outbox, message, endpoint_id, bound)
    pipe = client.pipeline()
    pipe.delete(keys.watchdog_state)
    if still_open:
        pipe.hset(keys.watchdog_state, mapping={r: json.dumps(i) for r, i in still_open.items()})
    pipe.execute()
    return statuses


def refresh_gauges(incidents: dict[str, dict], latest: dict[str, Any] | None) -> None:
    """The rules' states, when they were last judged and the evaluator's stream counters as Prometheus gauges, in
    every web process (those that do not sample too)."""
    for rule in RULES:
        incident = incidents.get(rule)
        RULE_FIRING.labels(rule).set(1 if incident else 0)
        RULE_SINCE.labels(rule).set(incident["since"] if incident else 0)
    JUDGED.set(latest["t"] if latest else 0)
    if latest:
        for name, gauge in STREAM.items():
            gauge.set(latest.get(name, 0) or 0)


def unwatched_since(latest: dict[str, Any] | None, settings: Settings, now: float) -> float | None:
    """When the dead man's switch last judged a sample (0.0: never), if that is ``UNWATCHED_PERIODS`` sampling
    periods ago or more: no web process samples (``TOCSIN_WEB_SAMPLER`` off in each, or sampling fails in each), so
    nothing would page if the evaluator stopped. None while it watches."""
    last = float(latest["t"]) if latest else 0.0
    return last if now - last >= UNWATCHED_PERIODS * settings.dashboard_sample_s else None


def banner(incidents: dict[str, dict]) -> list[dict]:
    """What the /ops banner lists: each firing rule, since when, and why."""
    return [{"rule": rule, "since": i["since"], "detail": i.get("detail", "")}
            for rule, i in sorted(incidents.items(), key=lambda kv: kv[1]["since"])]

