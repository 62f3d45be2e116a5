"""A tenant's own deliveries to one busy endpoint are served in turn, none starved (real worker, real receiver).

At 5 deliveries/s to an endpoint answering in 180 ms with a cap of one attempt at a
time, the endpoint is busy 90 % of the time. A delivery that found it busy and gave its
thread back came back, again and again, to find a newer delivery in the slot: one of 40
arrived 9-10 s late (2026-11-27). A delivery for a quick endpoint now waits for the slot
in its thread, briefly (``notifier.tasks.busy_wait_s``).
"""

from __future__ import annotations

import time

import pytest

from devstack.receiver import WebhookReceiver
from notifier.app import make_celery
from notifier.deliveries import binding, enqueue
from subscriptions.routing import EndpointRoute
from tests.notifier.test_isolation import _endpoint, _notification
from tests.processes import running, worker_args

pytestmark = pytest.mark.e2e

DELIVERIES = 40
RATE = 5.0  # per second
RECEIVER_S = 0.18


@pytest.mark.timeout(180)
def test_a_busy_quick_endpoint_serves_every_delivery_in_turn(settings, redis_client, tmp_path) -> None:
    settings = settings.model_copy(update={
        "delivery_endpoint_concurrency": 1, "delivery_owner_concurrency": 1, "delivery_busy_delay_s": 0.5})
    receiver = WebhookReceiver(latency_s=RECEIVER_S)
    endpoint = _endpoint(settings, redis_client, receiver.url)
    celery = make_celery(settings)
    enqueued: dict[str, float] = {}
    try:
        with running(settings, tmp_path / "logs", ("worker", worker_args("alerts", concurrency=4))):
            time.sleep(3)  # the worker is up
            for i in range(DELIVERIES):
                notification = _notification("turn", i)
                enqueued[notification["notification_id"]] = time.time()
                enqueue(celery, notification, endpoint.id, binding(EndpointRoute.of(endpoint)))
                time.sleep(1 / RATE)
            arrivals = receiver.wait_for(lambda r: True, count=DELIVERIES, timeout_s=60)
    finally:
        receiver.close()
    latencies = sorted(r.at - enqueued[r.json["notification_id"]] for r in arrivals)
    print(f"p50 {latencies[len(latencies) // 2]:.3f} s, max {latencies[-1]:.3f} s")
    assert len({r.json["notification_id"] for r in arrivals}) == DELIVERIES
    assert latencies[-1] < 3.0, f"a delivery waited {latencies[-1]:.2f} s for its own endpoint; {latencies}"
