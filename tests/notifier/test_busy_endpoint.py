"""A delivery waiting in its thread for its own quick endpoint never costs other tenants their bound (real worker,
real receivers).

A delivery whose own endpoint is full and quick waits for the slot in its thread, briefly, in
a spare slot of its owner (``notifier.tasks.busy_wait_s``; the wait itself is checked in
``tests/notifier/test_records.py``). Here a tenant floods its own receiver, answering just
quickly enough to be waited for, while another tenant's deliveries must stay within the
docs/notifications.md's isolation bound.
"""

from __future__ import annotations

import time

import pytest

from core.redis_schema import RedisKeys
from devstack.receiver import WebhookReceiver
from notifier.app import make_celery
from notifier.deliveries import binding, enqueue
from notifier.outbox import Outbox
from subscriptions.routing import EndpointRoute
from tests.notifier.test_isolation import _endpoint, _notification
from tests.processes import running, worker_args

pytestmark = pytest.mark.e2e

RATE = 5.0  # the other tenant's deliveries per second


@pytest.mark.timeout(240)
@pytest.mark.parametrize("owner_cap", [1, 2])  # 1: failed before (every thread waited); 2: one may wait
def test_a_flood_to_one_quick_endpoint_holds_no_more_threads_than_its_owner_cap(settings, redis_client, tmp_path,
                                                                                owner_cap: int) -> None:
    """Waiting in the thread counts against the owner's cap, so the isolation bound holds against a tenant whose
    receiver answers just quickly enough to be waited for (found in review: 120 deliveries to a 240 ms receiver
    left another tenant at p50 12.9 s, max 16.6 s, when every thread that took one waited up to 0.48 s)."""
    settings = settings.model_copy(update={
        "webhook_total_timeout_s": 2.0, "delivery_endpoint_concurrency": 1, "delivery_owner_concurrency": owner_cap,
        "delivery_busy_delay_s": 0.5, "delivery_visibility_margin_s": 60})
    bound_s = settings.webhook_total_timeout_s + 1.0  # docs/notifications.md, "The bound": 4 threads, 1 flooding tenant
    flooded, normal = WebhookReceiver(latency_s=0.24), WebhookReceiver()
    flooded_ep, normal_ep = (_endpoint(settings, redis_client, r.url) for r in (flooded, normal))
    celery = make_celery(settings)
    outbox = Outbox(redis_client, RedisKeys(settings), settings)
    enqueued: dict[str, float] = {}

    def other_tenant(phase: str) -> list[float]:
        """The other tenant's 20 deliveries at RATE per second: each one's latency, enqueue to receipt, sorted."""
        for i in range(20):
            notification = _notification(phase, i)
            enqueued[notification["notification_id"]] = time.time()
            enqueue(celery, outbox, notification, normal_ep.id, binding(EndpointRoute.of(normal_ep)))
            time.sleep(1 / RATE)
        arrivals = normal.wait_for(lambda r: r.json["subscription_name"] == phase, count=20, timeout_s=120)
        return sorted(r.at - enqueued[r.json["notification_id"]] for r in arrivals)

    try:
        with running(settings, tmp_path / "logs", ("worker", worker_args("alerts", concurrency=4))):
            time.sleep(3)  # the worker is up
            alone = other_tenant("alone")  # what this machine, as busy as it is now, takes without the flood
            enqueue(celery, outbox, _notification("seed", 0), flooded_ep.id, binding(EndpointRoute.of(flooded_ep)))
            flooded.wait_for(lambda r: True, count=1, timeout_s=30)
            time.sleep(0.5)  # its 240 ms is on record: quick enough to be waited for
            for i in range(120):
                enqueue(celery, outbox, _notification("flood", i), flooded_ep.id, binding(EndpointRoute.of(flooded_ep)))
            flood = other_tenant("normal")
    finally:
        flooded.close()
        normal.close()
    print(f"other tenant alone: p50 {alone[10]:.3f} s, max {alone[-1]:.3f} s; "
          f"beside the flood: p50 {flood[10]:.3f} s, max {flood[-1]:.3f} s")
    # What the flood adds to the other tenant's latency, over what the machine takes without it: on an idle
    # machine the max stays within the bound; a busy one (CI at load 7 saw 1.5 s for a lone delivery) stretches the
    # tail, so the tail is given twice the bound. Failing the cap waited p50 12.9 s, max 16.6 s (docstring).
    assert flood[10] - alone[10] < bound_s, f"the flood added {flood[10] - alone[10]:.2f} s at p50; {flood} / {alone}"
    assert flood[-1] - alone[-1] < 2 * bound_s, f"the flood added {flood[-1] - alone[-1]:.2f} s at most; {flood}"
