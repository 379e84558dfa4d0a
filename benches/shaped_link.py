"""A shaped network link for the benchmarks that need one (benches/objstore.py,
benches/cluster.py): a network namespace joined to this one by a veth pair, each end's
egress a token bucket (``tc qdisc replace dev … root tbf rate RATE``). Needs root and
iproute2.

The link has a rate and no delay: the kernel these benchmarks run on (Firecracker, 6.18)
has no netem qdisc, so packets cannot be delayed by tc; a round trip, where a benchmark
wants one, is added by the server it runs behind the link (objstore.py's moto) or not at
all (cluster.py). TCP's window growth over a long link is therefore not modelled.

Usage::

    link = ShapedLink("tsrbench", "tsrbh0", "tsrbn0", "10.231.7.1", "10.231.7.2")
    try:
        subprocess.Popen(link.in_namespace(["server", "--listen", link.ns_ip + ":5055"]))
        link.shape("1gbit")
        ...
    finally:
        link.down()
"""
from __future__ import annotations

import os
import subprocess

MiB = 1 << 20
#: 1 Gbit/s in MiB/s.
GBIT_MIB_S = 1e9 / 8 / MiB


def sh(*args, check=True):
    """Runs a command, its output captured; raises on failure when `check`."""
    return subprocess.run(list(args), check=check, capture_output=True, text=True)


class ShapedLink:
    """The namespace `ns` and the veth pair `host_if` (here, `host_ip`/30) to `ns_if` (in
    the namespace, `ns_ip`/30, with its loopback up). Made at once (what a previous run left
    of the same names is removed first); unshaped until `shape`."""

    def __init__(self, ns: str, host_if: str, ns_if: str, host_ip: str, ns_ip: str):
        if os.geteuid() != 0:
            raise SystemExit("needs root: a network namespace and tc qdiscs")
        self.ns, self.host_if, self.ns_if = ns, host_if, ns_if
        self.host_ip, self.ns_ip = host_ip, ns_ip
        self.down()
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        sh("ip", "link", "set", ns_if, "netns", ns)
        sh("ip", "addr", "add", f"{host_ip}/30", "dev", host_if)
        sh("ip", "link", "set", host_if, "up")
        sh("ip", "-n", ns, "addr", "add", f"{ns_ip}/30", "dev", ns_if)
        sh("ip", "-n", ns, "link", "set", ns_if, "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")

    def in_namespace(self, argv) -> list:
        """`argv` run inside the namespace (`ip netns exec` execs it: the same pid)."""
        return ["ip", "netns", "exec", self.ns, *map(str, argv)]

    def shape(self, rate="1gbit", burst="256kb", latency="100ms"):
        """A token bucket of `rate` on both ends' egress."""
        for prefix, dev in (([], self.host_if), (["ip", "netns", "exec", self.ns], self.ns_if)):
            sh(*prefix, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
               "burst", burst, "latency", latency)

    def qdiscs(self) -> str:
        """Both ends' qdiscs, as tc shows them."""
        return (sh("tc", "qdisc", "show", "dev", self.host_if).stdout.strip() + " | "
                + sh("ip", "netns", "exec", self.ns, "tc", "qdisc", "show", "dev", self.ns_if).stdout.strip())

    def down(self):
        """Removes the pair and the namespace (what is left of them); never fails."""
        sh("ip", "link", "del", self.host_if, check=False)
        sh("ip", "netns", "del", self.ns, check=False)
