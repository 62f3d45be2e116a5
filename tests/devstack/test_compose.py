"""docker-compose.yml is valid and runs the same modules as the local runner."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

import yaml

from core.settings import Settings
from devstack.run import platform_commands

ROOT = Path(__file__).resolve().parents[2]


def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def entry_point(command: list[str]) -> str:
    """The Python module (or module:attribute) a service command runs."""
    program = Path(command[0]).name
    if program.startswith("python"):
        assert command[1] == "-m", command
        return entry_point(command[2:]) if command[2] in {"celery", "uvicorn"} else command[2]
    if program == "celery":
        return command[command.index("-A") + 1]
    if program == "uvicorn":
        return next(part for part in command if ":" in part)
    raise AssertionError(f"unknown command {command}")


def resolves(target: str) -> bool:
    module, _, attribute = target.partition(":")
    if importlib.util.find_spec(module) is None:
        return False
    return not attribute or hasattr(importlib.import_module(module), attribute)


def test_every_service_command_exists_in_the_repo() -> None:
    services = compose()["services"]
    built = {name: s for name, s in services.items() if "build" in s}
    assert {"evaluator", "dispatcher", "worker", "web", "feed", "topics"} <= set(built)
    for name, service in built.items():
        target = entry_point(service["command"])
        assert resolves(target), f"service {name}: {target} does not exist"
    assert (ROOT / services["web"]["build"]["dockerfile"]).exists()


def test_production_shape() -> None:
    services = compose()["services"]
    assert services["kafka"]["image"].startswith("apache/kafka")
    assert services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft, no ZooKeeper
    assert services["redis"]["image"].startswith("redis")
    assert services["postgres"]["image"].startswith("postgres")
    assert "smtp" in services


def test_environment_names_real_settings() -> None:
    fields = set(Settings.model_fields)
    for name, service in compose()["services"].items():
        for variable in (service.get("environment") or {}):
            if variable.startswith("TOCSIN_"):
                assert variable.removeprefix("TOCSIN_").lower() in fields, f"{name}: {variable} is not a setting"


def test_same_modules_as_local_runner() -> None:
    services = compose()["services"]
    compose_targets = {entry_point(s["command"]) for s in services.values() if "build" in s}
    runner_targets = {entry_point(args) for _, args in platform_commands(Settings())}
    assert runner_targets <= compose_targets
