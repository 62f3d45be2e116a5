"""Servers for tests: the web app behind a real uvicorn server in a thread (real HTTP and real concurrency),
and a local Redis Cluster."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
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


@contextmanager
def redis_cluster(data_dir: Path, masters: int = 3) -> Iterator[str]:
    """A local Redis Cluster of ``masters`` primaries (no replicas) until the block ends; yields one node's URL.

    Each node is a ``redis-server --cluster-enabled yes`` process in its own process group; the slots
    are spread evenly (CLUSTER ADDSLOTS) and the nodes introduced (CLUSTER MEET). Every node is stopped on the way out.
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    nodes: list[ManagedProcess] = []
    try:
        ports = []
        for _ in range(masters):
            port = _cluster_port()
            node_dir = data_dir / str(port)
            node_dir.mkdir()
            nodes.append(spawn("redis-cluster-node", [
                redis_server_binary(), "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
                "--dir", str(node_dir), "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", "5000"], node_dir / "redis.log"))
            wait_for_port("127.0.0.1", port, process=nodes[-1].process)
            ports.append(port)
        clients = [redis.Redis(port=port, decode_responses=True) for port in ports]
        for n, client in enumerate(clients):  # what `redis-cli --cluster create` does, without needing redis-cli
            client.execute_command("CLUSTER", "ADDSLOTS", *range(SLOTS * n // masters, SLOTS * (n + 1) // masters))
        for port in ports[1:]:
            clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", port)
        deadline = time.monotonic() + patient(30)
        for port, client in zip(ports, clients, strict=True):  # every node knows every slot's owner
            while client.execute_command("CLUSTER", "INFO").count("cluster_state:ok") == 0:
                assert time.monotonic() < deadline, f"the cluster node on {port} is not ok"
                time.sleep(0.1)
            client.close()
        yield f"redis://127.0.0.1:{ports[0]}/0"
    finally:
        for node in nodes:
            node.stop()
