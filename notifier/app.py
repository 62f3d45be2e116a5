"""The Celery application: Redis broker, late acknowledgement, one task at a time per process.

Retries are re-sent with a countdown and held by a worker until due; the Redis
transport hands an unacknowledged message to another worker after the
visibility timeout, so that timeout must outlast the whole retry schedule, or a
slow retry would run twice.

Deliveries travel in two lanes, each a queue of its own: ``alerts`` (what the
dispatcher sends) and ``tests`` (the "send test alert" button), so test alerts,
however many are clicked, are served by their own workers and never take an
alert's worker thread. Backtests (``notifier.backtests``) have a third lane,
``backtests``: minutes of CPU each, served by a worker of their own at a lower
CPU priority. A worker started with ``python -m notifier.worker --lane all``
serves every lane. The lanes' queue names
live in ``core.redis_schema``, which the operators' dashboard reads too.
"""

from __future__ import annotations

from celery import Celery
from celery.signals import setup_logging
from kombu import Exchange, Queue

from core.logs import configure_logging
from core.redis_schema import LANES, celery_key_prefix, lane_queue
from core.settings import Settings, get_settings

DELIVER_TASK = "tocsin.deliver"
BACKTEST_TASK = "tocsin.backtest"  # notifier.backtests, on the lane of its name


@setup_logging.connect
def _structured_logging(**_: object) -> None:
    """A worker logs like every Tocsin process (``core.logs``): JSON lines, Celery's per-task chatter only from
    WARNING. Left to Celery, structlog's development renderer drew an unexpected error in a delivery as a rich
    traceback with every frame's locals: ~800 lines and 5-10 s of the worker per error (in CI a delivery's three
    failures outlasted their test's 30 s), with settings such as the Redis URL - password included - in the log."""
    configure_logging()


def lane_of(notification: dict) -> str:
    """The worker lane of a notification's deliveries: test alerts have their own."""
    return "tests" if notification.get("test") else "alerts"


def queue_for(celery: Celery, notification: dict) -> str:
    """The queue a notification's deliveries (and their retries) go to."""
    return celery.conf.tocsin_lanes[lane_of(notification)]


def make_celery(settings: Settings | None = None) -> Celery:
    settings = settings or get_settings()
    app = Celery("tocsin", broker=settings.broker_url, include=["notifier.tasks", "notifier.backtests"])

    def defaults() -> dict[str, object]:
        # Lazily, on first use of the configuration: the queues' names carry the deployment id, read from (and,
        # for a new database, written to) the database, which importing this module (for the task's name, or an
        # entry point's --help) must not open.
        lanes = {lane: lane_queue(settings, lane) for lane in LANES}
        return {
            "task_acks_late": True,
            "task_reject_on_worker_lost": True,
            "worker_prefetch_multiplier": 1,
            "task_serializer": "json",
            "accept_content": ["json"],
            "task_ignore_result": True,
            "task_default_queue": lanes["alerts"],
            "task_queues": [Queue(q, Exchange(q), routing_key=q) for q in lanes.values()],
            "tocsin_lanes": lanes,
            "broker_connection_retry_on_startup": True,
            "broker_transport_options": {
                "visibility_timeout": settings.delivery_visibility_timeout_s,
                "unacked_restore_interval": settings.delivery_restore_interval_s,
                "unacked_restore_throttle": 1,
                "global_keyprefix": celery_key_prefix(settings),
            },
            "worker_hijack_root_logger": False,
        }

    app.add_defaults(defaults)
    return app


app = make_celery()
