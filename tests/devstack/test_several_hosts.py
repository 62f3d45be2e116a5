"""The evaluator on several hosts: the Spark master, two workers, the driver, Redis and the broker each on a host of
its own (a network namespace with its own address, ``devstack.netns``), configured only through ``TOCSIN_*`` and
Spark settings. Alerts equal the oracle's, once each, although one worker's link goes down mid-stream and comes back.

Nothing the other hosts reach may be bound to or advertised as 127.0.0.1: on another host that address is the other
host itself, so a component that advertised it would be unreachable and the run would fail; besides, every host's
listening sockets are checked. The checkpoint is a directory of this machine's file system, which every host sees at
the same path: it stands for the shared mount a real cluster needs (docs/cluster.md).

Needs root (``ip netns``); CI runs as root. Hosts are ``tocsin-t31-*`` namespaces on 10.231.0.0/16, deleted when the
test ends (and at its start, if a killed run left them).
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from core.settings import Settings
from devstack.netns import Network
from devstack.services import log_tail, python_module, spawn, start_redis, start_tansu
from devstack.spark_cluster import Machine, SparkCluster, processes_under
from ingest.kafka import ensure_topics
from tests.conftest import isolated_settings
from tests.evaluator.spark.test_job import publish_catalog
from tests.evaluator.streams import (
    SPECS,
    assert_matches_oracle,
    batch_id,
    evaluated_everything,
    for_run,
    generated_stream,
    publish,
    wait_until,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="network namespaces need root and ip"),
]

PREFIX = "tocsin-t31-"
SUBNET = "10.231.0.0/16"
WORKERS = ("worker0", "worker1")
HOSTS = ("master", *WORKERS, "driver", "redis", "broker", "client")  # client: where the test publishes and reads
SPARK_HOSTS = ("driver", *WORKERS)  # where a JVM and Python workers run side by side
# Every host has the whole port range to itself: the well-known ports, as on machines of their own.
KAFKA_PORT, REDIS_PORT, METRICS_PORT = 9092, 6379, 9464
RUN_TIMEOUT_S = 600
# Spark's defaults notice a silent executor after 120 s (spark.network.timeout); the master drops a silent worker
# after spark.worker.timeout (15 s in SparkCluster). Shorter here, so that a lost link is noticed while the stream runs.
SPARK_CONF = {"spark.network.timeout": "30s", "spark.network.timeoutInterval": "5s",
              "spark.executor.heartbeatInterval": "3s"}


@contextmanager
def hosts_with_services(tmp_path: Path) -> Iterator[tuple[Network, SparkCluster, Settings]]:
    """The hosts, the broker, Redis and the Spark cluster on them, and the settings the driver runs with; the test's
    own thread on the client host until the block ends."""
    with ExitStack() as stack:
        net = stack.enter_context(Network(PREFIX, HOSTS, SUBNET))
        stack.enter_context(net.inside("client"))
        broker = start_tansu(net.address("broker"), KAFKA_PORT, tmp_path / "broker.log", net.command("broker", []))
        stack.callback(broker.stop)
        server = start_redis(REDIS_PORT, tmp_path / "redis", tmp_path / "redis.log", net.address("redis"),
                             net.command("redis", []))
        stack.callback(server.stop)
        work = tmp_path / "cluster"
        cluster = stack.enter_context(SparkCluster(
            workers=len(WORKERS), cores_per_worker=1, memory="1g", work_dir=work,
            master=Machine(net.address("master"), tuple(net.command("master", []))),
            machines=[Machine(net.address(w), tuple(net.command(w, []))) for w in WORKERS]))
        settings = isolated_settings(f"{net.address('broker')}:{KAFKA_PORT}",
                                     f"redis://{net.address('redis')}:{REDIS_PORT}/0", tmp_path).model_copy(update={
            "spark_master": cluster.master_url,
            "spark_driver_host": net.address("driver"),
            "spark_driver_bind_address": net.address("driver"),
            "spark_conf": SPARK_CONF,
            "metrics_port_evaluator": METRICS_PORT,
            "metrics_bind_address": net.address("driver"),
            "evaluator_stop_timeout_s": 60.0,
        })
        yield net, cluster, settings
    assert processes_under(work) == [], "the cluster left processes behind"


def listening(net: Network, host: str) -> set[tuple[str, str]]:
    """``(address, process)`` of every TCP socket listening on ``host``."""
    found = set()
    for line in net.run(host, "ss", "-Hltnp").splitlines():
        fields = line.split()
        address = fields[3].rsplit(":", 1)[0].strip("[]").removeprefix("::ffff:")  # a JVM's IPv4 on a dual socket
        process = fields[5].split('"')[1] if len(fields) > 5 and '"' in fields[5] else "?"
        found.add((address, process))
    return found


def assert_reachable_only_on_its_address(net: Network, host: str) -> None:
    """Every socket listening on ``host`` is bound to its address, none to every address; the only ones on loopback
    are PySpark's channels between the JVM and Python of one host (the driver's gateway and callback server, the
    executors' Python daemons)."""
    sockets = listening(net, host)
    assert sockets or host == "client", f"nothing listens on {host}"
    for address, process in sockets:
        if ipaddress.ip_address(address).is_loopback:
            local = host in SPARK_HOSTS and (process == "java" or process.startswith("python"))
            assert local, f"{process} listens on {address} on {host}"
        else:
            assert address == net.address(host), f"{process} listens on {address} on {host}"


def test_several_hosts_alerts_exact_across_a_worker_link_down_and_up(tmp_path: Path) -> None:
    with hosts_with_services(tmp_path) as (net, cluster, settings):
        workers = {w["host"] for w in cluster.master_state()["workers"] if w["state"] == "ALIVE"}
        assert workers == {net.address(w) for w in WORKERS}, "the workers registered with other addresses"
        ensure_topics(settings)
        events = generated_stream()
        last = publish(settings, events)
        # small micro-batches: the stream lasts past the link's outage
        run = for_run(settings, "link", tmp_path).model_copy(update={"source_max_records_per_trigger": 100})
        publish_catalog(run, *SPECS)
        job = spawn("evaluator", net.command("driver", python_module("evaluator.spark")), tmp_path / "driver.log",
                    env=run.to_env(), graceful=True, stop_timeout_s=run.evaluator_stop_timeout_s)
        try:
            wait_until(lambda: batch_id(run) >= 2, RUN_TIMEOUT_S, job=job)
            for host in HOSTS:
                assert_reachable_only_on_its_address(net, host)
            with urllib.request.urlopen(f"http://{net.address('driver')}:{METRICS_PORT}/metrics", timeout=10) as page:
                assert b"tocsin_" in page.read(), "the driver's metrics are not served to other hosts"
            assert any("Running task" in log.read_text(errors="replace")
                       for log in cluster.work_dir.glob("worker-1/app-*/*/stderr")), \
                "worker1's executor ran no task: taking its link down would test nothing"
            net.link("worker1", up=False)
            down_at = batch_id(run)
            wait_until(lambda: cluster.alive_workers() == 1, RUN_TIMEOUT_S, job=job)  # the master dropped it
            wait_until(lambda: batch_id(run) > down_at + 1, RUN_TIMEOUT_S, job=job)  # the stream goes on without it
            net.link("worker1", up=True)
            wait_until(lambda: cluster.alive_workers() == 2, RUN_TIMEOUT_S, job=job)  # it registered again
            assert not evaluated_everything(run, last, run.spark_shuffle_partitions), "nothing left after the outage"
            wait_until(lambda: evaluated_everything(run, last, run.spark_shuffle_partitions), RUN_TIMEOUT_S, job=job)
        finally:
            job.stop()
            print("\n".join(log_tail(tmp_path / "driver.log", 50)))  # shown if the test failed
        assert job.process.returncode == 0, "the evaluator did not stop cleanly"
        assert_matches_oracle(run, events, last)
