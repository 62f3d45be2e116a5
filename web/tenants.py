"""One account cannot starve the others.

The requests of a web process share its database connections (``web_db_pool_size`` +
``web_db_max_overflow``). A request that finds every one in use waits at most
``web_db_pool_timeout_s`` (SQLAlchemy waits 30 s by default), then gets :func:`database_busy`,
a 503 with ``Retry-After``, never a 500: 60 parallel requests of one account took the whole pool,
and another account's requests waited 30 s, then got a 500.
"""

from __future__ import annotations

import prometheus_client
from fastapi import HTTPException, status

from core.settings import Settings

DATABASE_BUSY = prometheus_client.Counter(
    "tocsin_database_busy_total", "Requests answered 503: no database connection was free within web_db_pool_timeout_s")


def database_busy(settings: Settings) -> HTTPException:
    """A 503 for a request that found no database connection free within ``web_db_pool_timeout_s``."""
    DATABASE_BUSY.inc()
    retry = settings.busy_retry_after_s
    return HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE,
                         f"temporarily unavailable (every database connection of this web process is in use); "
                         f"try again in {retry} s", headers={"Retry-After": str(retry)})
