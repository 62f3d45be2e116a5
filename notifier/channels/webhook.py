"""Signed webhook requests, the guard against server-side request forgery, and the limits of one attempt.

Receivers verify ``Tocsin-Signature: t=<unix seconds>,v1=<hex>`` where ``v1`` is
HMAC-SHA256 over ``"<t>.<raw body>"`` with the endpoint's secret (its UTF-8 bytes),
and reject old timestamps to defeat replays. ``Idempotency-Key`` lets them drop
redeliveries.

One attempt is bounded whatever the receiver does: the name is resolved once, by
the guard, and the connection goes to exactly the addresses the guard approved
(TLS still verifies the certificate for the URL's host name, sent as SNI, and the
``Host`` header is the URL's); every phase - resolution, connect, TLS, sending,
the response - must finish before one total deadline; at most
``max_response_bytes`` of a response body are read. A receiver dribbling bytes or
streaming an endless body costs a worker thread at most the deadline and a
bounded buffer.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import ipaddress
import json
import math
import socket
import ssl
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar

import certifi
import httpcore
import httpx
from pydantic import AnyHttpUrl, ValidationError

from core.settings import Settings
from notifier.attempt import Attempt
from notifier.channels import EndpointView, register
from notifier.notification import Notification
from subscriptions.channel_kinds import EndpointKind

SIGNATURE_HEADER = "Tocsin-Signature"
TIMESTAMP_HEADER = "Tocsin-Timestamp"
IDEMPOTENCY_HEADER = "Idempotency-Key"
SIGNATURE_TOLERANCE_S = 300  # how old a signed timestamp a receiver should accept (either direction)


def sign(secret: str, timestamp: int, body: bytes) -> str:
    return hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def verify(secret: str, header: str, body: bytes, tolerance_s: int = SIGNATURE_TOLERANCE_S,
           now: float | None = None) -> bool:
    """What a receiver does: check the signature and that the timestamp is fresh."""
    try:
        parts = dict(item.split("=", 1) for item in header.split(","))
        timestamp = int(parts["t"])
    except (KeyError, ValueError):
        return False
    if abs((time.time() if now is None else now) - timestamp) > tolerance_s:
        return False
    return hmac.compare_digest(sign(secret, timestamp, body), parts.get("v1", ""))


@dataclass(frozen=True)
class WebhookLimits:
    """What one attempt may cost: the settings of ``notifier`` webhooks in one object."""

    connect_timeout_s: float = 3.0
    read_timeout_s: float = 10.0  # the longest silence between two reads
    total_timeout_s: float = 10.0  # everything, from resolving the name to the response's end
    max_response_bytes: int = 64 * 1024
    allow_hosts: tuple[str, ...] = ()
    ca_file: Path | None = None

    @classmethod
    def from_settings(cls, settings: Any) -> WebhookLimits:
        return cls(settings.webhook_connect_timeout_s, settings.webhook_read_timeout_s,
                   settings.webhook_total_timeout_s, settings.webhook_max_response_bytes,
                   tuple(settings.webhook_allow_hosts), settings.webhook_ca_file)


class DestinationRefused(ValueError):
    """The URL points somewhere webhooks must not go (private, loopback, link-local...): final."""


class DestinationUnresolved(OSError):
    """The host name could not be resolved (now): worth trying again, like any network error."""


@dataclass(frozen=True)
class Destination:
    """A URL the guard approved, with the only addresses a connection to it may go to."""

    url: httpx.URL
    addresses: tuple[str, ...]


class _Deadline:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def remaining(self) -> float:
        return self.at - time.monotonic()

    def clamp(self, timeout: float | None, error: type[Exception]) -> float:
        """``timeout`` shortened to the time left; ``error`` once none is left."""
        left = self.remaining()
        if left <= 0:
            raise error(f"total deadline of {self.seconds:g} s passed")
        return left if timeout is None else min(timeout, left)


_resolver = ThreadPoolExecutor(max_workers=8, thread_name_prefix="webhook-dns")


def _resolve(host: str, port: int, deadline: _Deadline) -> list[str]:
    """``getaddrinfo`` within the deadline (it has no timeout of its own; a stuck lookup keeps only its thread)."""
    future = _resolver.submit(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
    try:
        infos = future.result(timeout=max(deadline.remaining(), 0))
    except FutureTimeout as exc:
        raise DestinationUnresolved(f"cannot resolve {host}: no answer within the deadline") from exc
    except OSError as exc:  # socket.gaierror and friends: DNS trouble is transient
        raise DestinationUnresolved(f"cannot resolve {host}: {exc}") from exc
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


# IPv6 ranges whose last 32 bits are an IPv4 address the packet reaches: IPv4-compatible (``::a.b.c.d``,
# RFC 4291, deprecated), IPv4-translated (``::ffff:0:a.b.c.d``, RFC 2765) and NAT64's well-known prefix
# (``64:ff9b::a.b.c.d``, RFC 6052). ``::`` and ``::1`` are in the first, and not global by themselves.
_LAST_32_BITS_IPV4 = (ipaddress.ip_network("::/96"), ipaddress.ip_network("::ffff:0:0:0/96"),
                      ipaddress.ip_network("64:ff9b::/96"))
# Refused whole: NAT64's local-use prefix (RFC 8215) may carry the IPv4 address at any of RFC 6052's bit
# positions, and deprecated site-local addresses (fec0::/10) are private, though Python calls them global.
_NEVER_PUBLIC = (ipaddress.ip_network("64:ff9b:1::/48"), ipaddress.ip_network("fec0::/10"))


def _embedded_ipv4(address: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """Every IPv4 address ``address`` carries, as ``ipaddress`` reads them (mapped, 6to4, Teredo's server and
    client) and in the ranges above."""
    found = [address.ipv4_mapped, address.sixtofour, *(address.teredo or ())]
    if any(address in net for net in _LAST_32_BITS_IPV4):
        found.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    return [embedded for embedded in found if embedded is not None]


def _public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Global unicast, and so is every IPv4 address carried inside it (compatible, mapped, translated, 6to4,
    Teredo, NAT64).

    Such an address can be "global" by itself but reach the IPv4 address it embeds:
    ``64:ff9b::a00:1`` is 10.0.0.1 on a network with a NAT64 gateway, ``::127.0.0.1`` is 127.0.0.1.
    """
    if not address.is_global or address.is_multicast:
        return False
    if address.version == 6:
        if any(address in net for net in _NEVER_PUBLIC):
            return False
        return all(_public(embedded) for embedded in _embedded_ipv4(address))
    return True


def check_destination(url: str, allow_hosts: list[str] | tuple[str, ...], deadline_s: float = 10.0) -> Destination:
    """Resolve the URL's host once and approve its addresses, or refuse it.

    Every address must be public unless it, or the host name, is in ``allow_hosts``.
    The returned addresses are the only ones a request to this URL may connect to.
    """
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise DestinationRefused(f"not an http(s) URL: {url}") from exc
    if parsed.scheme not in {"http", "https"} or not parsed.host:
        raise DestinationRefused(f"not an http(s) URL: {url}")
    host = parsed.host
    addresses = _resolve(parsed.raw_host.decode("ascii"), parsed.port or (443 if parsed.scheme == "https" else 80),
                         _Deadline(deadline_s))
    if host not in allow_hosts:
        for raw in addresses:
            address = ipaddress.ip_address(raw.split("%", 1)[0])
            if raw in allow_hosts or str(address) in allow_hosts:
                continue
            if not _public(address):
                raise DestinationRefused(f"{host} resolves to non-public address {address}")
    if not addresses:
        raise DestinationUnresolved(f"cannot resolve {host}: no addresses")
    return Destination(parsed, tuple(addresses))


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose every read, write and TLS handshake ends by the attempt's deadline."""

    def __init__(self, stream: httpcore.NetworkStream, deadline: _Deadline) -> None:
        self.stream = stream
        self.deadline = deadline

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self.stream.read(max_bytes, self.deadline.clamp(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self.stream.write(buffer, self.deadline.clamp(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self.stream.close()

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        tls = self.stream.start_tls(ssl_context, server_hostname, self.deadline.clamp(timeout, httpcore.ConnectTimeout))
        return _DeadlineStream(tls, self.deadline)

    def get_extra_info(self, info: str) -> Any:
        return self.stream.get_extra_info(info)


class _PinnedBackend(httpcore.NetworkBackend):
    """Connects only to the approved addresses of the approved host, never resolving a name again.

    At the deadline it shuts its sockets down, so even a TLS handshake dribbled a
    byte at a time (whose reads the per-operation timeouts cannot bound) ends then.
    """

    def __init__(self, destination: Destination, deadline: _Deadline) -> None:
        self.destination = destination
        self.deadline = deadline
        self.inner = httpcore.SyncBackend()
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Any = None) -> httpcore.NetworkStream:
        if host.lower() != self.destination.url.raw_host.decode("ascii").lower():
            raise httpcore.ConnectError(f"{host} is not the host the SSRF guard approved")
        failure: Exception = httpcore.ConnectError("no approved address")
        for address in self.destination.addresses:
            try:
                stream = self.inner.connect_tcp(address, port, self.deadline.clamp(timeout, httpcore.ConnectTimeout),
                                                local_address, socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc
                continue
            with self.lock:
                self.sockets.append(stream.get_extra_info("socket"))
            return _DeadlineStream(stream, self.deadline)
        raise failure

    def abort(self) -> None:
        with self.lock:
            for sock in self.sockets:
                with contextlib.suppress(OSError):  # already closed: nothing left to cut
                    sock.shutdown(socket.SHUT_RDWR)


class _PinnedTransport(httpx.HTTPTransport):
    """httpx's transport over a connection pool that uses the pinned backend (one attempt, then closed)."""

    def __init__(self, backend: _PinnedBackend, ssl_context: ssl.SSLContext) -> None:
        super().__init__(verify=ssl_context, trust_env=False)
        self._pool = httpcore.ConnectionPool(ssl_context=ssl_context, max_connections=1,
                                             max_keepalive_connections=0, network_backend=backend)


@lru_cache(maxsize=4)
def _ssl_context(ca_file: Path | None) -> ssl.SSLContext:
    """One verifying context per CA bundle: building one costs ~30 ms, an attempt ~1 ms."""
    return ssl.create_default_context(cafile=str(ca_file) if ca_file else certifi.where())


def http_attempt(status_code: int, latency_ms: float, retry_after_s: float | None = None,
                 error: str | None = None) -> Attempt:
    """Network errors, 429 and 5xx are worth retrying; other 4xx are the receiver's final word."""
    ok = 200 <= status_code < 300
    return Attempt(
        ok=ok,
        retryable=status_code == 429 or status_code >= 500,
        latency_ms=latency_ms,
        status_code=status_code,
        error=None if ok else error or f"HTTP {status_code}",
        retry_after_s=retry_after_s,
    )


def _drain(response: httpx.Response, limit: int) -> str | None:
    """Read at most ``limit`` bytes of the body and drop them; why reading stopped early, if it did."""
    read = 0
    try:
        for chunk in response.iter_raw():
            read += len(chunk)
            if read > limit:
                return f"response body cut at {limit // 1024} KiB"
    except httpx.TimeoutException:
        return "response body cut at the deadline"
    except httpx.HTTPError:
        return "response body cut by a network error"
    return None


def json_body(payload: Any) -> bytes:
    """The compact, key-sorted JSON every HTTP channel sends (what a webhook signature covers)."""
    return json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()


def post_json(url: str, body: bytes, headers: dict[str, str], limits: WebhookLimits = WebhookLimits()) -> Attempt:
    """One POST of a JSON ``body`` to ``url``: guarded, pinned, bounded by ``limits``, classified.

    The HTTP machinery every HTTP channel shares (webhook, Slack, Teams, PagerDuty): the SSRF
    guard and allow-list, one total deadline, a capped error body, and the outcome as an
    :class:`Attempt` (network errors, 429 and 5xx retryable, ``Retry-After`` honoured).
    """
    started = time.perf_counter()
    deadline = _Deadline(limits.total_timeout_s)

    def failed(retryable: bool, error: str) -> Attempt:
        return Attempt(ok=False, retryable=retryable, latency_ms=(time.perf_counter() - started) * 1000, error=error)

    try:
        destination = check_destination(url, limits.allow_hosts, limits.total_timeout_s)
    except DestinationRefused as exc:
        return failed(False, str(exc))
    except DestinationUnresolved as exc:
        return failed(True, str(exc))

    backend = _PinnedBackend(destination, deadline)
    watchdog = threading.Timer(max(deadline.remaining(), 0), backend.abort)
    watchdog.daemon = True
    watchdog.start()
    timeout = httpx.Timeout(limits.read_timeout_s, connect=limits.connect_timeout_s)
    try:
        with httpx.Client(transport=_PinnedTransport(backend, _ssl_context(limits.ca_file)), follow_redirects=False,
                          trust_env=False, timeout=timeout) as client, \
                client.stream("POST", destination.url, content=body,
                              headers={"Content-Type": "application/json", **headers}) as response:
            # The status is the receiver's answer; a body is only read (capped) to close an error cleanly.
            cut = None if response.is_success else _drain(response, limits.max_response_bytes)
    except httpx.HTTPError as exc:
        if deadline.remaining() <= 0:  # however the cut surfaced (timeout, or the watchdog's shutdown)
            return failed(True, f"no complete response within the {limits.total_timeout_s:g} s deadline")
        return failed(True, f"{type(exc).__name__}: {exc}")
    finally:
        watchdog.cancel()
    latency = (time.perf_counter() - started) * 1000
    error = f"HTTP {response.status_code}" + (f" ({cut})" if cut else "")
    return http_attempt(response.status_code, latency, retry_after_s(response.headers.get("Retry-After")), error)


def post_webhook(url: str, payload: dict, secret: str | None, idempotency_key: str,
                 limits: WebhookLimits = WebhookLimits()) -> Attempt:
    """One signed POST to ``url``, guarded, pinned and bounded by ``limits``."""
    body = json_body(payload)
    timestamp = int(time.time())
    headers = {
        "User-Agent": "Tocsin-Webhook/1",
        TIMESTAMP_HEADER: str(timestamp),
        IDEMPOTENCY_HEADER: idempotency_key,
    }
    if secret:
        headers[SIGNATURE_HEADER] = f"t={timestamp},v1={sign(secret, timestamp, body)}"
    return post_json(url, body, headers, limits)


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """The receiver's ``Retry-After`` in seconds from now, or None if absent or meaningless.

    Seconds or an HTTP date; a date in the past is 0, ``nan``/``inf`` and garbage
    are ignored (the caller's backoff applies), and the caller caps the result.
    """
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(value).timestamp() - (time.time() if now is None else now)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
    return max(seconds, 0.0) if math.isfinite(seconds) else None


def check_url(target: str) -> str:
    """A webhook's target is an http(s) URL; where it resolves is checked at each attempt (the SSRF guard)."""
    try:
        url = AnyHttpUrl(target)
    except ValidationError:
        raise ValueError("must be an http(s) URL") from None
    if url.scheme not in {"http", "https"}:
        raise ValueError("must be an http(s) URL")
    return target


class WebhookChannel:
    """A signed JSON POST of the notification to the endpoint's URL."""

    kind: ClassVar[EndpointKind] = EndpointKind(
        name="webhook", label="webhook", check_target=check_url, has_secret=True, position=10,
        placeholder="https://example.com/hooks/tocsin",
        help=f"An http(s) URL. Each notification is POSTed as JSON and signed in the {SIGNATURE_HEADER} header "
             "with the endpoint's secret, shown once when created or rotated.",
    )

    def __init__(self, settings: Settings) -> None:
        self.limits = WebhookLimits.from_settings(settings)

    @classmethod
    def payload_preview(cls, notification: dict, template: str | None, settings: Settings) -> dict:  # noqa: ARG003
        """The notification's JSON, as it is POSTed (webhooks take no template)."""
        return notification

    @classmethod
    def longest_attempt_s(cls, settings: Settings) -> float:
        return settings.webhook_total_timeout_s

    def send(self, notification: Notification, endpoint: EndpointView) -> Attempt:
        return post_webhook(endpoint.target, notification.to_json(), endpoint.secret,
                            idempotency_key=f"{notification.notification_id}:{endpoint.id}", limits=self.limits)


register(WebhookChannel)
