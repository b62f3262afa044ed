"""The probes `testbed doctor` runs (testbed.kernel.doctor): each tries one real thing in a :class:`Scratch`
network namespace with a veth pair (a qdisc added to the veth, a filter or action attached, a congestion control
set on a socket, an rxe pair that must complete an RC transfer, the flowlet balancer loaded) and returns a detail
line, or raises with the kernel's reason. :data:`PROBES` names each capability with what its absence disables and
how to get it.
"""

from __future__ import annotations

import contextlib
import importlib
import shutil
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from typing import Callable

from testbed.kernel import PREFIX
from testbed.kernel import dcqcn as _dcqcn  # noqa: F401  (registers fq)
from testbed.kernel import flowlet, netns
from testbed.kernel import tcext  # noqa: F401  (registers red, ets, flower, bfifo)
from testbed.kernel.cgroup import CpuLimit
from topologies.flowlet import FlowletPlan

VM_HINT = "run inside the lab VM: testbed vm -- <command> (scripts/install.sh installs its kernel)"


@dataclass(frozen=True)
class Probe:
    name: str
    disables: str
    hint: str
    fn: Callable[["Scratch"], str]


class Scratch:
    """A scratch namespace with a veth pair (tb-dr<id>a <-> tb-dr<id>b), both ends inside, both up."""

    def __init__(self) -> None:
        self.tag = uuid.uuid4().hex[:6]
        self.ns = f"{PREFIX}-doctor-{self.tag}"
        self.a, self.b = f"{PREFIX}dr{self.tag}a", f"{PREFIX}dr{self.tag}b"
        self.extra_ns: list[str] = []

    def __enter__(self) -> "Scratch":
        netns.create(self.ns)
        with netns.ipr(self.ns) as ipr:
            ipr.link("add", ifname=self.a, kind="veth", peer=self.b)
            for n in (self.a, self.b):
                ipr.link("set", index=ipr.link_lookup(ifname=n)[0], state="up")
        return self

    def index(self, ifname: str) -> int:
        with netns.ipr(self.ns) as ipr:
            return ipr.link_lookup(ifname=ifname)[0]

    def new_ns(self, suffix: str) -> str:
        name = f"{self.ns}-{suffix}"
        netns.create(name)
        self.extra_ns.append(name)
        return name

    def __exit__(self, *exc) -> None:
        for n in [self.ns, *self.extra_ns]:
            netns.remove(n)


# ---- probes: each returns a detail string or raises --------------------------------------------------------

def _qdisc(kind: str, **kw) -> Callable[[Scratch], str]:
    def probe(s: Scratch) -> str:
        with netns.ipr(s.ns) as ipr:
            idx = s.index(s.a)
            ipr.tc("add", kind, index=idx, handle="1:", **kw)
            try:
                got = [m.get_attr("TCA_KIND") for m in ipr.get_qdiscs(index=idx)]
            finally:
                with contextlib.suppress(Exception):
                    ipr.tc("del", index=idx, handle="1:", root=True) if kind != "clsact" else \
                        ipr.tc("del", "clsact", index=idx)
        if kind not in got:
            raise RuntimeError(f"added, but the kernel lists {got}")
        return "qdisc accepted"
    return probe


def _red_ecn(s: Scratch) -> str:
    _qdisc("red", limit=200_000, min=30_000, max=90_000, avpkt=1500, probability=0.1, ecn=True)(s)
    return "RED with ECN marking accepted"


def _filter(kind: str, **kw) -> Callable[[Scratch], str]:
    def probe(s: Scratch) -> str:
        idx = s.index(s.a)
        with netns.ipr(s.ns) as ipr:
            ipr.tc("add", "htb", index=idx, handle="1:", default=0x10)
            try:
                ipr.tc("add-filter", kind, index=idx, parent="1:", prio=1, protocol=0x0800, **kw)
                n = len(list(ipr.get_filters(index=idx, parent="1:")))
            finally:
                ipr.tc("del", index=idx, handle="1:", root=True)
        if n == 0:
            raise RuntimeError("added, but no filter listed")
        return "filter accepted"
    return probe


def _action(kind: str, **kw) -> Callable[[Scratch], str]:
    def probe(s: Scratch) -> str:
        idx = s.index(s.a)
        peer = s.index(s.b)
        act = {"kind": kind, **kw}
        if kind == "mirred":
            act.update(direction="egress", action="redirect", ifindex=peer)
        with netns.ipr(s.ns) as ipr:
            ipr.tc("add", "htb", index=idx, handle="1:", default=0x10)
            try:
                ipr.tc("add-filter", "u32", index=idx, parent="1:", prio=1, protocol=0x0800,
                       keys=["0x0/0x0+0"], target="1:10", action=[act])
            finally:
                ipr.tc("del", index=idx, handle="1:", root=True)
        return "action accepted"
    return probe


def _tcp_cc(name: str) -> Callable[[Scratch], str]:
    def probe(s: Scratch) -> str:
        with netns.entered(s.ns):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, name.encode())
                got = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(b"\0").decode()
            finally:
                sock.close()
        if got != name:
            raise RuntimeError(f"socket reports {got}")
        return "set on a socket"
    return probe


def _ecn_sysctl(s: Scratch) -> str:
    netns.sysctl_write(s.ns, "net.ipv4.tcp_ecn", "1")
    if netns.sysctl_read(s.ns, "net.ipv4.tcp_ecn") != "1":
        raise RuntimeError("net.ipv4.tcp_ecn did not take 1")
    return "net.ipv4.tcp_ecn settable per namespace"


def _cgroup_cpu(s: Scratch) -> str:
    group = CpuLimit(s.ns)
    try:
        group.limit(0.5)
        where = f"cgroup v{group.version} at {group.root}"
    finally:
        group.release()
    return f"CFS bandwidth limit set ({where})"


def _flowlet_bpf(s: Scratch) -> str:
    """Compile the flowlet balancer, load it (the verifier passes it) and attach it as a cls_bpf direct-action
    filter on a clsact egress hook."""
    plan = FlowletPlan("probe", (s.a,))
    with netns.ipr(s.ns) as ipr:
        b = flowlet.install(ipr, plan, {s.a: s.index(s.a)}, gap_ms=10, adaptive=True)
        try:
            n = len(list(ipr.get_filters(index=s.index(s.a), parent=flowlet.CLSACT_EGRESS)))
        finally:
            b.close()
            ipr.tc("del", "clsact", index=s.index(s.a))
    if n == 0:
        raise RuntimeError("loaded, but no filter listed")
    return "compiled (clang), verified and attached (cls_bpf direct-action on clsact egress)"


def _multipath(s: Scratch) -> str:
    netns.sysctl_write(s.ns, "net.ipv4.fib_multipath_hash_policy", "1")
    return "L4 (5-tuple) multipath hashing settable"


def _ovs(s: Scratch) -> str:
    if not shutil.which("ovs-vsctl"):
        raise RuntimeError("ovs-vsctl not found")
    from pyroute2.netlink.generic import GenericNetlinkSocket

    g = GenericNetlinkSocket()
    try:
        g.bind("ovs_datapath", None)  # the kernel autoloads openvswitch.ko for this family if it can
    except Exception as e:  # noqa: BLE001
        raise RuntimeError(f"no ovs_datapath netlink family ({e})") from None
    finally:
        g.close()
    return "datapath family present, ovs-vsctl installed"


def _mininet(s: Scratch) -> str:
    if not shutil.which("mnexec"):
        raise RuntimeError("mnexec not found")
    m = importlib.import_module("mininet.net")
    return f"mininet {getattr(m, 'VERSION', '?')} importable, mnexec found"


def _pyverbs(s: Scratch) -> str:
    importlib.import_module("pyverbs")
    import pyverbs.device as d

    try:
        n = f"{len(d.get_device_list())} RDMA device(s) now"
    except Exception:  # noqa: BLE001 - no RDMA core in this kernel: rxe:netns reports that
        n = "no RDMA core in this kernel"
    return f"pyverbs {getattr(importlib.import_module('pyverbs'), '__version__', '')} imports; {n}".replace("  ", " ")


def _rxe_across_namespaces(s: Scratch) -> str:
    """Two namespaces, a veth, an rxe device on each end, and an RC ping-pong that must complete."""
    for tool in ("rdma", "ibv_rc_pingpong"):
        if not shutil.which(tool):
            raise RuntimeError(f"{tool} not found (Debian packages iproute2, ibverbs-utils)")
    na, nb = s.new_ns("ra"), s.new_ns("rb")
    va, vb = f"{PREFIX}dr{s.tag}x", f"{PREFIX}dr{s.tag}y"
    ra, rb = f"{PREFIX}rxe{s.tag}a", f"{PREFIX}rxe{s.tag}b"
    with netns.ipr(na) as ipr:
        ipr.link("add", ifname=va, kind="veth", peer={"ifname": vb, "net_ns_fd": nb})
        i = ipr.link_lookup(ifname=va)[0]
        ipr.addr("add", index=i, address="198.18.255.1", prefixlen=30)
        ipr.link("set", index=i, state="up")
    with netns.ipr(nb) as ipr:
        i = ipr.link_lookup(ifname=vb)[0]
        ipr.addr("add", index=i, address="198.18.255.2", prefixlen=30)
        ipr.link("set", index=i, state="up")
    try:
        for ns, dev, nd in ((na, ra, va), (nb, rb, vb)):
            r = netns.run(ns, ["rdma", "link", "add", dev, "type", "rxe", "netdev", nd], timeout=20)
            if r.returncode != 0:
                raise RuntimeError(f"rdma link add failed: {r.stderr.strip() or r.stdout.strip()}")
        time.sleep(0.5)
        server = netns.popen(nb, ["ibv_rc_pingpong", "-d", rb, "-g", "1", "-n", "20", "-s", "4096"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        # The server may not listen yet on a loaded machine: retry the client's connection for a while.
        deadline = time.monotonic() + 20
        while True:
            time.sleep(0.5)
            client = netns.run(na, ["ibv_rc_pingpong", "-d", ra, "-g", "1", "-n", "20", "-s", "4096",
                                    "198.18.255.2"], timeout=30)
            if client.returncode == 0 or server.poll() is not None or time.monotonic() > deadline:
                break
        try:
            out, _ = server.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            out, _ = server.communicate()
        if client.returncode != 0 or server.returncode != 0 or "iters in" not in client.stdout:
            msg = (client.stderr or client.stdout or out).strip().splitlines()
            raise RuntimeError("RC transfer did not complete: " + (msg[-1] if msg else "no output"))
        line = [ln for ln in client.stdout.splitlines() if "iters in" in ln]
        return "RC ping-pong between namespaces: " + line[0].strip()
    finally:
        for ns, dev in ((na, ra), (nb, rb)):
            netns.run(ns, ["rdma", "link", "delete", dev], timeout=20)


PROBES: list[Probe] = [
    Probe("qdisc:htb", "link shaping (every port)", VM_HINT, _qdisc("htb", default=0x10)),
    Probe("qdisc:tbf", "TBF shaping", VM_HINT, _qdisc("tbf", rate="10mbit", burst=15000, latency=50)),
    Probe("qdisc:bfifo", "drop-tail queues in bytes", VM_HINT, _qdisc("bfifo", limit=100000)),
    Probe("qdisc:pfifo", "drop-tail queues in packets", VM_HINT, _qdisc("pfifo", limit=100)),
    Probe("qdisc:red+ecn", "RED/ECN queues and DCTCP step marking", VM_HINT, _red_ecn),
    Probe("qdisc:netem", "link delay, jitter and loss", VM_HINT, _qdisc("netem", delay=1000)),
    Probe("qdisc:prio", "strict-priority classes", VM_HINT, _qdisc("prio", bands=3)),
    Probe("qdisc:ets", "ETS weighted classes", VM_HINT, _qdisc("ets", bands=2, strict=2)),
    Probe("qdisc:plug", "PFC pause emulation", VM_HINT, _qdisc("plug", limit=10000)),
    Probe("qdisc:clsact", "per-packet spraying hooks", VM_HINT, _qdisc("clsact")),
    Probe("qdisc:fq", "DCQCN's pacing (departure times)", VM_HINT, _qdisc("fq")),
    Probe("cls:u32", "DSCP classification", VM_HINT,
          _filter("u32", keys=["0x0/0x0+0"], target="1:10")),
    Probe("cls:flower", "flow classification", VM_HINT, _filter("flower", classid=0x10010)),
    Probe("cls:basic+meta", "per-packet spraying (random match)", VM_HINT,
          _filter("basic", classid=0x10010, match=[{"kind": "meta", "object": {"kind": "random", "opnd": "lt"},
                                                   "value": 1 << 31, "mask": 0xFFFFFFFF}])),
    Probe("bpf:flowlet", "flowlet and adaptive load balancing", "install clang and libbpf-dev "
          "(scripts/install.sh); needs a kernel with BPF syscall and cls_bpf", _flowlet_bpf),
    Probe("act:skbedit", "priority marking", VM_HINT, _action("skbedit", priority=0x10001)),
    Probe("act:mirred", "per-packet spraying", VM_HINT, _action("mirred")),
    Probe("tcp:cubic", "CUBIC senders", VM_HINT, _tcp_cc("cubic")),
    Probe("tcp:reno", "Reno senders", VM_HINT, _tcp_cc("reno")),
    Probe("tcp:dctcp", "DCTCP senders", VM_HINT, _tcp_cc("dctcp")),
    Probe("tcp:bbr", "BBR senders", VM_HINT, _tcp_cc("bbr")),
    Probe("sysctl:ecn", "ECN-capable TCP", VM_HINT, _ecn_sysctl),
    Probe("sysctl:multipath-hash", "ECMP 5-tuple hashing", VM_HINT, _multipath),
    Probe("cgroup:cpu", "straggler hosts (CPU limits)", "mount a cgroup hierarchy with the cpu controller, or use the "
          "lab VM", _cgroup_cpu),
    Probe("ovs", "Open vSwitch switches", "install openvswitch-switch (scripts/install.sh) and use the lab VM",
          _ovs),
    Probe("mininet", "Mininet topologies", "install Debian's mininet (scripts/install.sh); use .venv's python",
          _mininet),
    Probe("rxe:netns", "RDMA (SoftRoCE) transport", "needs a kernel whose rxe works across namespaces "
          "(Debian 7.x): testbed vm -- <command>", _rxe_across_namespaces),
    Probe("pyverbs", "RDMA agents", "install Debian's python3-pyverbs; use .venv's python (system site packages)",
          _pyverbs),
]
