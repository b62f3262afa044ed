"""The SoftRoCE (rxe) device side of the RDMA transport: which device and GID carry a host's address, the IB MTU
rxe gives a netdev, an RC queue pair taken INIT -> RTR -> RTS (ibv_modify_qp), and the names of work-completion
statuses and of the rxe counters that move only on recovery. pyverbs is imported when a device is opened, so
hosts running TCP agents need no pyverbs."""

from __future__ import annotations

import ipaddress
import os

from traffic.transport import TransportError

IB_MTU = {1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096}
IB_MTU_ENUM = {v: k for k, v in IB_MTU.items()}


def rxe_mtu_for_netdev(netdev_mtu: int) -> int:
    """The active IB MTU rxe gives a port on a netdev of this MTU (drivers/infiniband/sw/rxe/rxe_param.h:
    eth_mtu_int_to_enum subtracts RXE_MAX_HDR_LENGTH = 80 bytes of headers and rounds down to an IB MTU)."""
    left = int(netdev_mtu) - 80
    best = 0
    for m in sorted(IB_MTU_ENUM):
        if m <= left:
            best = m
    return best or 256


def check_path_mtu(mtu: int, link_mtu: int, on_rdma: bool = True) -> None:
    """ValueError (one line) unless ``mtu`` is 0 (the rxe port's active MTU) or an IB MTU, and, ``on_rdma``, one
    that rxe on a link of ``link_mtu`` can take (the link MTU less 80 header bytes)."""
    if mtu and mtu not in IB_MTU_ENUM:
        raise ValueError(f"must be 0 or one of {', '.join(map(str, sorted(IB_MTU_ENUM)))} (got {mtu})")
    if on_rdma and mtu and mtu > rxe_mtu_for_netdev(link_mtu):
        raise ValueError(f"{mtu} does not fit the host links' MTU {link_mtu} (rxe's largest MTU there is "
                         f"{rxe_mtu_for_netdev(link_mtu)})")


def ipv4_gid(ip: str) -> str:
    """The RoCEv2 GID of an IPv4 address as pyverbs prints it (IPv4-mapped IPv6, 8 groups of 4 hex digits)."""
    return ipaddress.IPv6Address("::ffff:" + ip).exploded


def verbs() -> dict:
    """pyverbs' classes and enums by name (imported here, not at module load: see the module docstring)."""
    try:
        import pyverbs.enums as e
        from pyverbs.addr import GID, AHAttr, GlobalRoute
        from pyverbs.cq import CQ, CompChannel
        from pyverbs.device import Context, get_device_list
        from pyverbs.mr import MR
        from pyverbs.pd import PD
        from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
        from pyverbs.wr import SGE, RecvWR, SendWR
    except ImportError as exc:
        raise TransportError(f"pyverbs does not import ({exc}): install Debian's python3-pyverbs and use the "
                             "project's venv") from None
    return dict(e=e, GID=GID, AHAttr=AHAttr, GlobalRoute=GlobalRoute, CQ=CQ, CompChannel=CompChannel, Context=Context,
                get_device_list=get_device_list, MR=MR, PD=PD, QP=QP, QPAttr=QPAttr, QPCap=QPCap,
                QPInitAttr=QPInitAttr, SGE=SGE, RecvWR=RecvWR, SendWR=SendWR)


def find_device(ip: str, name: str | None = None) -> tuple[str, int]:
    """(device name, GID index) of the RDMA device holding ``::ffff:ip`` on port 1."""
    v = verbs()
    want = ipv4_gid(ip)
    names = []
    for dev in v["get_device_list"]():
        dn = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
        names.append(dn)
        if name and dn != name:
            continue
        with v["Context"](name=dn) as ctx:
            idx = _gid_index(ctx, want)
            if idx is not None:
                return dn, idx
    what = f"device {name!r}" if name else f"any RDMA device ({', '.join(names) or 'none'})"
    raise TransportError(f"no RoCEv2 GID for {ip} on {what}: is an rxe device on this host's interface?")


def _gid_index(ctx, want: str) -> int | None:
    """Index of GID ``want`` on port 1: one query of the valid entries (ibv_query_gid_table), else the first 16
    slots one by one (scanning rxe's whole 1024-slot table costs seconds in the emulated VM)."""
    target = ipaddress.IPv6Address(want)
    try:
        for ent in ctx.query_gid_table(64):
            g = ent.gid_str() if callable(getattr(ent, "gid_str", None)) else ent.gid_str
            if ent.port_num == 1 and ipaddress.IPv6Address(str(g)) == target:
                return int(ent.gid_index)
        return None
    except Exception:  # noqa: BLE001 - older providers/bindings: fall back to single queries
        pass
    for i in range(min(16, ctx.query_port(1).gid_tbl_len)):
        try:
            g = str(ctx.query_gid(1, i))
        except Exception:  # noqa: BLE001 - empty GID slots raise on some providers
            continue
        if ipaddress.IPv6Address(g) == target:
            return i
    return None


def _event_fds() -> set[int]:
    """The process's descriptors that are verbs event files (``anon_inode:[infinibandevent]``)."""
    out = set()
    for f in os.listdir("/proc/self/fd"):
        try:
            if "infinibandevent" in os.readlink(f"/proc/self/fd/{f}"):
                out.add(int(f))
        except OSError:
            continue
    return out


def completion_channel(v: dict, ctx):
    """(channel, fd): an ibv_comp_channel of ``ctx`` and the file descriptor the kernel signals when a CQ armed with
    ibv_req_notify_cq gets a completion (readable then: select() on it instead of polling a CQ in a sleep loop).
    pyverbs does not expose the descriptor: it is a verbs event file (``anon_inode:[infinibandevent]``) that was not
    one before the channel was made (compared as event files, not as numbers: the number of the descriptor that
    listed /proc/self/fd is free again and the channel may get it). Where two appear (seen once in the lab VM's 7.3
    kernel, before that reuse was understood; presumably the context's async-event file, allocated on first use,
    then the channel's: not checked), the channel's is taken to be the later, higher-numbered one (a process's next
    descriptor is its lowest free one; measured in the lab VM: select() on it woke 32 times for 32 completions,
    benchmarks/verbs_write_bw.py). fd is None if it cannot be told apart (the caller then polls in short sleeps),
    both None if the device gives no channel."""
    before = _event_fds()
    try:
        ch = v["CompChannel"](ctx)
    except Exception:  # noqa: BLE001 - pyverbs raises its own error types: the caller polls in short sleeps
        return None, None
    found = _event_fds() - before
    return ch, (max(found) if len(found) in (1, 2) else None)


def make_qp(v: dict, pd, cq, access: int, send_depth: int, recv_depth: int, max_send_sge: int = 1):
    """An RC queue pair on ``cq`` (sends and receives), moved to INIT on port 1 with ``access`` flags."""
    e = v["e"]
    cap = v["QPCap"](max_send_wr=send_depth, max_recv_wr=recv_depth, max_send_sge=max_send_sge, max_recv_sge=1)
    # sq_sig_all=0: a send work request makes a completion only if it asks for one (pyverbs defaults to all)
    qp = v["QP"](pd, v["QPInitAttr"](qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap, sq_sig_all=0))
    a = v["QPAttr"](qp_state=e.IBV_QPS_INIT)
    a.pkey_index = 0
    a.port_num = 1
    a.qp_access_flags = access
    qp.modify(a, e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT | e.IBV_QP_ACCESS_FLAGS)
    return qp


def qp_to_rts(v: dict, qp, *, qpn: int, psn: int, gid: bytes, my_psn: int, mtu_enum: int, gid_index: int,
              traffic_class: int, min_rnr_timer: int, timeout: int, retry_cnt: int, rnr_retry: int) -> None:
    """Move ``qp`` to RTR towards the peer's queue pair (``qpn``, ``psn``, ``gid``; RoCEv2 GRH with
    ``traffic_class``), then to RTS with our send PSN and the retry settings."""
    e = v["e"]
    g = v["GID"]()
    g.gid = ipaddress.IPv6Address(gid).exploded
    gr = v["GlobalRoute"](dgid=g, sgid_index=gid_index, hop_limit=64, traffic_class=traffic_class)
    ah = v["AHAttr"](port_num=1, is_global=1, gr=gr)
    a = v["QPAttr"](qp_state=e.IBV_QPS_RTR)
    a.path_mtu = mtu_enum
    a.dest_qp_num = qpn
    a.rq_psn = psn
    a.max_dest_rd_atomic = 1
    a.min_rnr_timer = min_rnr_timer
    a.ah_attr = ah
    qp.modify(a, e.IBV_QP_STATE | e.IBV_QP_AV | e.IBV_QP_PATH_MTU | e.IBV_QP_DEST_QPN | e.IBV_QP_RQ_PSN
              | e.IBV_QP_MAX_DEST_RD_ATOMIC | e.IBV_QP_MIN_RNR_TIMER)
    a = v["QPAttr"](qp_state=e.IBV_QPS_RTS)
    a.timeout = timeout
    a.retry_cnt = retry_cnt
    a.rnr_retry = rnr_retry
    a.sq_psn = my_psn
    a.max_rd_atomic = 1
    qp.modify(a, e.IBV_QP_STATE | e.IBV_QP_TIMEOUT | e.IBV_QP_RETRY_CNT | e.IBV_QP_RNR_RETRY | e.IBV_QP_SQ_PSN
              | e.IBV_QP_MAX_QP_RD_ATOMIC)


_WC_STATUS = {1: "local length error", 2: "local QP operation error", 4: "local protection error",
              5: "work request flushed", 7: "memory window bind error", 9: "remote invalid request",
              10: "remote access error", 11: "remote operation error", 12: "transport retry counter exceeded",
              13: "RNR retry counter exceeded"}


def wc_status(s: int) -> str:
    return _WC_STATUS.get(int(s), "see ibv_wc_status")


#: rxe counters that only move when packets are lost, reordered or retried (none of them moves on a clean path)
RECOVERY_COUNTERS = ("completer_retry_err", "rcvd_seq_err", "out_of_seq_request", "duplicate_request",
                     "retry_exceeded_err", "rcvd_rnr_err", "send_rnr_err", "retry_rnr_exceeded_err")
