"""The fabric builder: a topology spec (topologies/) turned into kernel objects, all through netlink in-process.

    fabric = Fabric(topology, run_id)
    fabric.build(lab.state, lab.on_teardown)     # namespaces, veths, addresses, routes, sysctls, qdiscs
    fabric.ns("leaf1"), fabric.ports(), fabric.describe()
    fabric.teardown()                            # (also registered with on_teardown)

What gets built, per node of the topology:

* one named namespace ``tb-<run_id>-<node>`` (the spec's own ``<prefix>-<node>`` names would collide between
  concurrent runs, so the builder adds the run id; every name starts with ``tb-`` so ``testbed clean`` finds it);
  IPv6 is disabled in it (no DAD/MLD/RS chatter in the queue counters) and ``rp_filter`` is 0 (ECMP paths are
  asymmetric by design) (testbed.kernel.sysctls, as the per-role sysctls below);
* one veth pair per link, created directly inside the two namespaces with the planned names, MACs and MTU;
  segmentation and receive offloads (TSO/GSO/GRO...) off on every fabric interface, so queues hold wire-sized
  packets;
* the planned addresses and static routes (ECMP routes as kernel multipath routes; host default routes ``onlink``
  with the per-route ``rto_min`` of ``HostTcpSpec.rto_min_ms``);
* routers: ``ip_forward=1`` and ``fib_multipath_hash_policy=1`` (plus ``fib_multipath_hash_seed`` from the spec's
  seed where the kernel has it); hosts: congestion control, ECN and buffer sysctls from ``HostTcpSpec``;
* every egress port: HTB at the link rate with the port's queue(s) below (testbed.kernel.qdisc.install_port): classes by
  strict priority, then weighted round robin;
  with classes, one HTB class per traffic class and u32 filters on the DSCP bits of the IPv4 TOS byte;
* link delay / jitter / loss: NOT under the shaper (netem under HTB would count packets in flight as queue): the
  egress direction a->b gets a netem on an IFB device in b's namespace, fed from b's ingress by a mirred redirect.
  So a packet is shaped and queued at a's egress, then delayed/lost "on the wire" before b receives it.
  (testbed.network.impairment; the manifest's description of all this: testbed.network.description)
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
from typing import Any, Callable

from testbed.errors import UsageError
from testbed.network import description, impairment
from testbed.network.cluster import build_servers, build_share_tunnels, build_tunnels, place
from testbed.kernel import PREFIX, batch, linkfail, links, netns, qdisc, spray, sysctls
from testbed.network.loadbalance import FlowletBalancing
from testbed.network.portplan import PortPlan, plan_port
from topologies.flowlet import DEFAULT_GAP_MS, DEFAULT_POLL_MS, FLOWLET_MODES, flowlet_plans
from topologies.spray import shared_macs, spray_groups

#: Longest namespace name we create (the kernel's limit is NAME_MAX of the /run/netns bind mount, 255; keep it
#: readable in `ip netns` listings and well inside any tool's limits).
MAX_NS_NAME = 48
_RUN_ID_RE = re.compile(r"^[a-z0-9]{1,12}$")
NUD_PERMANENT = 0x80  # a neighbour entry that never expires and is never probed (include/uapi/linux/neighbour.h)
ETH_P_IP = 0x0800
SHAPER_SLACK_MS = qdisc.SHAPER_SLACK_MS


class Fabric:
    """Namespaces, links, routes and queues of one topology for one run (see the module docstring)."""

    def __init__(self, topology, run_id: str, rxe: bool = False, servers: int = 1, share=None):
        """``share``: build only one server's share of a fabric placed over machines (testbed.network.share.Share:
        its nodes, the links among them, its ends of the crossing links as VXLAN over its NIC)."""
        if not _RUN_ID_RE.match(str(run_id)):
            raise UsageError(f"run id must be 1..12 characters [a-z0-9] (got {run_id!r})")
        self.topology = topology
        self.run_id = str(run_id)
        self.share = share
        # split over servers (testbed.network.cluster): their namespaces, and the links that become tunnels
        self.placement = share.placement if share is not None else place(topology, servers)
        local = set(self.placement.nodes_on(share.server)) if share is not None else None
        self._ns = {n.name: f"{PREFIX}-{self.run_id}-{n.name}" for n in topology.nodes
                    if local is None or n.name in local}
        for name in self._ns.values():
            if len(name) > MAX_NS_NAME:
                raise UsageError(f"namespace name {name!r} is longer than {MAX_NS_NAME} characters")
        self.role = {n.name: n.role for n in topology.nodes}
        self.server_ns = ({s: f"{PREFIX}-{self.run_id}-{s}" for s in self.placement.servers}
                          if servers > 1 else {})
        self.dcnet_ns = f"{PREFIX}-{self.run_id}-dcnet" if servers > 1 else ""
        # everything that can be wrong is checked here, before anything is created
        self.port_plans: list[PortPlan] = [plan_port(ep) for ep in topology.egress_ports() if ep.node in self._ns]
        self.impaired = [(l, side) for l in topology.links for side in ("a", "b")
                         if (l.spec.delay_ms > 0 or l.spec.loss_percent > 0) and (l.b if side == "a" else l.a)
                         in self._ns]
        self.created: list[str] = []
        self.ifb: dict[tuple[str, str], str] = {}  # (receiving node, port) -> ifb device holding the netem
        self.offloads: dict[str, dict[str, bool]] = {}
        self.cc_default_failed: list[str] = []  # hosts where the namespace default cc could not be set
        self.pfc = None  # the run's PFC controller (testbed.pfc.run.start_pfc), for pause-storm faults
        # the run's packet trimming (testbed.workloads.trimming.TrimRun), told by the fault timeline when a port's
        # rate changes, and the ports whose rate a fault changed, at their rate now (a TrimRun started later uses it)
        self.trim = None
        self.port_rate_now_mbps: dict[tuple[str, str], float] = {}
        lb = getattr(topology, "load_balancing", "ecmp")
        if share is not None and lb != "ecmp":
            raise UsageError(f"load_balancing={lb} is not built over servers yet (ECMP only)")
        groups = spray_groups(topology) if lb in ("spray", *FLOWLET_MODES) else ()
        self.spray = groups if lb == "spray" else ()
        self.macs = shared_macs(topology, groups)  # far ends of a spray or flowlet group share one MAC
        self.balancing = (FlowletBalancing(flowlet_plans(topology, groups), adaptive=lb == "adaptive",
                                           gap_ms=getattr(topology, "flowlet_gap_ms", DEFAULT_GAP_MS),
                                           poll_ms=getattr(topology, "adaptive_poll_ms", DEFAULT_POLL_MS),
                                           rate_mbps={(p.node, p.ifname): p.rate_mbps for p in self.port_plans})
                          if lb in FLOWLET_MODES else None)
        self.want_rxe = rxe
        self.rxe: dict[str, tuple[str, str]] = {}  # host -> (rxe device, netdev): SoftRoCE on the host's NIC
        self.built = False

    # ---- names ----

    def ns(self, node: str) -> str:
        return self._ns[node]

    @property
    def namespaces(self) -> dict[str, str]:
        return dict(self._ns)

    def ports(self) -> list[tuple[str, str, str]]:
        """(node, namespace, ifname) of every shaped egress port, in link order."""
        return [(p.node, self._ns[p.node], p.ifname) for p in self.port_plans]

    def port_plan(self, node: str, ifname: str) -> PortPlan:
        for p in self.port_plans:
            if p.node == node and p.ifname == ifname:
                return p
        raise KeyError(f"no egress port {node}:{ifname}")

    def host_ip(self, host: str) -> str:
        return self.topology.host_ip(host)

    # ---- build ----

    def build(self, state, on_teardown: Callable[[Callable[[], None]], None] | None = None,
              progress: Callable[[str], None] | None = None) -> "Fabric":
        """Create everything; namespaces are recorded in ``state`` as they are made (so `testbed clean` finds a
        half-built fabric) and one teardown step is registered with ``on_teardown`` before the first one."""
        say = progress or (lambda m: None)
        if on_teardown is not None:
            on_teardown(self.teardown)
        topo = self.topology
        say(f"fabric: {len(self._ns)} namespaces, {len(topo.links)} links, {len(self.port_plans)} shaped ports")
        for name in self._ns.values():
            if state is not None:
                state.add("namespaces", name)
            netns.create(name, inside=sysctls.set_before_interfaces)
            self.created.append(name)
        if self.server_ns:
            build_servers(self, state)
        iprs: dict[str, Any] = {}
        nls: dict[str, socket.socket] = {}
        socks: dict[str, socket.socket] = {}
        try:
            for n, ns in self._ns.items():
                iprs[n], nls[n], socks[n] = netns.sockets_in(ns, batch.open_socket)
            ifindex = self._links(iprs, nls, socks)
            # addresses, routes and queues: one batch of requests per namespace, in that order
            batches = {n: batch.Batch(ipr, nls[n]) for n, ipr in iprs.items()}
            self._addresses(batches, ifindex)
            self._routes(batches, ifindex)
            self._neighbours(batches, ifindex)
            self._queues(batches, ifindex)
            for b in batches.values():
                b.commit()
            self.cc_default_failed += sysctls.set_node_sysctls(topo, self._ns)
            for g in self.spray:
                spray.install_group(iprs[g.node], g, ifindex[g.node])
            if self.balancing is not None:
                self.balancing.install(iprs, ifindex)
                self.balancing.start(self._ns, ifindex)
            self._impairments(iprs)
        finally:
            for i in (*iprs.values(), *nls.values(), *socks.values()):
                with contextlib.suppress(Exception):
                    i.close()
        if self.want_rxe:
            self._rxe(state)
        self.built = True
        return self

    def _links(self, iprs, nls, socks) -> dict[str, dict[str, int]]:
        """veth pairs (one netlink batch per namespace of the a ends), then both ends up, offloads off and their
        indexes read (ioctls on a socket in each end's namespace). Returns node -> {ifname: ifindex}: kept, so no
        request looks an interface up by name again (each lookup is a dump through pyroute2)."""
        addrs = self.topology.addresses
        batches = {n: batch.Batch(ipr, nls[n]) for n, ipr in iprs.items()}
        fds: dict[str, int] = {}
        crossing = set(self.placement.crossing)
        try:
            for i, l in enumerate(self.topology.links):
                if i in crossing or l.a not in self._ns:
                    continue
                if l.b not in fds:
                    fds[l.b] = os.open(netns.NETNS_DIR / self._ns[l.b], os.O_RDONLY)
                mtu = l.spec.mtu
                mac_a = self.macs.get((l.a, l.a_port), addrs[(l.a, l.a_port)].mac)
                mac_b = self.macs.get((l.b, l.b_port), addrs[(l.b, l.b_port)].mac)
                batches[l.a].link("add", ifname=l.a_port, kind="veth", address=mac_a, mtu=mtu,
                                  peer={"ifname": l.b_port, "net_ns_fd": fds[l.b], "address": mac_b, "mtu": mtu})
            for b in batches.values():
                b.commit()
        finally:
            for fd in fds.values():
                os.close(fd)
        build_share_tunnels(self) if self.share is not None else build_tunnels(self)
        ifindex: dict[str, dict[str, int]] = {n: {} for n in iprs}
        for l in self.topology.links:
            for ifn, node in ((l.a_port, l.a), (l.b_port, l.b)):
                if node not in self._ns:
                    continue
                netns.set_up(socks[node], ifn)
                self.offloads[f"{node}:{ifn}"] = links.offloads_off_sock(socks[node], ifn)
                ifindex[node][ifn] = netns.ifindex(socks[node], ifn)
        return ifindex

    def _addresses(self, iprs, ifindex) -> None:
        """`iprs`: per node, an IPRoute or a testbed.kernel.batch.Batch (the same call syntax)."""
        for (node, ifname), itf in self.topology.addresses.items():
            if node not in self._ns:
                continue
            iprs[node].addr("add", index=ifindex[node][ifname], address=itf.ip, prefixlen=itf.prefixlen)

    def _routes(self, iprs, ifindex) -> None:
        for r in self.topology.routes:
            if r.node not in self._ns:
                continue
            iprs[r.node].route("add", **linkfail.route_request(r, ifindex[r.node]))

    def _neighbours(self, iprs, ifindex) -> None:
        """Every link end knows the other end's MAC from the start: a permanent neighbour entry, no ARP.

        What it stands for: a switch resolves its neighbours in the control plane (the CPU, its own queue), never
        in the data queues under study. Emulated, ARP went through the same shaped port queue as the data: a
        refresh probe a router sent while a RED/step queue stood above K was dropped as not ECN-capable (one drop in
        a DCTCP run that must have none), and a sprayed request could land on the wrong spine and go unanswered."""
        addrs = self.topology.addresses
        for l in self.topology.links:
            for (node, port), (peer, peer_port) in (((l.a, l.a_port), (l.b, l.b_port)),
                                                    ((l.b, l.b_port), (l.a, l.a_port))):
                far = addrs.get((peer, peer_port))
                if far is None or (node, port) not in addrs or node not in self._ns:
                    continue
                iprs[node].neigh("add", dst=far.ip, lladdr=self.macs.get((peer, peer_port), far.mac),
                                 ifindex=ifindex[node][port], state=NUD_PERMANENT)

    @staticmethod
    def port_classes(p: PortPlan) -> list[qdisc.PortClass]:
        return [qdisc.PortClass(minor, q, prio=prio, weight=weight) for minor, _, q, prio, weight, _ in p.classes]

    def _queues(self, iprs, ifindex) -> None:
        for p in self.port_plans:
            ipr = iprs[p.node]
            idx = ifindex[p.node][p.ifname]
            qdisc.install_port(ipr, idx, p.rate_mbps, self.port_classes(p), p.default_minor, mtu=p.mtu, fresh=True)
            if any(dscps for *_, dscps in p.classes):
                self._dscp_filters(ipr, idx, p)

    def _dscp_filters(self, ipr, idx: int, p: PortPlan) -> None:
        """u32 on the IPv4 TOS byte (bits 2..7 = DSCP): the first 32-bit word of the IP header, mask 0x00fc0000."""
        for minor, _, _, _, _, dscps in p.classes:
            for d in sorted(dscps):
                ipr.tc("add-filter", "u32", index=idx, parent="1:", prio=1, protocol=ETH_P_IP,
                       keys=[f"0x{d << 18:08x}/0x00fc0000+0"], target=f"1:{minor:x}")

    def _impairments(self, iprs) -> None:
        impairment.build_link_impairments(self, iprs)

    def rxe_name(self, host: str) -> str:
        return f"{PREFIX}-{self.run_id}-{host}-rxe"

    def _rxe(self, state) -> None:
        """One rxe (SoftRoCE) device per host on its fabric interface, created inside the host's namespace (its
        MTU follows the interface's). Recorded in ``state`` before creation so `testbed clean` finds it."""
        for (node, ifname) in self.topology.addresses:
            if self.role.get(node) != "host" or node in self.rxe or node not in self._ns:
                continue
            dev = self.rxe_name(node)
            if state is not None:
                state.add("rxe", dev)
            r = netns.run(self._ns[node], ["rdma", "link", "add", dev, "type", "rxe", "netdev", ifname], timeout=30)
            if r.returncode != 0:
                raise RuntimeError(f"rdma link add {dev} on {node}:{ifname}: "
                                   f"{(r.stderr or r.stdout).strip() or r.returncode}")
            self.rxe[node] = (dev, ifname)

    def add_loss(self, node: str, ifname: str, loss_percent: float) -> str:
        """Random loss on packets *arriving* at node:ifname (netem on an IFB fed from the port's ingress, the same
        construction as link impairments; the port's egress HTB is untouched). Returns the IFB's name."""
        return self.set_rx_netem(node, ifname, loss_percent=loss_percent)

    def set_rx_netem(self, node: str, ifname: str, ipr=None, **netem: float) -> str:
        """Loss, delay, jitter, corruption or bursty loss of packets arriving at node:ifname (testbed.network.
        impairment.set_rx_netem has the parameters). Returns the IFB's name."""
        return impairment.set_rx_netem(self, node, ifname, ipr=ipr, **netem)

    def link_netem(self, node: str, ifname: str) -> dict[str, float]:
        return impairment.link_netem(self.topology, node, ifname)

    # ---- teardown ----

    def teardown(self) -> None:
        """Remove every namespace this fabric created (their veths, IFBs and qdiscs die with them)."""
        if self.balancing is not None:
            self.balancing.close()
        for host, (dev, _) in list(self.rxe.items()):
            with contextlib.suppress(Exception):
                netns.run(self._ns[host], ["rdma", "link", "delete", dev], timeout=30)
            del self.rxe[host]
        for name in reversed(self.created):
            netns.remove(name)
        self.created.clear()
        self.built = False

    # ---- description ----

    def describe(self) -> dict[str, Any]:
        """For manifest.json: the spec's own description plus what the builder did with it."""
        return description.describe(self, sysctls.rps_mask())


def tcp_connect_ok(fabric: Fabric, src: str, dst: str, port: int = 5201, timeout: float = 5.0) -> bool:
    """A TCP handshake from host src to host dst (both in the fabric): the reachability check tests use."""
    dip = fabric.host_ip(dst)
    with netns.entered(fabric.ns(dst)):
        ls = socket.socket()
    try:
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind((dip, port))
        ls.listen(4)
        with netns.entered(fabric.ns(src)):
            cs = socket.socket()
        try:
            cs.settimeout(timeout)
            cs.connect((dip, port))
            conn, _ = ls.accept()
            conn.close()
            return True
        except OSError:
            return False
        finally:
            cs.close()
    finally:
        ls.close()
