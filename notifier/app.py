"""The Celery application: Redis broker, late acknowledgement, one task at a time per process."""

from __future__ import annotations

from celery import Celery

from infra.settings import Settings, get_settings


def backoff_schedule_s(settings: Settings) -> float:
    """Worst-case total of all retry delays: the broker must not redeliver sooner."""
    return sum(
        min(settings.webhook_backoff_base_s * 2**n, settings.webhook_backoff_max_s)
        for n in range(settings.webhook_max_retries + 1)
    )


def make_celery(settings: Settings | None = None) -> Celery:
    settings = settings or get_settings()
    app = Celery("tocsin", broker=settings.broker_url, include=["notifier.tasks"])
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        task_default_queue=settings.redis_key("deliveries"),
        broker_connection_retry_on_startup=True,
        broker_transport_options={
            "visibility_timeout": int(backoff_schedule_s(settings) + 3600),
            "global_keyprefix": settings.redis_key("celery") + ":",
        },
        worker_hijack_root_logger=False,
    )
    return app


app = make_celery()
