"""A well-known secret key (the one docker-compose.yml once shipped) is refused unless TOCSIN_DEMO says this is a
throw-away demo: anyone holding the key decrypts every endpoint secret stored with it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from core.settings import WELL_KNOWN_SECRET_KEYS, Settings
from devstack.run import platform_commands
from devstack.services import free_port

[WELL_KNOWN] = WELL_KNOWN_SECRET_KEYS


def test_settings_refuse_the_well_known_key(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValidationError, match=r"well-known key.*TOCSIN_DEMO=true"):
        Settings(secret_key=WELL_KNOWN)
    monkeypatch.setenv("TOCSIN_SECRET_KEY", WELL_KNOWN)
    with pytest.raises(ValidationError, match="well-known key"):
        Settings()  # as every process reads it, from the environment
    monkeypatch.setenv("TOCSIN_DEMO", "true")
    assert Settings().secret_key.get_secret_value() == WELL_KNOWN  # a demo says so explicitly


@pytest.mark.slow  # every entry point imports its whole stack, one after another: over a minute on a loaded machine
def test_every_entry_point_refuses_to_start_with_it(settings: Settings, tmp_path: Path) -> None:
    """Each process the platform runs (and compose's `topics`) exits at start, saying why, before it serves."""
    settings = settings.model_copy(update={"web_port": free_port()})
    env = {**os.environ, **settings.to_env(), "TOCSIN_SECRET_KEY": WELL_KNOWN}
    for name, args in [*platform_commands(settings), ("topics", [sys.executable, "-m", "ingest", "topics"])]:
        try:  # one at a time: each imports its whole stack, on a loaded machine
            done = subprocess.run(args, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
        except subprocess.TimeoutExpired as timeout:
            raise AssertionError(f"{name} did not stop: {timeout.stdout!r:.2000} {timeout.stderr!r:.2000}") from None
        assert done.returncode != 0, f"{name} started with the well-known key"
        assert "well-known key" in done.stderr, f"{name}: {done.stderr[-2_000:]}"
