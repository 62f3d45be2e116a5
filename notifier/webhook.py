"""Signed webhook requests and the guard against server-side request forgery.

Receivers verify ``Tocsin-Signature: t=<unix seconds>,v1=<hex>`` where ``v1`` is
HMAC-SHA256 over ``"<t>.<raw body>"`` with the endpoint's secret, and reject old
timestamps to defeat replays. ``Idempotency-Key`` lets them drop redeliveries.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import socket
import time
from functools import lru_cache
from urllib.parse import urlsplit

import httpx

from notifier.attempt import Attempt

SIGNATURE_HEADER = "Tocsin-Signature"
TIMESTAMP_HEADER = "Tocsin-Timestamp"
IDEMPOTENCY_HEADER = "Idempotency-Key"


def sign(secret: str, timestamp: int, body: bytes) -> str:
    return hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def verify(secret: str, header: str, body: bytes, tolerance_s: int = 300, now: float | None = None) -> bool:
    """What a receiver does: check the signature and that the timestamp is fresh."""
    try:
        parts = dict(item.split("=", 1) for item in header.split(","))
        timestamp = int(parts["t"])
    except (KeyError, ValueError):
        return False
    if abs((now or time.time()) - timestamp) > tolerance_s:
        return False
    return hmac.compare_digest(sign(secret, timestamp, body), parts.get("v1", ""))


class DestinationRefused(ValueError):
    """The URL points somewhere webhooks must not go (private, loopback, link-local...)."""


def check_destination(url: str, allow_hosts: list[str]) -> None:
    """Refuse URLs that resolve to non-public addresses unless the host is explicitly allowed."""
    parts = urlsplit(url)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise DestinationRefused(f"not an http(s) URL: {url}")
    host = parts.hostname
    if host in allow_hosts:
        return
    try:
        infos = socket.getaddrinfo(host, parts.port or (443 if parts.scheme == "https" else 80))
    except socket.gaierror as exc:
        raise DestinationRefused(f"cannot resolve {host}: {exc}") from exc
    for info in infos:
        address = ipaddress.ip_address(info[4][0])
        if str(address) in allow_hosts:
            continue
        if not address.is_global or address.is_multicast:
            raise DestinationRefused(f"{host} resolves to non-public address {address}")


def http_attempt(status_code: int, latency_ms: float, retry_after_s: float | None = None) -> Attempt:
    """Network errors, 429 and 5xx are worth retrying; other 4xx are the receiver's final word."""
    ok = 200 <= status_code < 300
    return Attempt(
        ok=ok,
        retryable=status_code == 429 or status_code >= 500,
        latency_ms=latency_ms,
        status_code=status_code,
        error=None if ok else f"HTTP {status_code}",
        retry_after_s=retry_after_s,
    )


@lru_cache(maxsize=1)
def _client() -> httpx.Client:
    """One pooled client per process: building one (TLS context, CA bundle) costs ~30 ms, a request ~1 ms."""
    return httpx.Client(follow_redirects=False, limits=httpx.Limits(max_connections=100, max_keepalive_connections=20))


def post_webhook(
    url: str,
    payload: dict,
    secret: str | None,
    idempotency_key: str,
    connect_timeout_s: float,
    read_timeout_s: float,
) -> Attempt:
    body = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()
    timestamp = int(time.time())
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "Tocsin-Webhook/1",
        TIMESTAMP_HEADER: str(timestamp),
        IDEMPOTENCY_HEADER: idempotency_key,
    }
    if secret:
        headers[SIGNATURE_HEADER] = f"t={timestamp},v1={sign(secret, timestamp, body)}"
    started = time.perf_counter()
    timeout = httpx.Timeout(read_timeout_s, connect=connect_timeout_s)
    try:
        response = _client().post(url, content=body, headers=headers, timeout=timeout)
    except httpx.HTTPError as exc:
        latency = (time.perf_counter() - started) * 1000
        return Attempt(ok=False, retryable=True, latency_ms=latency, error=f"{type(exc).__name__}: {exc}")
    latency = (time.perf_counter() - started) * 1000
    return http_attempt(response.status_code, latency, _retry_after(response.headers.get("Retry-After")))


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        from email.utils import parsedate_to_datetime

        try:
            return max(parsedate_to_datetime(value).timestamp() - time.time(), 0.0)
        except (TypeError, ValueError):
            return None
