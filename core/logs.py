"""Structured logging for every process: JSON lines when not on a terminal.

Tocsin's own loggers log at INFO; third-party libraries (the Kafka client, py4j,
Celery's per-task chatter, uvicorn's access log, HTTP clients) only from WARNING,
so a log says what Tocsin did. ``TOCSIN_LOG_LEVEL`` sets one level for all of them
(``DEBUG`` to see everything).
"""

from __future__ import annotations

import logging
import os
import sys

import structlog

#: Loggers of libraries that are chatty at INFO.
THIRD_PARTY = ("kafka", "py4j", "celery", "kombu", "amqp", "uvicorn.access", "httpx", "httpcore", "urllib3",
               "asyncio", "aiosmtpd", "mail.log", "alembic", "pyspark")


def third_party_level() -> str:
    """WARNING unless ``TOCSIN_LOG_LEVEL`` asks for one level everywhere."""
    return os.environ.get("TOCSIN_LOG_LEVEL", "WARNING").upper()


def configure_logging(level: str | None = None) -> None:
    level_name = (level or os.environ.get("TOCSIN_LOG_LEVEL", "INFO")).upper()
    renderer = (
        structlog.dev.ConsoleRenderer(colors=False) if sys.stderr.isatty() else structlog.processors.JSONRenderer()
    )
    logging.basicConfig(level=level_name, format="%(message)s", stream=sys.stderr)
    for name in THIRD_PARTY:
        logging.getLogger(name).setLevel(level or third_party_level())
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level_name)),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
