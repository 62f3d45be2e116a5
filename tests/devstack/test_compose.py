"""docker-compose.yml is valid, runs the same modules as the local runner, and its Spark cluster fits together.

Docker cannot pull images here, so the file is checked against what the images hold: the Python
modules of the project image, and for the official Spark image the distribution pyspark ships at
the same version (the same ``bin/spark-class`` and jars the image has under ``/opt/spark``).
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import zipfile
from pathlib import Path
from typing import Any

import pyspark
import pytest
import structlog
import yaml
from cryptography.fernet import Fernet

from core.settings import WELL_KNOWN_SECRET_KEYS, Settings
from devstack.run import platform_commands

ROOT = Path(__file__).resolve().parents[2]
SPARK_HOME = Path(pyspark.__file__).parent
INTERPOLATION = re.compile(r"\$\{(\w+):([-?])([^}]*)\}")
#: What an operator exports before ``docker compose up``: the variables the file requires (``${NAME:?message}``).
EXPORTED = {"TOCSIN_SECRET_KEY": Fernet.generate_key().decode()}


class Unset(AssertionError):
    """A required variable is not exported: ``docker compose`` stops with the file's message."""


def interpolate(value: Any, exported: dict[str, str] = EXPORTED) -> Any:
    """Compose's ``${NAME:-default}`` and ``${NAME:?message}`` with only ``exported`` set."""
    def substitute(match: re.Match) -> str:
        name, kind, text = match.groups()
        if name in exported:
            return exported[name]
        if kind == "?":
            raise Unset(f"{name}: {text}")
        return text

    if isinstance(value, str):
        return INTERPOLATION.sub(substitute, value)
    if isinstance(value, list):
        return [interpolate(v, exported) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v, exported) for k, v in value.items()}
    return value


def gigabytes(size: str) -> float:
    """Spark's memory strings: ``512m``, ``4g``."""
    number, unit = float(size[:-1]), size[-1].lower()
    return number / 1024 if unit == "m" else number * 1024 if unit == "t" else number


def compose(exported: dict[str, str] = EXPORTED) -> dict:
    return interpolate(yaml.safe_load((ROOT / "docker-compose.yml").read_text()), exported)


def service_settings(service: dict) -> Settings:
    """The settings a service's environment gives its process."""
    return Settings(**{k.removeprefix("TOCSIN_").lower(): v
                       for k, v in service["environment"].items() if k.startswith("TOCSIN_")})


def entry_point(command: list[str]) -> str:
    """The Python module (or module:attribute), or the Spark class, a service command runs."""
    program = Path(command[0]).name
    if program.startswith("python"):
        assert command[1] == "-m", command
        return entry_point(command[2:]) if command[2] in {"celery", "uvicorn"} else command[2]
    if program == "celery":
        return command[command.index("-A") + 1]
    if program == "uvicorn":
        return next(part for part in command if ":" in part)
    if program == "spark-class":
        return command[1]
    raise AssertionError(f"unknown command {command}")


def spark_jar_entries() -> set[str]:
    entries: set[str] = set()
    for jar in (SPARK_HOME / "jars").glob("spark-*.jar"):
        with zipfile.ZipFile(jar) as archive:
            entries.update(archive.namelist())
    return entries


def spark_class_bytes(name: str) -> bytes:
    entry = name.replace(".", "/") + ".class"
    for jar in (SPARK_HOME / "jars").glob("spark-core*.jar"):
        with zipfile.ZipFile(jar) as archive:
            if entry in archive.namelist():
                return archive.read(entry)
    raise AssertionError(f"{name} is not in Spark's core jar")


def resolves(target: str) -> bool:
    if target.startswith("org.apache.spark."):
        return target.replace(".", "/") + ".class" in spark_jar_entries()
    module, _, attribute = target.partition(":")
    if importlib.util.find_spec(module) is None:
        return False
    return not attribute or hasattr(imported(module), attribute)


def imported(module: str) -> Any:
    """The module, imported without keeping what importing it configured: ``web.main`` sets up structlog for its
    process (the tests' WARNING level, loggers cached), and every later test of this worker that captures an info
    line (``structlog.testing.capture_logs``) saw none."""
    saved = {k: list(v) if k == "processors" else v for k, v in structlog.get_config().items()}
    try:
        return importlib.import_module(module)
    finally:
        structlog.configure(**saved)


def dockerfile_stages() -> dict[str, tuple[str, str]]:
    """Each named stage of infra/Dockerfile: (the image it starts from, its instructions)."""
    text = (ROOT / "infra" / "Dockerfile").read_text()
    return {m.group(2): (m.group(1), m.group(3))
            for m in re.finditer(r"^FROM (\S+) AS (\S+)\n(.*?)(?=^FROM |\Z)", text, re.S | re.M)}


def test_every_service_command_exists_in_the_repo() -> None:
    services = compose()["services"]
    built = {name: s for name, s in services.items() if "build" in s}
    assert {"evaluator", "dispatcher", "worker", "web", "feed", "topics", "spark-worker"} <= set(built)
    for name, service in built.items():
        target = entry_point(service["command"])
        assert resolves(target), f"service {name}: {target} does not exist"
    assert (ROOT / services["web"]["build"]["dockerfile"]).exists()
    stages = dockerfile_stages()
    for name, service in built.items():
        assert service["build"]["target"] in stages, f"service {name}: no stage {service['build']['target']}"


def test_spark_services_run_the_distribution_of_the_pinned_pyspark() -> None:
    services = compose()["services"]
    master, worker = services["spark-master"], services["spark-worker"]
    assert master["image"] == f"apache/spark:{pyspark.__version__}"  # the official image, the driver's version
    assert worker["build"]["args"]["SPARK_VERSION"] == pyspark.__version__
    dockerfile = (ROOT / "infra" / "Dockerfile").read_text()
    assert f"ARG SPARK_VERSION={pyspark.__version__}" in dockerfile
    stages = dockerfile_stages()
    assert stages["spark"][0] == "apache/spark:${SPARK_VERSION}"
    # the worker stage is the project image (its Python, code, dependencies) plus the official /opt/spark
    base, instructions = stages[worker["build"]["target"]]
    assert base == "tocsin" and "COPY --from=spark /opt/spark /opt/spark" in instructions
    assert "infra/install-production" in stages["tocsin"][1]  # the project and its dependencies
    for service, main_class in ((master, "org.apache.spark.deploy.master.Master"),
                                (worker, "org.apache.spark.deploy.worker.Worker")):
        assert service["command"][:2] == ["/opt/spark/bin/spark-class", main_class]
        assert resolves(main_class)
    assert (SPARK_HOME / "bin" / "spark-class").exists()  # what /opt/spark/bin holds in the image
    # the knobs the worker reads from its environment are Spark's own names
    arguments = spark_class_bytes("org.apache.spark.deploy.worker.WorkerArguments")
    for variable in worker["environment"]:
        if variable.startswith("SPARK_"):
            assert variable.encode() in arguments, f"the Spark worker does not read {variable}"


def test_the_evaluator_submits_to_the_master() -> None:
    services = compose()["services"]
    master = services["spark-master"]["command"]
    host, port = master[master.index("--host") + 1], master[master.index("--port") + 1]
    url = f"spark://{host}:{port}"
    assert host == "spark-master"
    assert services["evaluator"]["environment"]["TOCSIN_SPARK_MASTER"] == url
    assert services["spark-worker"]["command"][2] == url
    evaluator = services["evaluator"]
    settings = service_settings(evaluator)
    assert settings.spark_driver_host == "evaluator" and "evaluator" in services  # a name the workers resolve
    assert settings.spark_driver_bind_address == "0.0.0.0"  # not the loopback executors cannot reach
    worker_memory = services["spark-worker"]["environment"]["SPARK_WORKER_MEMORY"]
    assert gigabytes(settings.spark_executor_memory) < gigabytes(worker_memory)  # an executor fits on a worker
    assert "spark-master" in services["evaluator"]["depends_on"]
    assert "spark-master" in services["spark-worker"]["depends_on"]


def test_checkpoint_on_a_volume_the_driver_and_every_worker_mount() -> None:
    spec = compose()
    services = spec["services"]
    for name in ("evaluator", "spark-worker"):
        settings = service_settings(services[name])
        mounts = dict(m.split(":", 1)[::-1] for m in services[name]["volumes"])  # container path -> volume
        local = settings.local_checkpoint_dir
        assert local is not None, f"{name}: {settings.checkpoint_location} is not a path in the container"
        holding = [path for path in mounts if local.is_relative_to(path)]
        assert holding, f"{name}: {local} is on no volume"
        assert mounts[holding[0]] == "checkpoints" and "checkpoints" in spec["volumes"], (name, mounts)


def test_enough_partitions_for_the_executor_cores() -> None:
    services = compose()["services"]
    worker = services["spark-worker"]
    cores = worker["deploy"]["replicas"] * int(worker["environment"]["SPARK_WORKER_CORES"])
    settings = service_settings(services["evaluator"])
    assert settings.event_partitions >= cores  # every core has a Kafka partition to read
    assert settings.spark_shuffle_partitions >= cores  # ... and a shard to evaluate
    assert services["topics"]["environment"]["TOCSIN_EVENT_PARTITIONS"] == str(settings.event_partitions)


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


def test_no_secret_key_ships_in_the_file() -> None:
    """Every service needs the same key, one of the operator's own: compose refuses to start without it."""
    with pytest.raises(Unset, match=r"TOCSIN_SECRET_KEY.*docs/production\.md"):
        compose(exported={})
    services = compose()["services"]
    for name, service in services.items():
        if "build" in service:
            assert service_settings(service).secret_key.get_secret_value() == EXPORTED["TOCSIN_SECRET_KEY"], name
    text = (ROOT / "docker-compose.yml").read_text()
    assert not any(key in text for key in WELL_KNOWN_SECRET_KEYS)
    # the key the file once shipped, exported again (from an old copy of it): no service starts with it
    [well_known] = WELL_KNOWN_SECRET_KEYS
    with pytest.raises(ValueError, match="well-known key"):
        service_settings(compose(exported={"TOCSIN_SECRET_KEY": well_known})["services"]["web"])


def test_the_web_app_is_served_over_https_by_the_proxy() -> None:
    """Secure-only cookies need HTTPS in front of the web app: the proxy service terminates it."""
    services = compose()["services"]
    web, proxy = services["web"], services["proxy"]
    assert service_settings(web).session_cookie_secure  # the default compose runs with
    assert not service_settings(compose(exported={**EXPORTED, "TOCSIN_SESSION_COOKIE_SECURE": "false"})
                                ["services"]["web"]).session_cookie_secure  # a trusted plain-HTTP network
    command = proxy["command"]
    assert proxy["image"].startswith("caddy:") and command[:2] == ["caddy", "reverse-proxy"]
    assert command[command.index("--from") + 1] == "https://localhost"
    upstream = command[command.index("--to") + 1]
    port = web["command"][web["command"].index("--port") + 1]
    assert upstream == f"web:{port}"
    assert any(p.split(":")[-1] == "443" for p in proxy["ports"])
    assert "ports" not in web  # reached through the proxy only, so it may trust the proxy's forwarded headers
    assert "--proxy-headers" in web["command"] and "--forwarded-allow-ips" in web["command"]
    assert proxy["depends_on"]["web"]["condition"] == "service_healthy"
    volume = proxy["volumes"][0].split(":")[0]
    assert volume in compose()["volumes"]  # the internal CA survives a restart, so browsers keep trusting it


def test_the_image_installs_what_the_install_smoke_tests() -> None:
    """One production install: infra/Dockerfile runs infra/install-production, as tests/test_production_install.py
    does, and installs nothing else with pip."""
    instructions = dockerfile_stages()["tocsin"][1]
    runs = [line for line in instructions.splitlines() if line.startswith("RUN ")]
    installs = [line for line in runs if "install-production" in line]
    assert installs == ["RUN PIP_NO_CACHE_DIR=1 infra/install-production python3"], runs
    assert not any("pip install" in line for line in runs), runs
    assert "COPY infra infra" in instructions
    smoke = (ROOT / "tests" / "test_production_install.py").read_text()
    assert '"infra" / "install-production"' in smoke
