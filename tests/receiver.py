"""A real HTTP server that receives webhooks in tests and can be told to fail."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> dict:
        return json.loads(self.body)


@dataclass
class WebhookReceiver:
    fail_first: int = 0
    fail_status: int = 503
    received: list[Received] = field(default_factory=list)
    attempts: int = 0

    def __post_init__(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.attempts += 1
                if receiver.attempts <= receiver.fail_first:
                    self.send_response(receiver.fail_status)
                    self.end_headers()
                    return
                receiver.received.append(Received(dict(self.headers), body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def wait_for(self, predicate, timeout_s: float = 60.0) -> list[Received]:  # noqa: ANN001
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            matching = [r for r in self.received if predicate(r)]
            if matching:
                return matching
            time.sleep(0.1)
        raise AssertionError(f"no matching webhook within {timeout_s}s; got {[r.json for r in self.received]}")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
