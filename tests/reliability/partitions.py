"""Network partitions from namespaces and veth pairs the test creates, and takes down.

A ``Network`` is a *switch* namespace holding two bridges: ``clients`` (10.200.K.0/24), which
the test process reaches through a veth of its own (10.200.K.1), and ``replication``
(10.201.K.0/24), between engines only. Each engine runs in a namespace of its own with one
veth on each bridge. ``cut(node, "clients")`` takes the switch's end of that node's veth down:
packets are dropped, not refused (no RST, no ICMP), as in a real partition; ``heal`` brings it
back. Nothing is routed: the root namespace has one directly connected /24 on a veth it made,
and ``close()`` deletes every namespace (and with them every veth).
"""

from __future__ import annotations

import os
import random
import subprocess
from dataclasses import dataclass, field

import pytest

__all__ = ["Network", "Node"]

SUBNETS = {"clients": 200, "replication": 201}


def ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


@dataclass
class Node:
    """An engine's namespace, and its address on each bridge."""

    namespace: str
    index: int
    addresses: dict[str, str] = field(default_factory=dict)


class Network:
    """The namespaces of one test (see the module docstring)."""

    def __init__(self, root_on: tuple[str, ...] = ("clients",)) -> None:
        if os.geteuid() != 0:
            pytest.skip("network namespaces need root")
        self.tag = f"id{os.getpid() % 100000}{random.randrange(100)}"
        self.root_on = root_on
        self.switch = f"{self.tag}sw"
        self.subnet = self._free_subnet()
        self.nodes: list[Node] = []
        self._namespaces = [self.switch]
        try:
            ip("netns", "add", self.switch)
            ip("-n", self.switch, "link", "set", "lo", "up")
            for bridge in SUBNETS:
                ip("-n", self.switch, "link", "add", bridge[:8], "type", "bridge")
                ip("-n", self.switch, "link", "set", bridge[:8], "up")
            # The test process's own veths (10.20x.K.1), on the clients' bridge (and on the
            # replication bridge, for clients that reach a node the others cannot).
            for bridge in root_on:
                link = f"{self.tag}{bridge[0]}"
                ip("link", "add", link, "type", "veth", "peer", "name", f"root{bridge[0]}",
                   "netns", self.switch)  # fmt: skip
                ip("addr", "add", f"10.{SUBNETS[bridge]}.{self.subnet}.1/24", "dev", link)
                ip("link", "set", link, "up")
                ip("-n", self.switch, "link", "set", f"root{bridge[0]}", "master", bridge[:8], "up")
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _free_subnet() -> int:
        used = subprocess.run(["ip", "-br", "addr"], capture_output=True, text=True).stdout
        for candidate in random.sample(range(1, 250), 249):
            if f"10.200.{candidate}." not in used and f"10.201.{candidate}." not in used:
                return candidate
        raise RuntimeError("no free 10.200.K.0/24 subnet")

    def node(self, name: str) -> Node:
        """A new namespace with a veth on each bridge, addressed 10.20x.K.(10 + index)."""
        index = len(self.nodes)
        node = Node(f"{self.tag}{name}", index)
        self._namespaces.append(node.namespace)
        ip("netns", "add", node.namespace)
        ip("-n", node.namespace, "link", "set", "lo", "up")
        for bridge, octet in SUBNETS.items():
            port = f"{bridge[0]}{index}"
            ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name",
               bridge[:8], "netns", node.namespace)  # fmt: skip
            ip("-n", self.switch, "link", "set", port, "master", bridge[:8], "up")
            address = f"10.{octet}.{self.subnet}.{10 + index}"
            ip("-n", node.namespace, "addr", "add", f"{address}/24", "dev", bridge[:8])
            ip("-n", node.namespace, "link", "set", bridge[:8], "up")
            node.addresses[bridge] = address
        self.nodes.append(node)
        return node

    def cut(self, node: Node, bridge: str) -> None:
        """Drop every packet between ``node`` and the others on ``bridge``."""
        ip("-n", self.switch, "link", "set", f"{bridge[0]}{node.index}", "down")

    def heal(self, node: Node, bridge: str) -> None:
        ip("-n", self.switch, "link", "set", f"{bridge[0]}{node.index}", "up")

    def close(self) -> None:
        for namespace in reversed(self._namespaces):
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, check=False)
        for bridge in SUBNETS:
            subprocess.run(
                ["ip", "link", "del", f"{self.tag}{bridge[0]}"], capture_output=True, check=False
            )
