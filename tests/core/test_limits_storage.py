"""The rate limiter's storage reaches the deployment's Redis as every other client does: TLS stays TLS."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fastapi import HTTPException

from core.redis_client import limits_storage
from core.settings import Settings
from devstack.patience import patient
from devstack.services import redis_server_binary, spawn


def _settings(url: str, cluster: bool = False) -> Settings:
    extra = {"redis_cluster": True, "celery_broker_url": "redis://broker:6379/0"} if cluster else {}
    return Settings(redis_url=url, redis_prefix="tocsin", deployment_id="d1", **extra)  # type: ignore[arg-type]


@pytest.mark.parametrize(("url", "cluster", "uri", "options"), [
    ("redis://127.0.0.1:6379/0", False, "redis://127.0.0.1:6379/0", {}),
    ("rediss://:pw@cache.example:6380/2?ssl_cert_reqs=required", False,
     "rediss://:pw@cache.example:6380/2?ssl_cert_reqs=required", {}),
    ("unix:///run/redis/redis.sock?db=3", False, "redis+unix:///run/redis/redis.sock?db=3", {}),
    ("redis://:secret@node-1:7000/0", True, "redis+cluster://:secret@node-1:7000", {}),
    ("redis://node-1", True, "redis+cluster://node-1:6379", {}),
    ("rediss://app:secret@node-1:7000?ssl_cert_reqs=none&ssl_ca_certs=/etc/ca.pem", True,
     "redis+cluster://app:secret@node-1:7000", {"ssl": True, "ssl_cert_reqs": "none", "ssl_ca_certs": "/etc/ca.pem"}),
])
def test_each_redis_url_maps_onto_the_limits_storage(url: str, cluster: bool, uri: str, options: dict) -> None:
    """A ``rediss://`` cluster became ``redis+cluster://`` with nothing else: rate limits went to it in clear
    (or failed against a TLS-only cluster); a ``unix://`` Redis was refused by ``limits`` (no such scheme)."""
    assert limits_storage(_settings(url, cluster)) == (uri, options)


def test_a_cluster_over_a_unix_socket_or_an_unknown_scheme_is_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="unix socket"):
        limits_storage(_settings("unix:///run/redis.sock", cluster=True))
    with pytest.raises(ValueError, match="scheme 'memcached'"):
        limits_storage(_settings("memcached://x:1"))


def test_rate_limits_count_on_a_redis_reached_over_a_unix_socket(tmp_path: Path) -> None:
    """Real Redis on a socket only: the web app's rate limiter failed to start (``limits`` knows no ``unix``)."""
    import redis

    from web.limits import RateLimiter

    sock = tmp_path / "redis.sock"
    server = spawn("redis-unix", [redis_server_binary(), "--port", "0", "--unixsocket", str(sock), "--save", "",
                                  "--appendonly", "no", "--dir", str(tmp_path)], tmp_path / "redis.log")
    try:
        deadline = time.monotonic() + patient(10)
        while not sock.exists():
            assert time.monotonic() < deadline, "redis did not open its socket"
            time.sleep(0.05)
        settings = _settings(f"unix://{sock}?db=0")
        limiter = RateLimiter(settings)
        limiter.hit("2/minute", "test", "a")
        limiter.hit("2/minute", "test", "a")
        with pytest.raises(HTTPException) as refused:
            limiter.hit("2/minute", "test", "a")
        assert refused.value.status_code == 429
        assert redis.Redis(unix_socket_path=str(sock)).keys("*rate*")  # counted there
    finally:
        server.stop()
