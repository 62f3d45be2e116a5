"""Per-alert delivery order through a real dispatcher, a real worker and real receivers (issue 30, item 2).

A subscription flaps over several keys to a webhook and a PagerDuty endpoint of one owner, both busy
(each request takes a while), at the default caps: two endpoints of two slots each share the owner's
three, so deliveries keep finding a cap full and are deferred. Whatever happens to one delivery,
no receiver may get a key's transition before an earlier one of the same key.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from core.settings import Settings
from devstack.receiver import Received, WebhookReceiver
from devstack.services import ManagedProcess, python_module, spawn
from evaluator.spark.sink import RedisAlertSink
from evaluator.transition import alert_id
from subscriptions.db import session_factory
from subscriptions.schemas import EndpointIn, SubscriptionIn
from subscriptions.service import SubscriptionService
from tests.notifier.receivers import PagerDuty
from tests.processes import worker_args

pytestmark = pytest.mark.e2e

ROUTING_KEY = "R0uting" + "k" * 25
START = 1_700_000_000_000  # evaluated_at of the first evaluation (epoch ms)


@dataclass
class Flapping:
    """Key ``k`` is firing at evaluation ``e`` when ``e + k`` is odd, resolved when even (never resolved first):
    every evaluation fires half the keys and resolves the other half, so a grouped notification's keys share
    their chains with the notifications before and after it. The last evaluation resolves every key."""

    subscription_id: int
    keys: int
    evaluations: int
    written: dict[str, tuple[str, int]] = field(default_factory=dict)  # alert id -> (key, evaluated_at)
    resolve_of: dict[str, int] = field(default_factory=dict)  # a firing's alert id -> evaluated_at of its resolve
    open: dict[str, str] = field(default_factory=dict)  # key -> alert id of its firing not resolved yet

    def transitions(self, e: int) -> list[dict]:
        at = START + e * 1_000
        rows = []
        for k in range(self.keys):
            key = f"K{k}"
            state = "resolved" if e == self.evaluations - 1 or (e + k) % 2 == 0 else "firing"
            if (state == "resolved") != (key in self.open):
                continue
            aid = alert_id(self.subscription_id, key, state, at)
            if state == "resolved":
                self.resolve_of[self.open.pop(key)] = at
            else:
                self.open[key] = aid
            self.written[aid] = (key, at)
            rows.append({"alert_id": aid, "subscription_id": self.subscription_id, "key": key, "state": state,
                         "value": 1.0, "window_start": at - 60_000, "window_end": at, "evaluated_at": at})
        return rows


def webhook_inversions(arrivals: list[Received]) -> list[str]:
    """Per key, every alert must arrive no earlier in the evaluator's order than one that arrived before it
    (a redelivered copy of the same alert may come again, never one older than what already came)."""
    newest: dict[str, int] = {}
    wrong = []
    for got in arrivals:
        for alert in got.json["alerts"]:
            key, at = alert["key"], alert["evaluated_at"]
            if at < newest.get(key, at):
                wrong.append(f"{key}: {alert['state']} of {at} after {newest[key]}")
            newest[key] = max(newest.get(key, at), at)
    return wrong


def pagerduty_inversions(arrivals: list[Received], flapping: Flapping) -> list[str]:
    """Per key, in the evaluator's order (a trigger's episode is its firing, a resolve's is its firing's resolve)."""
    newest: dict[str, int] = {}
    wrong = []
    for got in arrivals:
        event = got.json
        key, fired_at = flapping.written[event["dedup_key"]]
        at = fired_at if event["event_action"] == "trigger" else flapping.resolve_of[event["dedup_key"]]
        if at < newest.get(key, at):
            wrong.append(f"{key}: {event['event_action']} of {at} after {newest[key]}")
        newest[key] = max(newest.get(key, at), at)
    return wrong


@dataclass
class Run:
    settings: Settings
    log_dir: Path
    processes: list[ManagedProcess] = field(default_factory=list)

    def start(self, name: str, args: list[str]) -> ManagedProcess:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        process = spawn(name, args, self.log_dir / f"{name}-{len(self.processes)}.log", env=self.settings.to_env())
        self.processes.append(process)
        return process

    def stop(self) -> None:
        for process in self.processes:
            process.stop()


def flap(settings: Settings, redis_client: redis.Redis, owner, log_dir: Path, keys: int, evaluations: int,
         period_s: float, kill_worker_at: int | None = None, restart_dispatcher_at: int | None = None,
         timeout_s: float = 240.0) -> None:
    """Write the flapping transitions one evaluation every ``period_s``, the worker SIGKILLed (and another started)
    and the dispatcher stopped and started again at the given evaluations; then check every receiver's order."""
    # A waiting delivery sleeps (unless woken) at most half the visibility timeout, which conftest keeps at ~5 s
    # for the restore tests: that would have every waiting delivery look every 2.5 s.
    settings = settings.model_copy(update={"delivery_visibility_margin_s": 20.0})
    # The first requests refused, the Events API's as rate-limited: those deliveries are retried.
    hook = WebhookReceiver(latency_s=0.15, fail_first=4, fail_status=503)
    events_api = PagerDuty()
    pagerduty = WebhookReceiver(answer=events_api, latency_s=0.03, fail_first=6, fail_status=429, retry_after="1")
    run = Run(settings, log_dir)
    try:
        with session_factory(settings.database_url)() as session:
            service = SubscriptionService(session, settings, redis_client, owner)
            endpoints = [service.create_endpoint(EndpointIn(kind="webhook", target=hook.url)).id,
                         service.create_endpoint(EndpointIn(kind="pagerduty", target=pagerduty.url,
                                                            secret=ROUTING_KEY)).id]
            subscription = service.create(SubscriptionIn(name="flapping", condition="SUM(volume) OVER 1m > 100",
                                                         endpoint_ids=endpoints)).id  # the default policy
        flapping = Flapping(subscription, keys, evaluations)
        sink = RedisAlertSink(settings)
        worker = run.start("worker", worker_args("alerts"))
        dispatcher = run.start("dispatcher", python_module("notifier.dispatcher"))
        for e in range(evaluations):
            if e == kill_worker_at:
                worker.kill()
                worker = run.start("worker", worker_args("alerts"))
            if e == restart_dispatcher_at:
                dispatcher.kill()
                dispatcher = run.start("dispatcher", python_module("notifier.dispatcher"))
            sink.write(flapping.transitions(e))
            if e == 0:  # the worker and the dispatcher are up
                hook.wait_for(lambda r: True, timeout_s=60)
            time.sleep(period_s)
        written = time.monotonic()
        deadline = written + timeout_s
        while time.monotonic() < deadline and not _all_arrived(flapping, hook, pagerduty):
            time.sleep(0.2)
        drained_s = time.monotonic() - written
        time.sleep(1)  # what else would come, late
    finally:
        run.stop()
        hook.close()
        pagerduty.close()
    print(f"{len(flapping.resolve_of)} episodes: {len(hook.received)} webhooks, {len(pagerduty.received)} PagerDuty "
          f"events for {len(flapping.written)} transitions, the last {drained_s:.1f} s after the last was written")
    assert _all_arrived(flapping, hook, pagerduty), f"not every transition arrived: {_missing(flapping, hook, pagerduty)}"
    assert webhook_inversions(hook.received) == []
    assert pagerduty_inversions(pagerduty.received, flapping) == []
    assert not events_api.rejected
    assert set(events_api.incidents) == set(flapping.resolve_of)
    assert [i.dedup_key for i in events_api.incidents.values() if i.status != "resolved"] == []


def _missing(flapping: Flapping, hook: WebhookReceiver, pagerduty: WebhookReceiver) -> dict[str, list[str]]:
    """What has not arrived yet: per receiver, ``key state evaluated_at alert_id`` of each transition missing."""
    hooked = {alert["alert_id"] for got in list(hook.received) for alert in got.json["alerts"]}
    events = {(got.json["event_action"], got.json["dedup_key"]) for got in list(pagerduty.received)}
    missing: dict[str, list[str]] = {"webhook": [], "pagerduty": []}
    for aid, (key, at) in sorted(flapping.written.items(), key=lambda item: item[1][1]):
        if aid not in hooked:
            missing["webhook"].append(f"{key} {at} {aid}")
    for firing, resolved_at in flapping.resolve_of.items():
        key, fired_at = flapping.written[firing]
        missing["pagerduty"] += [f"{key} {action} {at} {firing}" for action, at in
                                 (("trigger", fired_at), ("resolve", resolved_at)) if (action, firing) not in events]
    return missing


def _all_arrived(flapping: Flapping, hook: WebhookReceiver, pagerduty: WebhookReceiver) -> bool:
    """Every transition in a webhook, and every episode's trigger and resolve at PagerDuty."""
    return not any(_missing(flapping, hook, pagerduty).values())


def test_a_flapping_subscription_to_busy_receivers_is_delivered_in_order(settings, redis_client, owner,
                                                                         tmp_path) -> None:
    flap(settings, redis_client, owner, tmp_path / "logs", keys=4, evaluations=30, period_s=0.1)


@pytest.mark.jvm  # one heavy test at a time (a CI-mode run had test_isolation over its p99 bound, likely beside it)
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_500_episodes_in_order(settings, redis_client, owner, tmp_path) -> None:
    flap(settings, redis_client, owner, tmp_path / "logs", keys=10, evaluations=101, period_s=0.1)


@pytest.mark.jvm  # one heavy test at a time (a CI-mode run had test_isolation over its p99 bound, likely beside it)
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_500_episodes_in_order_through_a_worker_killed_and_a_dispatcher_restarted(settings, redis_client, owner,
                                                                                  tmp_path) -> None:
    settings = settings.model_copy(update={"webhook_total_timeout_s": 3.0, "pagerduty_attempt_timeout_s": 3.0})
    flap(settings, redis_client, owner, tmp_path / "logs", keys=10, evaluations=101, period_s=0.1,
         kill_worker_at=60, restart_dispatcher_at=30)
