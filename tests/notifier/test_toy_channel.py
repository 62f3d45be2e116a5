"""A new channel is one class in one file: the API takes its endpoints, the page lists it, test alerts go through it.

The toy channel below is everything docs/notifications.md's "How to add a channel" asks for;
the test registers it (a real channel module ends with ``register(...)`` instead)
and starts a real delivery worker that knows it: this module, run as
``python -m tests.notifier.test_toy_channel``, is that worker.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest
import redis
from fastapi.testclient import TestClient

from core.redis_schema import RedisKeys
from core.settings import Settings
from devstack.patience import patient
from devstack.services import python_module
from notifier.attempt import Attempt
from notifier.channels import EndpointKind, EndpointView, register, unregister
from notifier.deliveries import DeliveryRecords
from notifier.notification import Notification
from tests.processes import running, worker_args
from tests.users import api_client, new_user, sign_in


class ToyChannel:
    """Appends each notification, as one JSON line, to the file the endpoint names."""

    @staticmethod
    def check_target(target: str) -> str:
        if not Path(target).is_absolute():
            raise ValueError("must be an absolute file path")
        return target

    kind: ClassVar[EndpointKind] = EndpointKind(
        name="toy", label="toy file", check_target=check_target, has_secret=False,
        placeholder="/var/tmp/alerts.jsonl", help="An absolute file path; each notification becomes one JSON line.",
    )

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    @classmethod
    def longest_attempt_s(cls, settings: Settings) -> float:
        return 1.0

    def send(self, notification: Notification, endpoint: EndpointView) -> Attempt:
        started = time.perf_counter()
        with Path(endpoint.target).open("a") as lines:
            lines.write(json.dumps(notification.to_json()) + "\n")
        return Attempt(True, False, (time.perf_counter() - started) * 1000)


@pytest.fixture
def toy_channel() -> Iterator[None]:
    register(ToyChannel)
    yield
    unregister(ToyChannel.kind.name)


def test_a_channel_of_one_class_is_offered_accepted_and_delivers_test_alerts(
        toy_channel: None, api: TestClient, settings: Settings, redis_client: redis.Redis, tmp_path: Path) -> None:
    kinds = api.get("/api/endpoints/kinds").json()
    assert [k["name"] for k in kinds] == ["webhook", "email", "slack", "teams", "pagerduty", "toy"]  # by position: the default stays first
    refused = api.post("/api/endpoints", json={"kind": "toy", "target": "relative/alerts.jsonl"})
    assert refused.status_code == 422 and "absolute file path" in refused.text
    secret = api.post("/api/endpoints", json={"kind": "toy", "target": "/tmp/x", "secret": "s" * 20})
    assert secret.status_code == 422 and "toy file endpoints take no secret" in secret.text

    target = tmp_path / "alerts.jsonl"
    created = api.post("/api/endpoints", json={"kind": "toy", "target": str(target)})
    assert created.status_code == 201 and created.json()["kind"] == "toy" and created.json()["secret"] is None
    eid = created.json()["id"]
    assert api.post(f"/api/endpoints/{eid}/rotate-secret").status_code == 422

    user, _ = new_user(settings)
    with api_client(settings) as browser:
        sign_in(browser, user.email)
        page = browser.get("/endpoints", headers={"accept": "text/html"}).text
        assert '<option value="toy" >toy file</option>' in page and ToyChannel.kind.help in page

    toy_worker = python_module(__name__, *worker_args()[3:])  # the worker's options, this module as the program
    with running(settings, tmp_path / "logs", ("worker", toy_worker)):
        queued = api.post(f"/api/endpoints/{eid}/test")
        assert queued.status_code == 202
        deadline = time.monotonic() + patient(60)
        while not (target.exists() and target.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
    [line] = target.read_text().splitlines()
    delivered = Notification.from_json(json.loads(line))
    assert delivered.notification_id == queued.json()["notification_id"] and delivered.test
    assert delivered.keys == ["TEST"]
    [entry] = DeliveryRecords(redis_client, RedisKeys(settings)).endpoint_log(eid)
    assert entry["kind"] == "toy" and entry["outcome"] == "delivered"


def test_a_kind_no_worker_serves_is_dead_lettered_not_sent_some_other_way(
        toy_channel: None, api: TestClient, settings: Settings, redis_client: redis.Redis, tmp_path: Path) -> None:
    target = tmp_path / "alerts.jsonl"
    eid = api.post("/api/endpoints", json={"kind": "toy", "target": str(target)}).json()["id"]
    records = DeliveryRecords(redis_client, RedisKeys(settings))
    with running(settings, tmp_path / "logs", ("worker", worker_args())):  # a plain worker: no toy channel
        assert api.post(f"/api/endpoints/{eid}/test").status_code == 202
        deadline = time.monotonic() + patient(60)
        while not records.dead_letters() and time.monotonic() < deadline:
            time.sleep(0.05)
    [letter] = records.dead_letters()
    assert letter["error"] == "no channel for kind 'toy'" and letter["kind"] == "toy" and letter["attempt"] == 1
    assert not target.exists()


if __name__ == "__main__":  # a delivery worker that also knows the toy channel
    from notifier.worker import main

    register(ToyChannel)
    main(sys.argv[1:])
