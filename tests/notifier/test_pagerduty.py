"""PagerDuty Events v2 against a local Events API that checks each event's shape and keeps incidents by dedup_key."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
import redis

from core.redis_schema import RedisKeys
from core.settings import Settings
from devstack.receiver import WebhookReceiver
from evaluator.spark.sink import RedisAlertSink
from evaluator.transition import alert_id
from notifier.channels import EndpointView
from notifier.channels.pagerduty import PagerDutyChannel
from notifier.deliveries import DeliveryRecords
from notifier.dispatcher import Dispatcher
from notifier.notification import Notification
from notifier.policy import KeyState, decide
from subscriptions.db import session_factory
from subscriptions.policy import AlertPolicy
from subscriptions.schemas import EndpointIn, SubscriptionIn
from subscriptions.service import SubscriptionService
from subscriptions.templating import sample_notification
from tests.notifier.receivers import PagerDuty
from tests.processes import running, worker_args

SETTINGS = Settings(webhook_allow_hosts=["127.0.0.1"], webhook_total_timeout_s=5)
ROUTING_KEY = "R0uting" + "k" * 25


@pytest.fixture
def pagerduty() -> Iterator[tuple[WebhookReceiver, PagerDuty]]:
    events_api = PagerDuty()
    receiver = WebhookReceiver(answer=events_api)
    yield receiver, events_api
    receiver.close()


def _endpoint(url: str, template: str | None = None, key: str | None = ROUTING_KEY) -> EndpointView:
    return EndpointView("pagerduty", url, key, owner_id=1, generation="g", id=9, template=template)


def test_each_alert_triggers_its_own_incident_with_the_documented_fields(pagerduty) -> None:
    receiver, events_api = pagerduty
    attempt = PagerDutyChannel(SETTINGS).send(Notification.from_json(sample_notification()), _endpoint(receiver.url))
    assert attempt.ok and attempt.status_code == 202 and not events_api.rejected
    first, second = (r.json for r in receiver.received)
    assert first["routing_key"] == ROUTING_KEY and first["event_action"] == "trigger"
    assert first["dedup_key"] == "sample-aapl-firing" and second["dedup_key"] == "sample-msft-firing"
    payload = first["payload"]
    assert payload["summary"] == "High volume: AAPL = 2.514e+06 (SUM(volume) OVER 5m > 2e6)"
    assert payload["source"] == "AAPL" and payload["severity"] == "error"
    assert payload["timestamp"] == "2026-01-01T00:00:00.000+00:00"
    assert payload["custom_details"]["condition"] == "SUM(volume) OVER 5m > 2e6"
    assert [r.json["payload"]["custom_details"]["sequence"] for r in receiver.received] == [7, 3]
    assert sorted(events_api.incidents) == ["sample-aapl-firing", "sample-msft-firing"]


def test_a_templated_summary_is_cut_at_1024_characters(pagerduty) -> None:
    receiver, events_api = pagerduty
    template = "{{ alert.key }} {% for i in range(300) %}{{ subscription.name }}{% endfor %}"
    assert PagerDutyChannel(SETTINGS).send(Notification.from_json(sample_notification()),
                                           _endpoint(receiver.url, template)).ok
    summaries = [r.json["payload"]["summary"] for r in receiver.received]
    assert [len(s) for s in summaries] == [1024, 1024] and summaries[0].startswith("AAPL High volume")
    assert summaries[0].endswith("…") and not events_api.rejected


def test_a_resolution_carrying_its_episode_resolves_the_incident_its_firing_opened(pagerduty) -> None:
    receiver, events_api = pagerduty
    channel = PagerDutyChannel(SETTINGS)
    firing = sample_notification()
    assert channel.send(Notification.from_json(firing), _endpoint(receiver.url)).ok
    resolved = sample_notification("resolved")
    resolved["alerts"] = [{**resolved["alerts"][0], "episode_id": firing["alerts"][0]["alert_id"]}]
    assert channel.send(Notification.from_json(resolved), _endpoint(receiver.url)).ok
    assert receiver.received[-1].json == {"routing_key": ROUTING_KEY, "event_action": "resolve",
                                          "dedup_key": "sample-aapl-firing"}
    assert events_api.incidents["sample-aapl-firing"].status == "resolved"
    assert events_api.incidents["sample-msft-firing"].status == "triggered"


@pytest.mark.parametrize(("status", "retryable"), [(429, True), (502, True), (400, False)])
def test_refusals_are_classified_and_name_the_event(status: int, retryable: bool) -> None:
    receiver = WebhookReceiver(fail_first=1, fail_status=status)
    try:
        attempt = PagerDutyChannel(SETTINGS).send(Notification.from_json(sample_notification()),
                                                  _endpoint(receiver.url))
    finally:
        receiver.close()
    assert not attempt.ok and attempt.retryable is retryable and attempt.status_code == status
    assert (attempt.error or "").startswith("event 1 of 2 (trigger): HTTP") and ROUTING_KEY not in (attempt.error or "")
    assert receiver.attempts == 1  # stopped at the first refusal; a retry sends every event again


def test_the_episode_is_the_firing_alert_id_and_survives_the_resolution() -> None:
    policy = AlertPolicy()
    reason, opened = decide(policy, KeyState(), "firing", 100.0, "fire-1")
    assert reason is None and opened.episode == "fire-1"
    reason, closed = decide(policy, KeyState.from_dict(opened.to_dict()), "resolved", 200.0, "resolve-1")
    assert reason is None and closed.episode == "fire-1" and not closed.open
    assert KeyState.from_dict({"notified_at": 1.0, "open": True}).episode is None  # state stored before episodes


@pytest.mark.e2e
def test_through_the_dispatcher_a_resolve_closes_the_incident_its_firing_opened(
        settings: Settings, redis_client: redis.Redis, owner, tmp_path, pagerduty) -> None:
    receiver, events_api = pagerduty
    with session_factory(settings.database_url)() as session:
        service = SubscriptionService(session, settings, redis_client, owner)
        created = service.create_endpoint(EndpointIn(kind="pagerduty", target=receiver.url, secret=ROUTING_KEY))
        assert created.secret is None  # the routing key is the user's: never shown back
        subscription = service.create(SubscriptionIn(name="volume", condition="SUM(volume) OVER 1m > 100",
                                                     endpoint_ids=[created.id],  # grouped, the default
                                                     policy={"renotify_s": 60})).id

    def transition(key: str, state: str, at: int) -> dict:
        return {"alert_id": alert_id(subscription, key, state, at), "subscription_id": subscription, "key": key,
                "state": state, "value": 150.0, "window_start": at - 60_000, "window_end": at, "evaluated_at": at}

    dispatcher = Dispatcher(settings)
    t1, t2 = 1_700_000_060_000, 1_700_000_120_000
    with running(settings, tmp_path / "logs", ("worker", worker_args())):
        RedisAlertSink(settings).write([transition("AAPL", "firing", t1), transition("MSFT", "firing", t1)])
        dispatcher.read(block_ms=100)
        dispatcher.flush(force=True)
        receiver.wait_for(lambda r: r.json["event_action"] == "trigger", count=2)
        RedisAlertSink(settings).write([transition("AAPL", "resolved", t2)])
        dispatcher.read(block_ms=100)
        dispatcher.flush(force=True)
        receiver.wait_for(lambda r: r.json["event_action"] == "resolve")
        opened = alert_id(subscription, "AAPL", "firing", t1)
        msft = alert_id(subscription, "MSFT", "firing", t1)
        assert events_api.incidents[opened].status == "resolved"
        assert events_api.incidents[msft].status == "triggered"

        # MSFT stays firing: its reminder re-triggers the open incident, and its resolution closes it.
        keys = RedisKeys(settings)
        state = json.loads(redis_client.hget(keys.key_states(subscription), "MSFT"))
        assert state["episode"] == msft
        redis_client.hset(keys.key_states(subscription), "MSFT",
                          json.dumps({**state, "notified_at": time.time() - 61}))
        with session_factory(settings.database_url)() as session:
            assert dispatcher.remind(session) == 1
        receiver.wait_for(lambda r: r.json["event_action"] == "trigger", count=3)
        RedisAlertSink(settings).write([transition("MSFT", "resolved", t2 + 60_000)])
        dispatcher.read(block_ms=100)
        dispatcher.flush(force=True)
        receiver.wait_for(lambda r: r.json["event_action"] == "resolve", count=2)
        time.sleep(0.5)
    assert not events_api.rejected
    assert alert_id(subscription, "AAPL", "resolved", t2) != opened  # why the episode is tracked
    assert events_api.incidents[msft].status == "resolved" and events_api.incidents[msft].events == 3
    # Each key's notifications numbered in order, the reminder too (AAPL's resolve was 2, MSFT's is 3).
    assert sorted((r.json["payload"]["source"], r.json["payload"]["custom_details"]["sequence"])
                  for r in receiver.received if r.json["event_action"] == "trigger") == [
        ("AAPL", 1), ("MSFT", 1), ("MSFT", 2)]
    assert len(events_api.incidents) == 2
    log = DeliveryRecords(redis_client, RedisKeys(settings)).endpoint_log(created.id)
    assert sorted(entry["outcome"] for entry in log) == ["delivered"] * 4


def test_a_failing_summary_template_sends_the_default_summaries_and_records_why(pagerduty) -> None:
    receiver, events_api = pagerduty
    attempt = PagerDutyChannel(SETTINGS).send(Notification.from_json(sample_notification()),
                                              _endpoint(receiver.url, "{{ alert.key }} {{ alerts[5] }}"))
    assert attempt.ok and "message template failed (line 1:" in (attempt.error or "")
    assert [r.json["payload"]["summary"] for r in receiver.received] == [
        "High volume: AAPL = 2.514e+06 (SUM(volume) OVER 5m > 2e6)",
        "High volume: MSFT = 2.0715e+06 (SUM(volume) OVER 5m > 2e6)"]
    assert not events_api.rejected


def test_an_endpoint_without_its_routing_key_is_refused_for_good(pagerduty) -> None:
    receiver, _ = pagerduty
    attempt = PagerDutyChannel(SETTINGS).send(Notification.from_json(sample_notification()),
                                              _endpoint(receiver.url, key=None))
    assert not attempt.ok and not attempt.retryable and not receiver.received


def test_a_re_handled_resolution_finds_its_episode_in_the_stored_decision(settings: Settings) -> None:
    dispatcher = Dispatcher(settings)  # its decisions and key states in real Redis
    firing = {"alert_id": "fire-1", "key": "AAPL", "state": "firing"}
    resolved = {"alert_id": "resolve-1", "key": "AAPL", "state": "resolved"}
    policy = AlertPolicy()
    dispatcher.decide(7, policy, [firing])
    assert firing["episode_id"] == "fire-1"
    first = dispatcher.decide(7, policy, [resolved])
    assert resolved["episode_id"] == "fire-1"
    again = {"alert_id": "resolve-1", "key": "AAPL", "state": "resolved"}  # read anew after a restart
    assert dispatcher.decide(7, policy, [again]) == first and again["episode_id"] == "fire-1"


def test_a_stale_notice_opens_an_incident_and_its_end_resolves_it(pagerduty) -> None:
    from notifier.notification import STALE, STALE_RESOLVED, stale_notice

    receiver, events_api = pagerduty
    channel = PagerDutyChannel(SETTINGS)
    subscription = {"id": 4, "name": "hot hosts", "condition": "AVG(cpu) OVER 1m > 90"}
    start = stale_notice(subscription, "hosts", STALE, 100.0, "the evaluator is down", 130.0)
    assert channel.send(start, _endpoint(receiver.url)).ok
    assert receiver.received[-1].json["event_action"] == "trigger"
    assert events_api.incidents["stale:4:hosts:100000"].status == "triggered"
    assert channel.send(stale_notice(subscription, "hosts", STALE_RESOLVED, 100.0, "the evaluator is down", 190.0),
                        _endpoint(receiver.url)).ok
    assert receiver.received[-1].json == {"routing_key": ROUTING_KEY, "event_action": "resolve",
                                          "dedup_key": "stale:4:hosts:100000"}
    assert events_api.incidents["stale:4:hosts:100000"].status == "resolved"
