"""Several hosts on one machine: Linux network namespaces on a private switch (root only).

Each host is a network namespace of its own with ``lo`` and one interface, ``eth0``, holding an
address of ``subnet``; its ``eth0`` is one end of a veth pair whose other end is a port of a
bridge inside a namespace of its own (the *switch*). The machine's own network namespace is
not touched: no interface, address or route is added there, so the hosts reach each other and
nothing else, and nothing outside reaches them. A process runs on a host when started under
:meth:`Network.command` (``ip netns exec``); the calling thread itself can step onto a host
with :meth:`Network.inside` (its sockets stay there after it steps back).

Namespaces are named ``<prefix><host>``; a new :class:`Network` first deletes whatever an
earlier run with the same prefix left behind, and :meth:`Network.close` deletes everything it
made, after killing what still runs on its hosts.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType

CLONE_NEWNET = 0x40000000
SWITCH = "switch"
BRIDGE = "br0"
IP = "ip"


def _ip(*args: str) -> str:
    """Run ``ip args``; a failure raises with ip's own message."""
    done = subprocess.run([IP, *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def namespaces() -> list[str]:
    """The named network namespaces (``ip netns list``)."""
    return [line.split()[0] for line in _ip("netns", "list").splitlines() if line.strip()]


def pids_in(namespace: str) -> list[int]:
    """Processes whose network namespace is ``namespace``."""
    with contextlib.suppress(RuntimeError):
        return [int(pid) for pid in _ip("netns", "pids", namespace).split()]
    return []


def delete(namespace: str, timeout_s: float = 10.0) -> None:
    """SIGKILL every process on ``namespace``, then delete it (its veth ends go with it)."""
    deadline = time.monotonic() + timeout_s
    while pids := pids_in(namespace):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {pids} on {namespace} survive SIGKILL")
        time.sleep(0.05)
    with contextlib.suppress(RuntimeError):  # already gone
        _ip("netns", "delete", namespace)


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"setns: {os.strerror(errno)}")


@dataclass(frozen=True)
class Host:
    name: str
    namespace: str
    address: str  # its eth0's address


class Network:
    """A switch and ``hosts`` on it, addresses from ``subnet`` in order; a context manager."""

    def __init__(self, prefix: str, hosts: Sequence[str], subnet: str) -> None:
        self.prefix = prefix
        self.subnet = ipaddress.ip_network(subnet)
        addresses = self.subnet.hosts()
        self.hosts = {name: Host(name, prefix + name, str(next(addresses))) for name in hosts}

    @property
    def switch(self) -> str:
        return self.prefix + SWITCH

    def __enter__(self) -> Network:
        self.remove_leftovers()
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    def remove_leftovers(self) -> None:
        """Delete every namespace named with our prefix: what a killed earlier run could not."""
        for namespace in namespaces():
            if namespace.startswith(self.prefix):
                delete(namespace)

    def close(self) -> None:
        for host in self.hosts.values():
            delete(host.namespace)
        delete(self.switch)

    def _build(self) -> None:
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", BRIDGE, "type", "bridge")
        _ip("-n", self.switch, "link", "set", BRIDGE, "up")
        for n, host in enumerate(self.hosts.values()):
            port = f"port{n}"
            _ip("netns", "add", host.namespace)
            _ip("-n", host.namespace, "link", "set", "lo", "up")
            _ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", "eth0",
                "netns", host.namespace)
            _ip("-n", self.switch, "link", "set", port, "master", BRIDGE, "up")
            _ip("-n", host.namespace, "addr", "add", f"{host.address}/{self.subnet.prefixlen}", "dev", "eth0")
            _ip("-n", host.namespace, "link", "set", "eth0", "up")

    # --- using it --------------------------------------------------------------------------------
    def address(self, host: str) -> str:
        return self.hosts[host].address

    def command(self, host: str, args: Sequence[str]) -> list[str]:
        """``args`` run on ``host`` (``ip netns exec``: same process, its network namespace switched)."""
        return [IP, "netns", "exec", self.hosts[host].namespace, *args]

    def run(self, host: str, *args: str) -> str:
        """Run a short command on ``host`` and return its output (``ss``, ``ip link``, …)."""
        return subprocess.run(self.command(host, args), capture_output=True, text=True, check=True).stdout

    def link(self, host: str, up: bool) -> None:
        """Take ``host``'s only link down or bring it up, as a pulled cable or a dead switch port would."""
        _ip("-n", self.hosts[host].namespace, "link", "set", "eth0", "up" if up else "down")

    @contextlib.contextmanager
    def inside(self, host: str) -> Iterator[None]:
        """The calling thread on ``host``'s network until the block ends; threads and processes it starts meanwhile
        are there too, and sockets it opens stay there."""
        with open("/proc/thread-self/ns/net") as home, open(f"/run/netns/{self.hosts[host].namespace}") as there:
            _setns(there.fileno())
            try:
                yield
            finally:
                _setns(home.fileno())
