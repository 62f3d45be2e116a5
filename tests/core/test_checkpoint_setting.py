"""TOCSIN_CHECKPOINT_DIR: a URI reaches Spark as it was written; a plain path is made absolute once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from core.settings import Settings


@pytest.mark.parametrize("uri", ["hdfs://nn:8020/x", "s3a://bucket/x", "file:///tmp/x", "file:/tmp/x",
                                 "abfss://c@account.dfs.core.windows.net/x"])
def test_a_uri_is_kept_intact(uri: str) -> None:
    settings = Settings(checkpoint_dir=uri)
    assert settings.checkpoint_dir == uri and settings.checkpoint_location == uri


def test_a_plain_path_is_made_absolute_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    settings = Settings(checkpoint_dir="./var/x")
    assert settings.checkpoint_dir == str(tmp_path / "var" / "x")
    monkeypatch.chdir("/")  # a later change of directory names the same checkpoint
    assert settings.checkpoint_location == str(tmp_path / "var" / "x")
    assert Settings(checkpoint_dir="a/../b").checkpoint_dir == "/b"


def test_the_environment_sets_it_and_the_default_is_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOCSIN_CHECKPOINT_DIR", "hdfs://nn:8020/tocsin/checkpoint")
    assert Settings().checkpoint_location == "hdfs://nn:8020/tocsin/checkpoint"
    monkeypatch.delenv("TOCSIN_CHECKPOINT_DIR")
    monkeypatch.chdir(tmp_path)
    assert Settings(data_dir=Path("var")).checkpoint_location == os.path.join(tmp_path, "var/checkpoints/evaluator")


def test_an_empty_setting_is_refused() -> None:
    with pytest.raises(ValidationError, match="must be a path or a URI"):
        Settings(checkpoint_dir=" ")


@pytest.mark.parametrize(("location", "local"), [
    ("/data/cp", "/data/cp"), ("file:///data/cp", "/data/cp"), ("file:/data/cp", "/data/cp"),
    ("file://localhost/data/cp", "/data/cp"), ("file://other/data/cp", None), ("hdfs://nn:8020/cp", None),
    ("s3a://bucket/cp", None),
])
def test_the_local_directory_of_a_location(location: str, local: str | None) -> None:
    """What the devstack runner (no JVM) may reset itself: a directory of this host, or nothing."""
    found = Settings(checkpoint_dir=location).local_checkpoint_dir
    assert (str(found) if found is not None else None) == local
