"""A multi-host test bed on one machine: each node in its own network namespace.

`TestBed.create(names)` makes a Linux bridge in the root namespace (the control plane's
side, which gets the bridge's address) and one namespace per node, joined to the bridge
by a veth pair, each with an address of its own in a private /24 that exists only inside
this machine. Node agents run under `ip netns exec`, so what crosses between a node and
the control plane, or between two nodes, crosses a real (virtual) network: a node's
`127.0.0.1` is its own, and a partition is a veth link taken down.

Everything is named with a short random tag, so concurrent runs do not collide, and
`destroy()` removes it all (namespaces, links, the bridge) even after a failure.
Needs root and iproute2 (`ip`); `available()` says why not where they are missing.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from dataclasses import dataclass, field

IFACE = "eth0"


def available() -> str:
    """Empty if a test bed can be made here, else why not (for a skip reason)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    probe = f"mu-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ""


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


@dataclass
class Host:
    node: str
    namespace: str
    address: str
    veth_outside: str  # in the root namespace, on the bridge: down = partitioned

    def exec_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.namespace]


@dataclass
class TestBed:
    tag: str = field(default_factory=lambda: f"{random.randrange(16**4):04x}")
    subnet: int = field(default_factory=lambda: random.randrange(16, 240))
    hosts: dict[str, Host] = field(default_factory=dict)
    _made_bridge: bool = False

    @property
    def bridge(self) -> str:
        return f"mubr{self.tag}"

    @property
    def control_address(self) -> str:
        """The control plane's address (the bridge, in the root namespace)."""
        return f"10.213.{self.subnet}.1"

    def create(self, nodes: list[str]) -> dict[str, Host]:
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            self._made_bridge = True
            _ip("addr", "add", f"{self.control_address}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i, node in enumerate(nodes):
                self.hosts[node] = self._host(i, node)
        except BaseException:
            self.destroy()
            raise
        return self.hosts

    def _host(self, i: int, node: str) -> Host:
        ns = f"mu-{self.tag}-{node}"
        outside, inside = f"muv{self.tag}{i}", f"mui{self.tag}{i}"
        address = f"10.213.{self.subnet}.{10 + i}"
        _ip("netns", "add", ns)
        host = Host(node, ns, address, outside)
        self.hosts[node] = host  # so destroy() finds it if a later step fails
        _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        _ip("link", "set", inside, "netns", ns)
        # Every node's interface is `eth0` inside its namespace, as on real hosts, so one
        # job environment (GLOO_SOCKET_IFNAME=eth0, NCCL_SOCKET_IFNAME) fits all nodes.
        _ip("-n", ns, "link", "set", inside, "name", IFACE)
        _ip("link", "set", outside, "master", self.bridge)
        _ip("link", "set", outside, "up")
        _ip("-n", ns, "addr", "add", f"{address}/24", "dev", IFACE)
        _ip("-n", ns, "link", "set", IFACE, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", ns, "route", "add", "default", "via", self.control_address)
        return host

    def partition(self, node: str) -> None:
        """Cut `node` off from the control plane and every other node."""
        _ip("link", "set", self.hosts[node].veth_outside, "down")

    def heal(self, node: str) -> None:
        _ip("link", "set", self.hosts[node].veth_outside, "up")

    def destroy(self) -> None:
        for host in self.hosts.values():
            subprocess.run(["ip", "link", "del", host.veth_outside], capture_output=True)
            subprocess.run(["ip", "netns", "del", host.namespace], capture_output=True)
        self.hosts.clear()
        if self._made_bridge:
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
            self._made_bridge = False
