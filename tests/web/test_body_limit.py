"""The request body cap against a real uvicorn server: a 200 MB body is refused early and never held."""

from __future__ import annotations

import select
import socket
import threading
import time

import psutil
import pytest

from core.settings import Settings
from tests.servers import serving
from web.app import create_app

pytestmark = pytest.mark.slow  # a 200 MB upload: run in CI

MB = 1024 * 1024


def _send(url: str, head: bytes, chunks: int, chunk: bytes, chunked: bool) -> tuple[bytes, int]:
    """Send ``head`` then up to ``chunks`` pieces of body until the server answers; (answer, bytes sent)."""
    host, port = url.removeprefix("http://").split(":")
    sent = 0
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(head)
        for _ in range(chunks):
            if select.select([conn], [], [], 0)[0]:
                break  # the server answered before the body ended
            try:
                conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(chunk)
        else:
            if chunked:
                conn.sendall(b"0\r\n\r\n")
        conn.settimeout(30)
        answer = b""
        while b"\r\n\r\n" not in answer:
            data = conn.recv(65536)
            if not data:
                break
            answer += data
        return answer, sent


def _peak_rss_while(action, process: psutil.Process) -> tuple[object, int]:
    peak, done = [process.memory_info().rss], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak.append(process.memory_info().rss)
            time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        result = action()
    finally:
        done.set()
        sampler.join()
    return result, max(peak)


def test_a_200_mb_body_gets_a_413_and_the_server_stays_small(settings: Settings) -> None:
    """Chunked (no length), and with a Content-Length that claims a small body: both cut off at the cap."""
    settings = settings.model_copy(update={"request_max_bytes": MB})
    process = psutil.Process()
    chunk = b"x" * (1024 * 1024)
    with serving(create_app(settings)) as url:
        before = process.memory_info().rss
        for head, chunked in [
            (b"POST /api/auth/signup HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
             b"Transfer-Encoding: chunked\r\n\r\n", True),
            (b"POST /api/auth/login HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
             b"Content-Length: 209715200\r\n\r\n", False),  # declared: refused before the body is read
        ]:
            (answer, sent), peak = _peak_rss_while(lambda head=head, chunked=chunked: _send(url, head, 200, chunk, chunked),
                                                   process)
            assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
            assert sent < 50 * MB, sent  # answered early: the rest of the 200 MB was never needed
            assert peak - before < 64 * MB, (peak - before) / MB
        small = b'{"email": "a@example.com", "password": "x"}'
        lying = (b"POST /api/auth/login HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(small)) + small
        answer, _ = _send(url, lying, 0, b"", False)
        assert not answer.startswith(b"HTTP/1.1 413"), answer[:200]  # a body within the cap is served
