"""The per-client rate limits count the real peer: X-Forwarded-For is not trusted by default (real web process)."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx

from core.settings import Settings
from devstack.run import platform_commands
from devstack.services import free_port, spawn, wait_for_port


def test_x_forwarded_for_does_not_escape_the_per_client_sign_in_limit(settings: Settings, tmp_path: Path) -> None:
    settings = settings.model_copy(update={"web_port": free_port(), "rate_sign_in_client": "3/minute"})
    [web] = [args for name, args in platform_commands(settings) if name == "web"]
    process = spawn("web", web, tmp_path / "web.log", env=settings.to_env())
    try:
        wait_for_port("127.0.0.1", settings.web_port, process=process.process)
        with httpx.Client(base_url=f"http://127.0.0.1:{settings.web_port}", timeout=30) as client:
            codes = [client.post("/api/auth/login", headers={"X-Forwarded-For": f"203.0.113.{n}"},
                                 json={"email": f"{uuid.uuid4().hex[:8]}@example.com", "password": "p" * 12}
                                 ).status_code for n in range(5)]
    finally:
        process.stop()
    assert codes == [401, 401, 401, 429, 429]
