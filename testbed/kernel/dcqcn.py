"""DCQCN beside SoftRoCE on one host (the design: docs/dcqcn.md; the programs: dcqcn.bpf.c beside this file; the
oracle: traffic/dcqcn.py). What it stands for: the congestion control a RoCEv2 NIC runs in firmware, its
notification point (CE-marked packet in, CNP out) and its reaction point (CNP in, the QP's rate cut and recovered,
the QP's packets paced), here on the host's own interface, the one rxe sends through.

On that interface: clsact with ``dcqcn_ingress`` and ``dcqcn_egress`` (cls_bpf, direct action), and the ``fq``
qdisc, which releases each packet at the departure time the egress program wrote into skb->tstamp (Earliest
Departure Time). Under the port's HTB shaper fq replaces every (drop-tail) leaf queue, put back on close; on an
unshaped interface it is the root.
fq's ``flow_limit`` (packets per flow) is raised above what rxe keeps in flight per QP, so a slowed QP waits in fq
instead of being dropped there. The maps stay open in this process: :meth:`Dcqcn.sync` writes the QP map from the
hosts' RDMA netlink tables (testbed.kernel.rdma_qps), :meth:`Dcqcn.stats` and :meth:`Dcqcn.rates` read them."""

from __future__ import annotations

import contextlib
import ctypes
import socket
import struct
import types
from dataclasses import dataclass
from pathlib import Path

from pyroute2.netlink import nla
from pyroute2.netlink.rtnl import TC_H_ROOT
from pyroute2.netlink.rtnl.tcmsg import plugins

from . import netns
from .ebpf import BpfObject, compile_object, lib
from .spray import CLSACT_EGRESS, ETH_P_ALL

SOURCE = Path(__file__).with_name("dcqcn.bpf.c")
CLSACT_INGRESS = 0xFFFFFFF2  # TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_INGRESS)
#: the programs' stats map, in index order
STATS = ("ce_seen", "cnp_sent", "cnp_suppressed", "cnp_received", "cnp_ignored", "rate_cuts", "paced_packets",
         "unknown_qp", "cnp_failed")
#: fq's per-flow packet limit: above rxe's in-flight limit per QP (its max_dest_rd_atomic/outstanding WQEs stay
#: well under 1000 packets), so fq holds a paced QP's packets instead of dropping them
FQ_FLOW_LIMIT = 1000
FQ_LIMIT = 10000
#: DSCP of the CNPs the notification point sends (np_cnp_dscp): 48 (CS6), apart from the data's, so a port with
#: classes can give CNPs their own; on a classless port any value is forwarded alike
CNP_DSCP = 48
BPF_F_LOCK = 4
#: alpha = 1 in the programs' Q20 fixed point (traffic.dcqcn.ALPHA_ONE; the kernel room imports no traffic module)
ALPHA_ONE = 1 << 20


class Config(ctypes.Structure):
    """struct dcqcn_config (pinned against the object's BTF by tests/unit/test_dcqcn_loader.py)."""

    _fields_ = [("line_rate_kbps", ctypes.c_uint32), ("min_rate_kbps", ctypes.c_uint32),
                ("ai_rate_kbps", ctypes.c_uint32), ("hai_rate_kbps", ctypes.c_uint32), ("g", ctypes.c_uint32),
                ("threshold", ctypes.c_uint32), ("alpha_timer_ns", ctypes.c_uint64),
                ("increase_timer_ns", ctypes.c_uint64), ("byte_reset", ctypes.c_uint64),
                ("cnp_interval_ns", ctypes.c_uint64), ("cut_interval_ns", ctypes.c_uint64),
                ("cnp_dscp", ctypes.c_uint32), ("ifindex", ctypes.c_uint32)]


class QpPeer(ctypes.Structure):
    """struct qp_peer: the value of the QP map (local QPN -> remote QPN, peer IPv4 in network order)."""

    _fields_ = [("rqpn", ctypes.c_uint32), ("peer_ip", ctypes.c_uint32)]


class RpKey(ctypes.Structure):
    """struct rp_key: a reaction point's QP as its packets name it (peer IPv4, the peer's QPN)."""

    _fields_ = [("peer_ip", ctypes.c_uint32), ("rqpn", ctypes.c_uint32)]


class RpState(ctypes.Structure):
    """struct rp_state: one QP's rate state (its first 4 bytes are the kernel's bpf_spin_lock)."""

    _fields_ = [("lock", ctypes.c_uint32), ("started", ctypes.c_uint32), ("rc_kbps", ctypes.c_uint32),
                ("rt_kbps", ctypes.c_uint32), ("alpha", ctypes.c_uint32), ("t_count", ctypes.c_uint32),
                ("bc_count", ctypes.c_uint32), ("has_cut", ctypes.c_uint32), ("now_ns", ctypes.c_uint64),
                ("alpha_t0_ns", ctypes.c_uint64), ("inc_t0_ns", ctypes.c_uint64), ("last_cut_ns", ctypes.c_uint64),
                ("next_tx_ns", ctypes.c_uint64), ("bytes_since", ctypes.c_uint64), ("cnp_received", ctypes.c_uint64),
                ("cnp_ignored", ctypes.c_uint64), ("rate_cuts", ctypes.c_uint64),
                ("dropped_events", ctypes.c_uint64)]


def config(p, ifindex: int, cnp_dscp: int = CNP_DSCP) -> Config:
    """The programs' configuration from `p`, a traffic.dcqcn.Params (duck-typed: the kernel room imports no traffic
    module; the callers above it pass the model's parameters)."""
    return Config(p.line_rate_kbps, p.min_rate_kbps, p.ai_rate_kbps, p.hai_rate_kbps, p.g, p.threshold,
                  p.alpha_timer_ns, p.increase_timer_ns, p.byte_reset, p.cnp_interval_ns, p.cut_interval_ns,
                  cnp_dscp, ifindex)



def ip_key(ip: str) -> int:
    """An IPv4 address as the programs see ip->saddr: network byte order in memory."""
    return ctypes.c_uint32.from_buffer_copy(socket.inet_aton(ip)).value


def ip_text(key: int) -> str:
    return socket.inet_ntoa(bytes(ctypes.c_uint32(key)))


class _fq:
    """sch_fq (include/uapi/linux/pkt_sched.h TCA_FQ_*), as much as DCQCN needs: the packet limits."""

    parent = TC_H_ROOT

    @staticmethod
    def get_parameters(kw):
        return {"attrs": [["TCA_FQ_PLIMIT", int(kw.get("limit", FQ_LIMIT))],
                          ["TCA_FQ_FLOW_PLIMIT", int(kw.get("flow_limit", FQ_FLOW_LIMIT))]]}

    class options(nla):
        nla_map = (("TCA_FQ_UNSPEC", "none"), ("TCA_FQ_PLIMIT", "uint32"), ("TCA_FQ_FLOW_PLIMIT", "uint32"))


plugins.setdefault("fq", types.SimpleNamespace(parent=_fq.parent, get_parameters=_fq.get_parameters,
                                             options=_fq.options))


@dataclass(frozen=True)
class RateSample:
    """One QP's rate state as read (under its lock): what the rate-over-time CSV records."""

    peer_ip: str
    rqpn: int
    rc_kbps: int
    rt_kbps: int
    alpha: float
    rate_cuts: int
    cnp_received: int
    cnp_ignored: int
    dropped_events: int


@dataclass(frozen=True)
class Leaf:
    """A leaf queue fq replaced, as it was: put back when DCQCN goes (the fabric's own drop-tail queue)."""

    parent: int
    handle: int
    kind: str  # bfifo (limit in bytes) or pfifo (packets)
    limit: int


#: the leaf kinds fq may replace and :meth:`Dcqcn.close` puts back: a host NIC's drop-tail queue
RESTORABLE = ("bfifo", "pfifo")


def _leaves(ipr, idx: int) -> list[Leaf]:
    """The leaf queues under the port's HTB (parent 1:x). A ValueError for a kind fq could not be undone from."""
    out = []
    for m in ipr.get_qdiscs(index=idx):
        if m["parent"] == 0xFFFFFFFF or (m["parent"] >> 16) != 1:
            continue
        kind = m.get_attr("TCA_KIND")
        if kind not in RESTORABLE:
            raise ValueError(f"DCQCN paces with fq in place of the host NIC's drop-tail leaf queues; the leaf under "
                             f"{m['parent'] >> 16:x}:{m['parent'] & 0xFFFF:x} is {kind} (a PFC plug?), which it "
                             f"could not put back")
        opts = m.get_attr("TCA_OPTIONS")
        out.append(Leaf(m["parent"], m["handle"], kind, int(opts["limit"]) if opts is not None else 0))
    return out


def _fq_leaves(ipr, idx: int) -> list[Leaf]:
    """fq under every class of the port's HTB (in place of the leaf queues, returned to be put back), or as the
    root where there is no HTB (returned empty: the root goes back to the kernel's default). If one leaf cannot be
    replaced, the ones before it are put back before the error propagates."""
    leaves = _leaves(ipr, idx)
    if not leaves:
        ipr.tc("replace", "fq", index=idx, handle="1:", root=True, limit=FQ_LIMIT, flow_limit=FQ_FLOW_LIMIT)
        return []
    for n, leaf in enumerate(leaves):  # a new handle: the kernel refuses to change a qdisc's kind under its handle
        try:
            ipr.tc("replace", "fq", index=idx, parent=leaf.parent, limit=FQ_LIMIT, flow_limit=FQ_FLOW_LIMIT)
        except BaseException:  # the leaves already replaced come back: the caller has no list to restore from
            with contextlib.suppress(Exception):
                _restore_leaves(ipr, idx, leaves[:n])
            raise
    return leaves


def _restore_leaves(ipr, idx: int, leaves: list[Leaf]) -> None:
    """The fabric's leaf queues back in fq's place (their handles are free again: fq took new ones); without an
    HTB (fq was the root) the root qdisc is deleted."""
    if not leaves:
        ipr.tc("del", index=idx, root=True)
        return
    for leaf in leaves:
        ipr.tc("replace", leaf.kind, index=idx, parent=leaf.parent, handle=leaf.handle, limit=leaf.limit)


#: fq's own counters recorded into dcqcn.csv (fq_<name>): offsets in struct tc_fq_qd_stats (TCA_STATS_APP), which
#: starts gc_flows, highprio_packets, tcp_retrans, throttled, flows_plimit (__u64 each)
FQ_XSTATS = (("throttled", 24), ("flows_plimit", 32))


def _fq_xstats(app) -> dict[str, int]:
    """fq's counters from TCA_STATS_APP as pyroute2 gives it (hex text "aa:bb:..."; with the attribute's 4-byte
    header when its length says so: the struct is a multiple of 8 bytes). Zeros when it is absent or short."""
    raw = bytes.fromhex(app.replace(":", "")) if isinstance(app, str) else bytes(app or b"")
    raw = raw[4:] if len(raw) % 8 == 4 else raw
    return {f"fq_{name}": (struct.unpack_from("=Q", raw, off)[0] if len(raw) >= off + 8 else 0)
            for name, off in FQ_XSTATS}


def _fq_counters(ipr, idx: int) -> dict[str, int]:
    """fq's drops (TCA_STATS_QUEUE), throttled packets and flow-limit hits, summed over the interface's fq qdiscs."""
    out = {"fq_drops": 0, **{f"fq_{name}": 0 for name, _ in FQ_XSTATS}}
    for m in ipr.get_qdiscs(index=idx):
        s2 = m.get_attr("TCA_STATS2") if m.get_attr("TCA_KIND") == "fq" else None
        if s2 is None:
            continue
        q = s2.get_attr("TCA_STATS_QUEUE")
        out["fq_drops"] += int(q["drops"]) if q else 0
        for k, v in _fq_xstats(s2.get_attr("TCA_STATS_APP")).items():
            out[k] += v
    return out


def _delete(obj: BpfObject, map_name: str, key) -> bool:
    L = lib()
    fn = L.bpf_map_delete_elem
    fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_int, ctypes.c_void_p]
    return fn(obj.map_fd(map_name), ctypes.byref(key)) == 0


class Dcqcn:
    """The programs loaded for one host and attached to its interface."""

    def __init__(self, ns: str, ifname: str, ifindex: int, params, obj: BpfObject, leaves: list[Leaf] | None = None):
        self.ns, self.ifname, self.ifindex, self.params, self.obj = ns, ifname, ifindex, params, obj
        self.leaves = leaves  # the queues fq replaced, put back by close() (None: fq was not installed)
        self.qps: dict[int, tuple[int, str]] = {}
        self.fq: dict[str, int] = {}  # fq's counters as last read (close() reads them before fq goes)
        self.closed = False

    def add_qp(self, lqpn: int, rqpn: int, peer_ip: str) -> bool:
        """Map local QP `lqpn` to `rqpn` at `peer_ip` and give it a rate state at the line rate (kept if it has
        one). True when the QP was new."""
        if self.qps.get(lqpn) == (rqpn, peer_ip):
            return False
        self.obj.update("qpmap", ctypes.c_uint32(lqpn), QpPeer(rqpn, ip_key(peer_ip)))
        key = RpKey(ip_key(peer_ip), rqpn)
        if not self.obj.lookup("rp", key, RpState()):
            line = self.params.line_rate_kbps
            self.obj.update("rp", key, RpState(rc_kbps=line, rt_kbps=line,
                                               alpha=self.params.initial_alpha * ALPHA_ONE // 1024))
        self.qps[lqpn] = (rqpn, peer_ip)
        return True

    def drop_qp(self, lqpn: int) -> None:
        """Forget local QP `lqpn` (destroyed): its map entry and its rate state go, so a later QP that reuses the
        numbers starts at the line rate, as a NIC's new QP context does."""
        rqpn, peer_ip = self.qps.pop(lqpn)
        _delete(self.obj, "qpmap", ctypes.c_uint32(lqpn))
        _delete(self.obj, "rp", RpKey(ip_key(peer_ip), rqpn))

    def sync(self, pairs: list[tuple[int, int, str]], live: set[int] | None = None) -> int:
        """The QP map from testbed.kernel.rdma_qps.pair_qps's entries for this host; how many QPs were new.
        `live`: the local QPNs the device still lists; mapped QPs not among them are dropped."""
        if live is not None:
            for lqpn in [q for q in self.qps if q not in live]:
                self.drop_qp(lqpn)
        return sum(self.add_qp(lqpn, rqpn, peer) for lqpn, rqpn, peer in pairs)

    def stats(self) -> dict[str, int]:
        out = {}
        for i, name in enumerate(STATS):
            v = ctypes.c_uint64()
            out[name] = int(v.value) if self.obj.lookup("stats", ctypes.c_uint32(i), v) else 0
        return out

    def fq_stats(self) -> dict[str, int]:
        """fq's counters on the interface (_fq_counters), read now while fq is there, or after close() as read just
        before the leaf queues came back (fresh ones, with zero counters). Empty without fq (pace=False)."""
        if self.leaves is None:
            return {}
        if not self.closed:
            with contextlib.suppress(Exception), netns.ipr_in(self.ns) as ipr:
                self.fq = _fq_counters(ipr, self.ifindex)
        return dict(self.fq)

    def rates(self) -> list[RateSample]:
        """Every QP's rate state, each read under its spin lock (BPF_F_LOCK: never a half-updated state)."""
        L = lib()
        nxt, lookup = L.bpf_map_get_next_key, L.bpf_map_lookup_elem_flags
        nxt.restype, nxt.argtypes = ctypes.c_int, [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        lookup.restype = ctypes.c_int
        lookup.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64]
        fd = self.obj.map_fd("rp")
        out, key, prev = [], RpKey(), None
        while nxt(fd, ctypes.byref(prev) if prev is not None else None, ctypes.byref(key)) == 0:
            s = RpState()
            if lookup(fd, ctypes.byref(key), ctypes.byref(s), BPF_F_LOCK) == 0:
                out.append(RateSample(ip_text(key.peer_ip), key.rqpn, s.rc_kbps, s.rt_kbps, s.alpha / ALPHA_ONE,
                                      s.rate_cuts, s.cnp_received, s.cnp_ignored, s.dropped_events))
            prev = RpKey(key.peer_ip, key.rqpn)
        return out

    def close(self) -> None:
        """Detach (the clsact qdisc and its filters go), put the leaf queues fq replaced back, unload. Idempotent;
        every step is tried whatever the one before did (a namespace already gone takes its qdiscs with it)."""
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(Exception), netns.ipr_in(self.ns) as ipr:
            with contextlib.suppress(Exception):
                ipr.tc("del", "clsact", index=self.ifindex)
            if self.leaves is not None:
                with contextlib.suppress(Exception):
                    self.fq = _fq_counters(ipr, self.ifindex)  # fq's drops and throttling, before it goes
                _restore_leaves(ipr, self.ifindex, self.leaves)
        self.obj.close()


def install(ns: str, ifname: str, params, cnp_dscp: int = CNP_DSCP, pace: bool = True) -> Dcqcn:
    """Load the programs for the host in namespace `ns` and attach them, with fq, to its interface `ifname`.
    ``pace=False``: no fq (the departure times are then ignored): the programs mark, answer CE with CNPs and count,
    and the interface's leaf queues stay as they are (e.g. PFC's plug in a lossless class)."""
    obj = BpfObject(compile_object(SOURCE))
    attached, leaves = None, None
    try:
        with netns.ipr_in(ns) as ipr:
            idx = ipr.link_lookup(ifname=ifname)
            if not idx:
                raise OSError(f"no interface {ifname} in {ns}")
            idx = idx[0]
            obj.update("config", ctypes.c_uint32(0), config(params, idx, cnp_dscp))
            if pace:
                leaves = _fq_leaves(ipr, idx)
            ipr.tc("add", "clsact", index=idx)
            attached = idx
            for parent, prog in ((CLSACT_INGRESS, "dcqcn_ingress"), (CLSACT_EGRESS, "dcqcn_egress")):
                ipr.tc("add-filter", "bpf", index=idx, parent=parent, prio=1, protocol=ETH_P_ALL,
                       fd=obj.program_fd(prog), name=prog, direct_action=True)
    except BaseException:
        with contextlib.suppress(Exception), netns.ipr_in(ns) as ipr:
            if attached is not None:  # the clsact we added goes, with whichever filter made it in
                with contextlib.suppress(Exception):
                    ipr.tc("del", "clsact", index=attached)
            if leaves is not None:  # and the leaf queues fq replaced come back
                _restore_leaves(ipr, idx, leaves)
        obj.close()
        raise
    return Dcqcn(ns, ifname, idx, params, obj, leaves)


__all__ = ["CLSACT_INGRESS", "Config", "Dcqcn", "Leaf", "QpPeer", "RateSample", "RpKey", "RpState", "STATS", "install"]
