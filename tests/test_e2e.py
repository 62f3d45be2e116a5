"""Subscriptions made through the API (a threshold and a rank) fire signed webhooks from events flowing through Kafka
and Spark."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from core.settings import Settings
from devstack.receiver import WebhookReceiver
from devstack.services import python_module
from evaluator.spark.job import build_query
from ingest.kafka import ensure_topics
from ingest.model import Event
from ingest.publisher import EventPublisher
from notifier.channels.webhook import SIGNATURE_HEADER, verify
from tests.processes import running, worker_args
from tests.users import api_client, new_user

pytestmark = [pytest.mark.e2e, pytest.mark.spark]


def test_subscription_to_webhook(spark, settings: Settings, tmp_path: Path) -> None:
    ensure_topics(settings)
    receiver = WebhookReceiver()
    _, token = new_user(settings)
    with api_client(settings, token) as api:
        endpoint = api.post("/api/endpoints", json={"kind": "webhook", "target": receiver.url}).json()
        created = api.post(
            "/api/subscriptions",
            json={
                "name": "AAPL heavy volume",
                "condition": "SUM(volume) OVER 1m > 10000",
                "keys": ["AAPL"],
                "endpoint_ids": [endpoint["id"]],
            },
        )
        assert created.status_code == 201, created.text
        subscription = created.json()
        ranked = api.post("/api/subscriptions", json={"name": "busiest symbol", "condition": "SUM(volume) OVER 1m IN TOP 1",
                                                      "endpoint_ids": [endpoint["id"]]})
        assert ranked.status_code == 201, ranked.text

    query = build_query(spark, settings)
    try:
        with running(
            settings,
            tmp_path / "logs",
            ("worker", worker_args()),
            ("dispatcher", python_module("notifier.dispatcher")),
        ):
            now = int(time.time() * 1000) - 3_000  # events dated in the last 3 s, as a live feed's are
            with EventPublisher(settings) as publisher:
                for i in range(30):  # 30 x 500 = 15000 > 10000 within the minute; MSFT is not watched
                    publisher.publish(Event(key="AAPL", ts=now + i * 100, price=190.0, volume=500))
                    publisher.publish(Event(key="MSFT", ts=now + i * 100, price=410.0, volume=900))
                publisher.publish(Event(key="AAPL", ts=now + 3_000, price=190.5, volume=1))
                closes = now + 3_000 + settings.watermark_delay_ms + settings.pane_ms
                while (beat := min(int(time.time() * 1000), closes)) < closes:  # progress as time passes, never
                    publisher.heartbeat(beat)  # ahead of the clock (docs/clock.md)
                    publisher.flush()
                    time.sleep(0.25)
                publisher.heartbeat(closes)
            got = receiver.wait_for(lambda r: r.json["state"] == "firing"
                                    and r.json["subscription_id"] == subscription["id"], timeout_s=120)
            top = receiver.wait_for(lambda r: r.json["subscription_id"] == ranked.json()["id"], timeout_s=120)
    finally:
        query.stop()
        receiver.close()

    notification = got[0].json
    assert notification["subscription_id"] == subscription["id"]
    assert notification["condition"] == "SUM(volume) OVER 1m > 10000"
    [alert] = notification["alerts"]
    assert alert["key"] == "AAPL"
    assert alert["value"] > 10_000
    assert alert["window_end"] - alert["window_start"] == 60_000
    assert verify(endpoint["secret"], got[0].headers[SIGNATURE_HEADER], got[0].body)
    assert not verify("wrong-secret-wrong-secret", got[0].headers[SIGNATURE_HEADER], got[0].body)
    assert all(a["key"] == "AAPL" for r in receiver.received for a in r.json["alerts"]
               if r.json["subscription_id"] == subscription["id"])
    # the rank: MSFT (900 a trade) leads from the first second its trades are evaluated, at a whole number of them
    assert top[0].json["condition"] == "SUM(volume) OVER 1m IN TOP 1" and top[0].json["state"] == "firing"
    [(key, value)] = [(a["key"], a["value"]) for a in top[0].json["alerts"]]
    assert key == "MSFT" and value > 0 and value % 900 == 0
    assert len({r.json["notification_id"] for r in receiver.received}) == len(receiver.received)
