"""Real components for the tests: a Tansu broker, a Redis server, one SparkSession.

Each is started once per test session on free ports; tests isolate themselves
with their own topics, Redis key prefixes and databases.
"""

from __future__ import annotations

import atexit
import gc
import itertools
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import hypothesis
import pytest
import redis
from _pytest.mark import deselect_by_keyword, deselect_by_mark  # see pytest_collection_modifyitems

import notifier.channels  # noqa: F401 - fills the endpoint-kind registry, as the web app and the worker do at start
from core.settings import Settings
from devstack.patience import patient
from devstack.services import free_port, start_redis, start_tansu
from tests import suite_plan
from tests.databases import renew_deployment_id
from tests.users import api_client, new_user

_topic_ids = itertools.count()

# Child processes log at WARNING for the whole run, set before any test so that a test sees the same level
# alone as in the full suite (once set by the Spark fixture only, it changed under tests that came later).
# A test that waits for an info line asks for it: ``monkeypatch.setenv("TOCSIN_LOG_LEVEL", "INFO")``.
os.environ.setdefault("TOCSIN_LOG_LEVEL", "WARNING")
# Argon2id at its production cost took ~0.3 s of every test that signs a user up and in (0.15 s a hash, as much a
# check): the suite hashes with the cheapest parameters (tests/subscriptions/test_password_hashing.py: the default).
os.environ.setdefault("TOCSIN_PASSWORD_HASHING", "cheapest-insecure")
# Property tests have no deadline: an example that takes 250 ms beside another heavy job is no failure (a fresh
# clone's run failed a block-summary property on hypothesis' default 200 ms), and a test may not time the machine.
hypothesis.settings.register_profile("tocsin", deadline=None)
hypothesis.settings.load_profile("tocsin")

# A test that builds Settings() without its own database or data directory writes to a scratch directory, never
# to the checkout's var/ (the local platform's, which `infra/up` uses): a runner test once created its first
# operator account there, and `infra/up` on that clone then showed none.
_SCRATCH = Path(tempfile.mkdtemp(prefix="tocsin-tests-"))
atexit.register(shutil.rmtree, _SCRATCH, ignore_errors=True)
os.environ.setdefault("TOCSIN_DATA_DIR", str(_SCRATCH))
os.environ.setdefault("TOCSIN_DATABASE_URL", f"sqlite:///{_SCRATCH / 'tocsin.db'}")

#: Tests that run a JVM (the shared SparkSession, an evaluator or a whole platform in a child process). infra/test
#: runs the suite on two pytest-xdist workers (``--dist loadgroup``): these form two groups, each run on one worker,
#: one JVM at a time; the worker with the second group first takes the rest (tests/suite_plan.py).
JVM_PATHS = ("tests/evaluator/spark/", "tests/evaluator/cluster/", "tests/devstack/", "tests/benchmarks/",
             "tests/test_e2e.py", "tests/rediscluster/test_job.py")


@pytest.hookimpl(trylast=True)  # after pytest-timeout's own, which reads the limit from the options and the ini file
def pytest_configure(config: pytest.Config) -> None:
    """pytest-timeout's limit per test (``timeout`` marks too) grows with the patience factor that scales every wait."""
    if getattr(config, "_env_timeout", None):
        config._env_timeout = patient(config._env_timeout)  # type: ignore[attr-defined]


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which turns the xdist_group marks into node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if ("spark" in getattr(item, "fixturenames", ()) or item.get_closest_marker("spark")
                or item.get_closest_marker("jvm") or item.nodeid.startswith(JVM_PATHS)):
            item.add_marker(pytest.mark.jvm)  # so that ``-m "not jvm"`` leaves every one out
        elif not item.get_closest_marker("slow") and suite_plan.quick(item.nodeid):
            item.add_marker(pytest.mark.quick)  # the inner loop: ``-m quick``
    # pytest's own -m/-k deselection, done now (it runs again after, finding nothing): the plan sizes what runs
    deselect_by_keyword(items, config)
    deselect_by_mark(items, config)
    jvm = [item for item in items if item.get_closest_marker("jvm")]
    groups = suite_plan.split([item.nodeid for item in jvm],
                              [item.nodeid for item in items if not item.get_closest_marker("jvm")])
    group_of = {item.nodeid: groups[suite_plan.module_of(item.nodeid)] for item in jvm}
    for item in jvm:
        item.add_marker(pytest.mark.xdist_group(group_of[item.nodeid]))
    items[:] = [items[i] for i in suite_plan.order([group_of.get(item.nodeid) for item in items])]
    for item in items:
        if (limit := item.get_closest_marker("timeout")) is not None and limit.args:
            item.add_marker(pytest.mark.timeout(patient(limit.args[0])), append=False)  # first: the closest mark


@pytest.fixture(scope="session")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tocsin")


@pytest.fixture(scope="session")
def kafka_bootstrap(workdir: Path) -> Iterator[str]:
    port = free_port()
    broker = start_tansu("127.0.0.1", port, workdir / "tansu.log")
    yield f"127.0.0.1:{port}"
    source = sys.modules.get("evaluator.spark.source")  # imported by a test of this process: its pooled slice readers
    if source is not None:
        source._CONSUMERS.close()  # closed first: none left to reconnect to the stopped broker, logging each failure
    broker.stop()


@pytest.fixture(scope="session")
def redis_url(workdir: Path) -> Iterator[str]:
    port = free_port()
    server = start_redis(port, workdir / "redis", workdir / "redis.log")
    yield f"redis://127.0.0.1:{port}/0"
    server.stop()


@pytest.fixture
def settings(kafka_bootstrap: str, redis_url: str, tmp_path: Path, migrated_sqlite: Path) -> Settings:
    """Settings isolated per test: fresh topics, key prefix, database and state directory."""
    database = tmp_path / "tocsin.db"
    shutil.copyfile(migrated_sqlite, database)
    renew_deployment_id(f"sqlite:///{database}")
    return isolated_settings(kafka_bootstrap, redis_url, tmp_path)


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new SQLite database at Alembic's head, copied for each test: migrating a new one took 0.2-0.5 s of every
    database test's setup (the copy is then at head, which the app's own migrate finds in ~15 ms)."""
    from sqlalchemy import create_engine

    from subscriptions.db import migrate

    path = tmp_path_factory.mktemp("migrated") / "tocsin.db"
    engine = create_engine(f"sqlite:///{path}")
    migrate(engine)
    engine.dispose()
    return path


def isolated_settings(kafka_bootstrap: str, redis_url: str, tmp_path: Path) -> Settings:
    """Fresh topics, key prefix, database and state directory (for fixtures of a wider scope than a test too)."""
    n = next(_topic_ids)
    tag = uuid.uuid4().hex[:8]
    return Settings(
        kafka_bootstrap=kafka_bootstrap,
        events_topic=f"events-{n}-{tag}",
        dead_letter_topic=f"dead-{n}-{tag}",
        event_partitions=3,
        redis_url=redis_url,
        redis_prefix=f"t{n}{tag}",
        database_url=f"sqlite:///{tmp_path / 'tocsin.db'}",
        data_dir=tmp_path / "var",
        spark_master="local[2]",
        spark_shuffle_partitions=2,
        trigger_interval="500 milliseconds",
        metrics_port_feed=0,
        metrics_port_evaluator=0,
        metrics_port_dispatcher=0,
        metrics_port_worker=0,
        webhook_allow_hosts=["127.0.0.1"],
        delivery_backoff_base_s=0.05,
        delivery_backoff_max_s=0.5,
        delivery_visibility_margin_s=2.0,
        delivery_restore_interval_s=1,
        dispatcher_group_wait_ms=300,
        dashboard_sample_s=3600,  # tests that need samples take them (web.ops.sample_once)
        web_sampler=False,  # its start-up sample took ~0.15 s of every web test (tests/web/test_ops.py: it runs)
    )


@pytest.fixture
def cpython_gc() -> Iterator[None]:
    """CPython's own garbage-collector thresholds for the test (``core.gc_policy`` changes them process-wide), and
    the process's back after it, its heap unfrozen."""
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*before)
    gc.unfreeze()  # core.gc_policy.settle_after_task freezes the heap


@pytest.fixture
def redis_client(settings: Settings) -> redis.Redis:
    return redis.Redis.from_url(settings.redis_url, decode_responses=True)


@pytest.fixture(scope="session")
def spark(kafka_bootstrap: str, redis_url: str, workdir: Path):
    """The one SparkSession of the test run."""
    from evaluator.spark.session import spark_session

    session = spark_session(
        Settings(kafka_bootstrap=kafka_bootstrap, redis_url=redis_url, spark_shuffle_partitions=2,
                 spark_conf={"spark.tocsin.origin": "TOCSIN_SPARK_CONF"}),  # tests/evaluator/spark/test_session.py
        "tocsin-tests",
    )
    yield session
    session.stop()


@pytest.fixture
def owner_account(settings: Settings):
    """``(user, API token)`` of the user that owns what a test creates through the services directly."""
    return new_user(settings)


@pytest.fixture
def owner(owner_account):
    return owner_account[0]


@pytest.fixture
def api(settings: Settings) -> Iterator:
    """The API as an operator (an operator is also a subscriber with subscriptions of its own)."""
    _, token = new_user(settings, role="operator")
    with api_client(settings, token) as client:
        yield client
