"""Servers for tests: the web app behind a real uvicorn server in a thread (real HTTP and real concurrency),
and a local Redis Cluster."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import redis
import uvicorn
from fastapi import FastAPI

from devstack.patience import patient
from devstack.services import ManagedProcess, free_port, redis_server_binary, spawn, wait_for_port


@contextmanager
def serving(app: FastAPI) -> Iterator[str]:
    """The base URL of ``app`` served on a free port until the block ends."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + patient(30)
    while not server.started:
        assert time.monotonic() < deadline, "the web app did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


SLOTS = 16_384  # a Redis Cluster's hash slots


def _cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free too."""
    while True:
        port = free_port()
        if port + 10_000 > 65_535:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port + 10_000))
            except OSError:
                continue
        return port


@dataclass
class LocalCluster:
    """A local Redis Cluster's node processes, by port, for tests that kill and restart them."""

    data_dir: Path
    node_timeout_ms: int
    nodes: dict[int, ManagedProcess] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{next(iter(self.nodes))}/0"

    def start(self, port: int) -> None:
        """Start (or restart) the node on ``port``: its cluster config (nodes.conf) survives, its data does not
        (no AOF, no snapshot: a node that comes back empty, the worst case)."""
        node_dir = self.data_dir / str(port)
        node_dir.mkdir(exist_ok=True)
        self.nodes[port] = spawn("redis-cluster-node", [
            redis_server_binary(), "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
            "--dir", str(node_dir), "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(self.node_timeout_ms),
            "--repl-diskless-sync-delay", "0"],  # a replica's first sync at once, not after Redis's 5 s
            node_dir / "redis.log")
        wait_for_port("127.0.0.1", port, process=self.nodes[port].process)

    def role(self, port: int) -> str:
        with redis.Redis(port=port, decode_responses=True) as client:
            return str(client.execute_command("ROLE")[0])

    def in_sync(self, port: int) -> bool:
        """Whether the node on ``port`` is a replica whose link to its primary is up (its first sync done)."""
        with redis.Redis(port=port, decode_responses=True) as client:
            info = client.info("replication")
        return info.get("role") == "slave" and info.get("master_link_status") == "up"

    def primaries(self) -> list[int]:
        return [port for port, node in self.nodes.items() if node.process.poll() is None and self.role(port) == "master"]

    def wait_ok(self, timeout_s: float = 60) -> None:
        """Until every live node says cluster_state:ok (every slot served)."""
        deadline = time.monotonic() + patient(timeout_s)
        for port, node in self.nodes.items():
            if node.process.poll() is not None:
                continue
            with redis.Redis(port=port, decode_responses=True) as client:
                while "cluster_state:ok" not in client.execute_command("CLUSTER", "INFO"):
                    assert time.monotonic() < deadline, f"the cluster node on {port} is not ok"
                    time.sleep(0.1)


@contextmanager
def cluster_nodes(data_dir: Path, masters: int = 3, replicas: int = 0,
                  node_timeout_ms: int = 5000) -> Iterator[LocalCluster]:
    """A local Redis Cluster of ``masters`` primaries with ``replicas`` replicas each until the block ends.

    Each node is a ``redis-server --cluster-enabled yes`` process in its own process group. Without replicas the
    slots are spread evenly (CLUSTER ADDSLOTS) and the nodes introduced (CLUSTER MEET); with replicas
    ``redis-cli --cluster create --cluster-replicas`` does it, as an operator would. Every node is stopped on the
    way out.
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    cluster = LocalCluster(data_dir, node_timeout_ms)
    try:
        for _ in range(masters * (1 + replicas)):
            cluster.start(_cluster_port())
        ports = list(cluster.nodes)
        if replicas:
            subprocess.run([shutil.which("redis-cli") or "redis-cli", "--cluster", "create",
                            *[f"127.0.0.1:{port}" for port in ports], "--cluster-replicas", str(replicas),
                            "--cluster-yes"], check=True, capture_output=True, timeout=60)
        else:  # what `redis-cli --cluster create` does, without needing redis-cli
            clients = [redis.Redis(port=port, decode_responses=True) for port in ports]
            for n, client in enumerate(clients):
                client.execute_command("CLUSTER", "ADDSLOTS", *range(SLOTS * n // masters, SLOTS * (n + 1) // masters))
            for port in ports[1:]:
                clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", port)
            for client in clients:
                client.close()
        cluster.wait_ok()
        if replicas:  # every replica attached and in sync, so a failover has one to promote
            deadline = time.monotonic() + patient(60)
            while sum(cluster.in_sync(port) for port in ports) < masters * replicas:
                assert time.monotonic() < deadline, "the replicas did not attach and sync"
                time.sleep(0.1)
        yield cluster
    finally:
        for node in cluster.nodes.values():
            node.stop()


@contextmanager
def redis_cluster(data_dir: Path, masters: int = 3) -> Iterator[str]:
    """A local Redis Cluster of ``masters`` primaries (no replicas) until the block ends; yields one node's URL."""
    with cluster_nodes(data_dir, masters) as cluster:
        yield cluster.url
