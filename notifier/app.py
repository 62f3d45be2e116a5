"""The Celery application: Redis broker, late acknowledgement, one task at a time per process.

Retries are re-sent with a countdown and held by a worker until due; the Redis
transport hands an unacknowledged message to another worker after the
visibility timeout, so that timeout must outlast the whole retry schedule, or a
slow retry would run twice.
"""

from __future__ import annotations

from celery import Celery

from infra.settings import Settings, get_settings

DELIVER_TASK = "tocsin.deliver"


def make_celery(settings: Settings | None = None) -> Celery:
    settings = settings or get_settings()
    app = Celery("tocsin", broker=settings.broker_url, include=["notifier.tasks"])
    # Lazily: the queue's name carries the deployment id, read from the database, which importing
    # this module (for the task's name) must not open.
    app.add_defaults(lambda: dict(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        task_default_queue=settings.redis_key("deliveries"),
        broker_connection_retry_on_startup=True,
        broker_transport_options={
            "visibility_timeout": int(settings.delivery_retry_schedule_s + settings.delivery_visibility_margin_s),
            "unacked_restore_interval": settings.delivery_restore_interval_s,
            "unacked_restore_throttle": 1,
            "global_keyprefix": settings.redis_key("celery") + ":",
        },
        worker_hijack_root_logger=False,
    ))
    return app


app = make_celery()
