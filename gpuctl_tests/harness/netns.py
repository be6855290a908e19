"""Several hosts on this machine: one network namespace per host, all on one private bridge.

``HostNet(count)`` creates a bridge in the root namespace holding ``10.A.B.1/24`` (a subnet no
route of this machine covers yet, chosen at random), and ``count`` namespaces, each joined to
the bridge by a veth pair and holding ``10.A.B.(i+2)``. The namespaces have no default route,
so nothing they send leaves the machine; the root namespace reaches them through the bridge.
A program runs inside a namespace with ``nsenter --net=PATH`` (``HostNet.enter(i)``); not
``ip netns exec``, which remounts /sys and breaks slurmd.

``close()`` deletes the namespaces (their veth ends go with them) and the bridge. Needs root;
``missing_netns()`` says why it cannot work here.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import shutil
import subprocess
import uuid
from pathlib import Path

IP = "/usr/sbin/ip"
NSENTER = "nsenter"


def missing_netns() -> str | None:
    """Why network namespaces cannot be made here, or None when they can (tried for real)."""
    if os.geteuid() != 0:
        return "network namespaces need root here (ip netns add)"
    if not Path(IP).exists() or shutil.which(NSENTER) is None:
        return "ip or nsenter missing (apt-get install iproute2 util-linux)"
    name = f"gpuctl-probe-{uuid.uuid4().hex[:8]}"
    r = subprocess.run([IP, "netns", "add", name], capture_output=True, text=True)
    if r.returncode != 0:
        return f"ip netns add refused here: {r.stderr.strip()}"
    subprocess.run([IP, "netns", "del", name], capture_output=True)
    return None


def _ip(*args: str) -> None:
    r = subprocess.run([IP, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.200.0.0/13 that no route of this machine covers or overlaps."""
    routes = subprocess.run(
        [IP, "-4", "route", "show", "table", "all"], capture_output=True, text=True
    ).stdout
    used = []
    for line in routes.splitlines():
        word = line.split()[0] if line.split() else ""
        if word in ("local", "broadcast", "unreachable", "blackhole"):
            word = line.split()[1]
        with contextlib.suppress(ValueError):
            used.append(ipaddress.ip_network(word, strict=False))
    rng = random.Random()
    for _ in range(1000):
        net = ipaddress.ip_network(f"10.{rng.randint(200, 207)}.{rng.randint(0, 255)}.0/24")
        if not any(net.overlaps(u) for u in used if u.prefixlen > 0):
            return net
    raise RuntimeError("no free 10.200.0.0/13 subnet for test hosts")


class HostNet:
    """``count`` network namespaces on one bridge (see the module docstring)."""

    def __init__(self, count: int) -> None:
        if not 1 <= count <= 250:
            raise ValueError("1..250 hosts on one /24")
        tag = uuid.uuid4().hex[:6]
        self.count = count
        self.subnet = _free_subnet()
        hosts = list(self.subnet.hosts())
        self.gateway = str(hosts[0])  # the root namespace's address on the bridge
        self.addresses = [str(h) for h in hosts[1 : count + 1]]
        self.bridge = f"gcb{tag}"
        self.names = [f"gpuctl-{tag}-{i + 1:02d}" for i in range(count)]
        self._veths = [f"gcv{tag}-{i + 1}" for i in range(count)]
        self._made: list[str] = []
        self._bridge_made = False
        try:
            self._create(tag)
        except Exception:
            self.close()
            raise

    def _create(self, tag: str) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        self._bridge_made = True
        _ip("addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, ns in enumerate(self.names):
            _ip("netns", "add", ns)
            self._made.append(ns)
            peer = f"gcp{tag}-{i + 1}"
            _ip("link", "add", self._veths[i], "type", "veth", "peer", "name", peer)
            _ip("link", "set", peer, "netns", ns)
            _ip("link", "set", self._veths[i], "master", self.bridge)
            _ip("link", "set", self._veths[i], "up")
            _ip("-n", ns, "link", "set", peer, "name", "eth0")
            _ip(
                "-n",
                ns,
                "addr",
                "add",
                f"{self.addresses[i]}/{self.subnet.prefixlen}",
                "dev",
                "eth0",
            )
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def path(self, i: int) -> str:
        """The namespace file of host ``i`` (for ``nsenter --net=``)."""
        return f"/run/netns/{self.names[i]}"

    def enter(self, i: int, argv: list[str]) -> list[str]:
        """``argv`` run inside host ``i``'s network namespace."""
        return [NSENTER, f"--net={self.path(i)}", *argv]

    def close(self) -> None:
        """Delete the namespaces and the bridge (safe to call twice)."""
        for ns in self._made:
            subprocess.run([IP, "netns", "del", ns], capture_output=True)
        self._made = []
        if self._bridge_made:
            subprocess.run([IP, "link", "del", self.bridge], capture_output=True)
            self._bridge_made = False
