"""Prometheus exposition for long-running processes that have no web server of their own."""

from __future__ import annotations

import structlog
from prometheus_client import start_http_server

log = structlog.get_logger(__name__)


def serve_metrics(port: int, addr: str) -> None:
    """Serve ``/metrics`` on ``addr:port`` (``TOCSIN_METRICS_BIND_ADDRESS``); a port of 0 disables it (tests run
    several at once)."""
    if port <= 0:
        return
    try:
        start_http_server(port, addr=addr)
    except OSError as exc:  # another instance already serves there; metrics are not worth dying for
        log.warning("metrics_port_busy", port=port, error=str(exc))

