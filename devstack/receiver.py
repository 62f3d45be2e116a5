"""A real HTTP server that receives webhooks: for tests, the benchmark and the local demo.

It can be told to fail its first N requests, or to be slow on them, to behave
like a hostile receiver (answer one byte per second, forever, or stream an
endless body), or to serve HTTPS; it records every request it accepted with its
arrival time (and the TLS server names clients asked for). Run as a module it
prints each verified notification:
``python -m devstack.receiver --port 8099 --secret <endpoint secret>``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from devstack.patience import deadline, patient


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    at: float  # time.time() on arrival

    @property
    def json(self) -> dict:
        return json.loads(self.body)


@dataclass
class WebhookReceiver:
    fail_first: int = 0
    fail_status: int = 503
    retry_after: str | None = None  # the Retry-After header of a failing answer, verbatim
    slow_first: int = 0  # the first so many requests wait ``slow_s`` before answering
    slow_s: float = 0.0
    latency_s: float = 0.0  # every request takes at least this long, like a real remote service
    host: str = "127.0.0.1"
    port: int = 0
    on_receive: Callable[[Received], None] | None = None
    # The answer to an accepted request, as a real service would give it (say 400 to a payload of the wrong
    # shape, 202 to a PagerDuty event): (status, JSON body). None: 204, no body.
    answer: Callable[[Received], tuple[int, dict | None]] | None = None
    trickle_bytes_per_s: float = 0.0  # hostile: answer this many bytes a second, never finishing
    endless_status: int | None = None  # hostile: answer this status with a body that never ends
    certificate: tuple[Path, Path] | None = None  # (cert chain, key): serve HTTPS
    received: list[Received] = field(default_factory=list)
    attempts: int = 0
    server_names: list[str | None] = field(default_factory=list)  # SNI of each TLS handshake

    def __post_init__(self) -> None:
        receiver = self
        lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with lock:
                    receiver.attempts += 1
                    number = receiver.attempts
                if receiver.trickle_bytes_per_s or receiver.endless_status:
                    self.hostile()
                    return
                if number <= receiver.slow_first:
                    time.sleep(receiver.slow_s)
                if receiver.latency_s:
                    time.sleep(receiver.latency_s)
                if number <= receiver.fail_first:
                    self.send_response(receiver.fail_status)
                    if receiver.retry_after is not None:
                        self.send_header("Retry-After", receiver.retry_after)
                    self.end_headers()
                    return
                got = Received(dict(self.headers), body, time.time())
                with lock:
                    receiver.received.append(got)
                if receiver.on_receive:
                    receiver.on_receive(got)
                status, reply = receiver.answer(got) if receiver.answer else (204, None)
                content = json.dumps(reply).encode() if reply is not None else b""
                self.send_response(status)
                if reply is not None:
                    self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            def hostile(self) -> None:
                """Hold the client as long as it stays: a byte at a time, or body chunks without end."""
                try:
                    if receiver.endless_status:
                        self.wfile.write(f"HTTP/1.1 {receiver.endless_status} Busy\r\nConnection: close\r\n\r\n"
                                         .encode())
                        chunk = b"x" * 65_536
                        while True:
                            self.wfile.write(chunk)
                    for byte in itertools.cycle(b"HTTP/1.1 200 OK\r\nX-Slow: "):
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                        time.sleep(1 / receiver.trickle_bytes_per_s)
                except OSError:  # the client gave up
                    self.close_connection = True

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer((self.host, self.port), Handler)
        self.server.daemon_threads = True
        if self.certificate:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*map(str, self.certificate))
            context.sni_callback = lambda _sock, name, _ctx: self.server_names.append(name)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        scheme = "https" if self.certificate else "http"
        return f"{scheme}://{self.host}:{self.server.server_address[1]}/hook"

    def accepted(self) -> dict[str, Received]:
        """Accepted requests by ``Idempotency-Key``, as a receiver that de-duplicates would keep them."""
        return {r.headers["Idempotency-Key"]: r for r in self.received}

    def wait_for(self, predicate: Callable[[Received], bool], timeout_s: float = 60.0, count: int = 1) -> list[Received]:
        until = deadline(timeout_s)
        while time.monotonic() < until:
            matching = [r for r in list(self.received) if predicate(r)]
            if len(matching) >= count:
                return matching
            time.sleep(0.05)
        raise AssertionError(f"fewer than {count} matching webhooks within {patient(timeout_s):g}s; "
                             f"got {[r.json for r in self.received]}")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def main() -> None:
    from notifier.channels.webhook import SIGNATURE_HEADER, verify
    from notifier.notification import summary

    parser = argparse.ArgumentParser(description="Print the webhooks Tocsin sends.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8099)
    parser.add_argument("--secret", help="endpoint secret, to verify signatures")
    args = parser.parse_args()

    def show(got: Received) -> None:
        signed = "unchecked" if not args.secret else (
            "valid" if verify(args.secret, got.headers.get(SIGNATURE_HEADER, ""), got.body) else "INVALID")
        print(f"{summary(got.json)}  [signature {signed}]", flush=True)

    receiver = WebhookReceiver(host=args.host, port=args.port, on_receive=show)
    print(f"listening on {receiver.url}", flush=True)
    try:
        receiver.thread.join()
    except KeyboardInterrupt:
        receiver.close()


if __name__ == "__main__":
    main()
