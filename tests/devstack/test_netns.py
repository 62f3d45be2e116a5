"""Hosts on a private switch (``devstack.netns``): they reach each other at their addresses and nothing else does;
a link taken down cuts its host off until it is up again; every namespace goes when the network closes, and a new
network removes what a killed run left behind."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess

import pytest

from devstack.netns import Network, namespaces

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                                reason="network namespaces need root and ip")

PREFIX = "tocsin-t31u-"
SUBNET = "10.231.200.0/24"


def reaches(net: Network, host: str, address: str, port: int) -> bool:
    with net.inside(host):
        try:
            socket.create_connection((address, port), timeout=2).close()
            return True
        except OSError:
            return False


def test_hosts_reach_each_other_only_and_a_link_down_cuts_one_off() -> None:
    with Network(PREFIX, ["a", "b"], SUBNET) as net:
        assert {PREFIX + "a", PREFIX + "b", PREFIX + "switch"} <= set(namespaces())
        assert net.address("a") != net.address("b")
        with net.inside("b"):
            server = socket.create_server((net.address("b"), 0))
        port = server.getsockname()[1]
        try:
            assert reaches(net, "a", net.address("b"), port)
            with pytest.raises(OSError):  # this machine's own network has no route to the hosts
                socket.create_connection((net.address("b"), port), timeout=2).close()
            net.link("a", up=False)
            assert not reaches(net, "a", net.address("b"), port)
            net.link("a", up=True)
            assert reaches(net, "a", net.address("b"), port)
        finally:
            server.close()
        assert net.run("a", "ip", "-br", "addr").count(net.address("a")) == 1
    assert not [ns for ns in namespaces() if ns.startswith(PREFIX)]


def test_a_process_on_a_host_is_killed_with_it_and_leftovers_are_removed() -> None:
    net = Network(PREFIX, ["a"], SUBNET).__enter__()  # never closed: as a killed run leaves it
    sleeper = subprocess.Popen(net.command("a", ["sleep", "600"]))
    with Network(PREFIX, ["a"], SUBNET) as again:  # removes the leftovers first, the sleeper with them
        assert sleeper.wait(timeout=10) != 0
        assert again.run("a", "ip", "-br", "link").count("eth0") == 1
    assert not [ns for ns in namespaces() if ns.startswith(PREFIX)]
