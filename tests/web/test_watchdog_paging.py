"""Who the dead man's switch pages, on real components: with no operator endpoint configured, every operator
account gets an e-mail at its own address (a real SMTP server, aiosmtpd) through a real Celery worker; and the
subscribers of the stream whose evaluation went stale get one ``stale`` notice and, once it is fresh again, one
``stale_resolved`` notice at their endpoint (a real HTTP receiver), not one per sample."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis
from sqlalchemy import select

from core.settings import Settings
from devstack.mailsink import MailSink
from devstack.receiver import WebhookReceiver
from ingest.kafka import ensure_topics
from ingest.publisher import EventPublisher
from subscriptions.db import session_factory
from subscriptions.models import Endpoint
from tests.notifier.test_delivery import _eventually
from tests.processes import running, worker_args
from tests.users import api_client, new_user
from tests.web.test_watchdog import CLOCK, beat, publish
from web.stale import stale_streams
from web.watchdog import RuleStatus

pytestmark = pytest.mark.e2e


def test_operators_are_emailed_and_a_stale_streams_subscribers_hear_its_start_and_end(
        settings: Settings, redis_client: redis.Redis, tmp_path: Path) -> None:
    """Issue 31: without TOCSIN_OPERATOR_ENDPOINT_IDS an incident reached only the /ops banner, and subscribers of
    a stream nobody evaluated heard nothing at all."""
    ensure_topics(settings)
    sink, receiver = MailSink(), WebhookReceiver()
    operator, _ = new_user(settings, role="operator")
    _, token = new_user(settings)
    settings = settings.model_copy(update={
        "smtp_host": "127.0.0.1", "smtp_port": sink.bound_port, "web_sampler": True, "dashboard_sample_s": 0.2,
        "watchdog_stall_s": 2.0,
        "evaluator_stale_s": 3600.0})
    assert settings.operator_endpoint_ids == []

    def evaluator_beats(at: int) -> None:
        beat(redis_client, settings, at)

    def states() -> list[str]:
        return [r.json["state"] for r in receiver.received]

    try:
        with running(settings, tmp_path / "logs", ("worker", worker_args())), \
                EventPublisher(settings) as publisher, api_client(settings, token) as api:
            endpoint = api.post("/api/endpoints", json={"kind": "webhook", "target": receiver.url}).json()
            subscription = api.post("/api/subscriptions", json={
                "name": "heavy volume", "condition": "SUM(volume) OVER 1m > 10000",
                "endpoint_ids": [endpoint["id"]]}).json()
            paused = api.post("/api/subscriptions", json={
                "name": "paused", "condition": "SUM(volume) OVER 1m > 5", "endpoint_ids": [endpoint["id"]]}).json()
            assert api.post(f"/api/subscriptions/{paused['id']}/pause").status_code == 200

            def stalled() -> bool:
                evaluator_beats(CLOCK)
                publish(publisher, 5)
                return bool(receiver.received)

            _eventually(stalled, 60)
            [stale] = receiver.wait_for(lambda r: r.json["state"] == "stale")
            notice = stale.json
            assert notice["subscription_id"] == subscription["id"] and notice["subscription_name"] == "heavy volume"
            assert notice["stale"]["stream"] == "trades" and "shard clock stuck at" in notice["stale"]["detail"]
            [line] = notice["alerts"]
            assert line["key"] == "trades" and line["state"] == "stale" and "sequence" not in line
            [firing] = sink.wait_for(1, timeout_s=60)
            assert firing["To"] == operator.email
            assert firing["Subject"] == "[Tocsin] FIRING: Tocsin dead man's switch: stalled (stalled)"
            assert "shard clock stuck at" in firing.get_body(("plain",)).get_content()
            for _ in range(10):  # the same stale period goes on: nothing more is sent
                evaluator_beats(CLOCK)
                publish(publisher, 5)
                time.sleep(0.2)
            assert states() == ["stale"]

            def recovered() -> bool:
                evaluator_beats(CLOCK + int(time.time() * 1000) % 1_000_000)
                publish(publisher, 5)
                return len(receiver.received) == 2

            _eventually(recovered, 60)
            resolved = sink.wait_for(2, timeout_s=60)[1]
            time.sleep(1.0)
    finally:
        receiver.close()
        sink.close()
    assert states() == ["stale", "stale_resolved"], "one notice each way, none for the paused subscription"
    end = receiver.received[1].json
    assert end["stale"]["since"] == notice["stale"]["since"] and end["stale"]["resolved_at"] >= end["stale"]["since"]
    assert end["alerts"][0]["episode_id"] == line["alert_id"]
    assert end["notification_id"] != notice["notification_id"]
    assert resolved["Subject"] == "[Tocsin] RESOLVED: Tocsin dead man's switch: stalled (stalled)"
    assert len(sink.messages) == 2
    with session_factory(settings.database_url)() as session:  # where the e-mails went: an endpoint of its own
        mailbox = session.scalars(select(Endpoint).where(Endpoint.owner_id == operator.id)).one()
    assert (mailbox.kind, mailbox.target) == ("email", operator.email)


def _rules(**firing: RuleStatus) -> dict[str, RuleStatus]:
    return {"down": firing.get("down", RuleStatus(False)), "stalled": firing.get("stalled", RuleStatus(False))}


def test_which_streams_are_stale(settings: Settings) -> None:
    samples = [{"t": 0.0, "streams": {"hosts": {"clock": 1, "log_end": 0}, "idle": {"clock": 1, "log_end": 0}}}]
    assert stale_streams(samples, [], _rules(), settings, 10.0) == {}
    down = stale_streams(samples, [], _rules(down=RuleStatus(True, 5.0, "no heartbeat")), settings, 10.0)
    assert set(down) == {"trades", "hosts", "idle"} and down["hosts"].since == 5.0
    assert down["idle"].detail == "the evaluator is down: no heartbeat"
    assert set(stale_streams(samples, [], _rules(stalled=RuleStatus(True, 5.0, "stuck")), settings, 10.0)) == {"trades"}
    failing = [{"t": 0.0, "streams": {"hosts": {"failing": {"failures": 9, "since": 3.0, "error": "boom"}}}}]
    only = stale_streams(failing, [], _rules(), settings, 10.0)
    assert set(only) == {"hosts"} and only["hosts"].since == 3.0 and "failed 9 times" in only["hosts"].detail


def test_an_operator_at_its_endpoint_limit_is_skipped_and_the_others_are_paged(
        settings: Settings, redis_client: redis.Redis) -> None:
    from subscriptions.paging import operator_mailboxes
    from subscriptions.schemas import EndpointIn
    from subscriptions.service import SubscriptionService

    settings = settings.model_copy(update={"user_max_endpoints": 1})
    full, _ = new_user(settings, role="operator")
    other, _ = new_user(settings, role="operator")
    new_user(settings)  # not an operator: never paged
    with session_factory(settings.database_url)() as session:
        SubscriptionService(session, settings, redis_client, full).create_endpoint(
            EndpointIn(kind="webhook", target="http://127.0.0.1:9/hook"))
        first = operator_mailboxes(session, settings, redis_client)
        again = operator_mailboxes(session, settings, redis_client)
    assert [(m.owner_id, m.kind, m.target) for m in first] == [(other.id, "email", other.email)]
    assert again == first, "found again, not made twice"
