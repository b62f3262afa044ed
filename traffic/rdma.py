"""RDMA (RoCEv2 over SoftRoCE/rxe) transport for collective agents (the traffic.transport.Transport interface).

* Device: the rxe device whose GID table holds this host's data-plane address (``::ffff:<ip>``, the RoCEv2 GID
  rxe derives from the netdev's IPv4 address), or the one named by ``device``. Port 1; path MTU = the port's
  active MTU (rxe derives it from the netdev's MTU: largest IB MTU <= netdev MTU - 80), or ``mtu`` if given and
  the port can take it (else TransportError naming both).
* Connection setup: one RC queue pair per peer. QP numbers, PSNs, GIDs and MTUs are exchanged over a TCP
  connection on the same fabric, opened exactly as traffic.tcp does it (rank a connects to every b > a). Why not
  rdma_cm: the agents already exchange a listen address through the controller, the TCP bootstrap needs no second
  connection manager state machine in every namespace (rdma_cm's address resolution is per netns and its defaults,
  e.g. a 655 ms min RNR timer, are not ours to choose), and the socket stays open as a liveness channel. It puts a
  handful of packets on the fabric before the timed region, none during it.
* QP attributes are explicit parameters: ``timeout`` (local ACK timeout exponent: 4.096 us x 2^timeout),
  ``retry_cnt``, ``rnr_retry`` (7 = retry forever), ``min_rnr_timer`` (IB encoding; 12 = 0.64 ms), GRH
  ``traffic_class`` (default ``dscp << 2``: the ECN bits are whatever the traffic class says; rxe copies the
  traffic class into the IPv4 TOS byte and sets no ECN-capable codepoint by itself).
* Memory: the agent's numpy buffers are registered as memory regions (the whole underlying array once, cached by
  address, LOCAL_WRITE | REMOTE_WRITE); no copies on the data path.
* Data movement, rendezvous: ``post_recv`` registers the destination and SENDs a 32-byte clear-to-send (tag, slot,
  address, rkey, length) to the peer; ``post_send`` waits for the matching clear-to-send, then does one RDMA WRITE
  WITH IMMEDIATE (immediate = the receiver's slot) straight into the destination buffer. The receiver sees the
  write's completion on its receive queue (IBV_WC_RECV_RDMA_WITH_IMM) and completes the receive; the sender's
  request completes with the write's send completion (the data has been acknowledged by the peer). Every receive
  queue is pre-posted with ``recv_depth`` small receive buffers (clear-to-sends and write-with-immediate both
  consume one; each is reposted at once).
* One completion queue, polled; ``progress(timeout)`` sleeps in short steps (0.2..2 ms) when nothing completes, so
  agents sharing a CPU with the rxe kernel threads do not spin it away.
"""

from __future__ import annotations

import ipaddress
import struct
import time
from collections import deque
from typing import Any

import numpy as np

from traffic.rxe import (IB_MTU, IB_MTU_ENUM, RECOVERY_COUNTERS, check_path_mtu, find_device, ipv4_gid, make_qp,
                         qp_to_rts, rxe_mtu_for_netdev, verbs, wc_status)
from traffic.tcp import TcpTransport
from traffic.transport import Request, Transport, TransportError

#: RdmaTransport, and the device-side names (traffic.rxe) that callers outside traffic (testbed's collective
#: workload, benchmarks/rdma_vs_ib_write_bw.py, tests) import from this module
__all__ = ["RdmaTransport", "INFO_KEYS", "IB_MTU", "IB_MTU_ENUM", "RECOVERY_COUNTERS", "check_path_mtu", "find_device",
           "ipv4_gid", "rxe_mtu_for_netdev"]

INFO = struct.Struct("<II16sII")  # qpn, psn, gid, mtu enum, magic
INFO_MAGIC = 0x7462524D
CTS = struct.Struct("<QQQII")  # tag, remote address, length, rkey, slot
CTL_SLOT = 64
K_RECV, K_CTL, K_WRITE = 1, 2, 3
_SLEEP_MIN_S, _SLEEP_MAX_S = 0.0002, 0.002
#: the per-connection statistics conn_info() reports (tcp_info.csv columns the agent fills; others read 0)
INFO_KEYS = ("writes", "bytes_written", "cts_sent", "cts_recv", "recv_done")


class _Peer:
    __slots__ = ("rank", "qp", "sock", "ctl_recv", "ctl_send", "free_ctl", "sq_used", "backlog", "stats")

    def __init__(self, rank: int):
        self.rank = rank
        self.qp = None
        self.sock = None
        self.ctl_recv = None  # MR: recv_depth slots of CTL_SLOT bytes
        self.ctl_send = None  # MR: send_depth slots
        self.free_ctl: list[int] = []
        self.sq_used = 0
        self.backlog: deque = deque()  # SendWRs waiting for send-queue room
        self.stats = dict.fromkeys(INFO_KEYS, 0)


class RdmaTransport(Transport):
    name = "rdma"

    def __init__(self, rank: int, ip: str = "0.0.0.0", device: str | None = None, dscp: int = 0,
                 traffic_class: int | None = None, mtu: int = 0, timeout: int = 16, retry_cnt: int = 7,
                 rnr_retry: int = 7, min_rnr_timer: int = 12, send_depth: int = 128, recv_depth: int = 128,
                 psn_seed: int | None = None, devices: dict | None = None, **_ignored):
        super().__init__(rank)
        if devices and str(rank) in devices:  # the job names each rank's device: open only that one
            device = devices[str(rank)]
        if not 0 <= int(dscp) <= 63:
            raise ValueError(f"dscp must be 0..63 (got {dscp})")
        tc = (int(dscp) << 2) if traffic_class is None or int(traffic_class) < 0 else int(traffic_class)
        for nm, val, lo, hi in (("traffic_class", tc, 0, 255), ("timeout", timeout, 0, 31),
                                ("retry_cnt", retry_cnt, 0, 7), ("rnr_retry", rnr_retry, 0, 7),
                                ("min_rnr_timer", min_rnr_timer, 0, 31)):
            if not lo <= int(val) <= hi:
                raise ValueError(f"{nm} must be {lo}..{hi} (got {val})")
        if mtu and int(mtu) not in IB_MTU_ENUM:
            raise ValueError(f"mtu must be one of {sorted(IB_MTU_ENUM)} (got {mtu})")
        self.ip = ip
        self.device = device
        self.tc = tc
        self.want_mtu = int(mtu)
        self.timeout, self.retry_cnt, self.rnr_retry = int(timeout), int(retry_cnt), int(rnr_retry)
        self.min_rnr_timer = int(min_rnr_timer)
        self.send_depth, self.recv_depth = int(send_depth), int(recv_depth)
        self.v = verbs()
        self.dev_name, self.gid_index = find_device(ip, device)
        e = self.v["e"]
        self.ctx = self.v["Context"](name=self.dev_name)
        port = self.ctx.query_port(1)
        self.active_mtu = IB_MTU.get(int(port.active_mtu), 1024)
        if self.want_mtu and self.want_mtu > self.active_mtu:
            raise TransportError(f"rank {rank}: RDMA MTU {self.want_mtu} is larger than {self.dev_name}'s active "
                                 f"MTU {self.active_mtu} (set by its netdev's MTU)")
        self.path_mtu = self.want_mtu or self.active_mtu
        self.gid = self.ctx.query_gid(1, self.gid_index)
        self.pd = self.v["PD"](self.ctx)
        self.cq = self.v["CQ"](self.ctx, 4096)
        self.access = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
        self.rng = np.random.default_rng(psn_seed if psn_seed is not None else None)
        self.peers: dict[int, _Peer] = {}
        self.by_qpn: dict[int, _Peer] = {}
        self.mrs: list[tuple[int, int, Any, Any]] = []  # (start, end, MR, owner object kept alive)
        self.boot = None  # the TCP bootstrap (traffic.tcp.TcpTransport): listen/connect, then liveness
        self.cts_in: dict[tuple[int, int], tuple[int, int, int, int]] = {}  # (peer, tag) -> (addr, len, rkey, slot)
        self.sends: dict[tuple[int, int], Request] = {}  # posted sends waiting for their clear-to-send
        self.recv_slots: dict[int, Request] = {}  # slot -> posted receive
        self.next_slot = 1
        self.writes: dict[int, Request] = {}
        self.next_write = 1
        self.ready: list[Request] = []
        self.blocked_recv_s = 0.0
        self.pending_recvs = 0
        self.bytes_out = 0
        self.bytes_in = 0
        self._sleep = _SLEEP_MIN_S

    # ---- setup ----

    def listen(self) -> dict:
        self.boot = TcpTransport(self.rank, ip=self.ip)
        addr = self.boot.listen()
        addr.update({"rdma_device": self.dev_name, "gid_index": self.gid_index})
        return addr

    def _mr(self, length: int, owner=None, address: int | None = None):
        MR = self.v["MR"]
        if address is None:
            return MR(self.pd, length, self.access)
        return MR(self.pd, length, self.access, address=address)

    def connect(self, peers: dict[int, dict], timeout_s: float = 30.0) -> None:
        try:
            self._connect(peers, timeout_s)
        except TransportError:
            raise
        except Exception as exc:  # noqa: BLE001 - pyverbs errors are not TransportErrors: one line for the agent
            raise TransportError(f"rank {self.rank}: RDMA connection setup on {self.dev_name}: "
                                 f"{type(exc).__name__}: {exc}") from None

    def _connect(self, peers: dict[int, dict], timeout_s: float) -> None:
        if self.boot is None:
            raise TransportError("connect() before listen()")
        deadline = time.monotonic() + timeout_s
        self.boot.connect(peers, timeout_s)
        my_mtu = IB_MTU_ENUM[self.path_mtu]
        gid_bytes = ipaddress.IPv6Address(str(self.gid)).packed
        for rank in sorted(peers):
            p = _Peer(rank)
            p.qp = make_qp(self.v, self.pd, self.cq, self.access, self.send_depth, self.recv_depth)
            p.ctl_recv = self._mr(self.recv_depth * CTL_SLOT)
            p.ctl_send = self._mr(self.send_depth * CTL_SLOT)
            p.free_ctl = list(range(self.send_depth))
            for i in range(self.recv_depth):
                self._post_ctl_recv(p, i)
            p.sock = self.boot.conns[rank].sock
            self.peers[rank] = p
            self.by_qpn[p.qp.qp_num] = p
        psns = {}
        for rank, p in self.peers.items():  # send all infos first (never blocks: tiny), then read each
            psns[rank] = int(self.rng.integers(0, 1 << 24))
            p.sock.setblocking(True)
            p.sock.sendall(INFO.pack(p.qp.qp_num, psns[rank], gid_bytes, my_mtu, INFO_MAGIC))
        for rank, p in self.peers.items():
            qpn, psn, gid, mtu_enum, magic = INFO.unpack(self._read(p, INFO.size, deadline))
            if magic != INFO_MAGIC:
                raise TransportError(f"rank {self.rank}: bad QP info from rank {rank}")
            qp_to_rts(self.v, p.qp, qpn=qpn, psn=psn, gid=gid, my_psn=psns[rank], mtu_enum=min(my_mtu, mtu_enum),
                      gid_index=self.gid_index, traffic_class=self.tc, min_rnr_timer=self.min_rnr_timer,
                      timeout=self.timeout, retry_cnt=self.retry_cnt, rnr_retry=self.rnr_retry)
        for p in self.peers.values():  # both ends in RTS before any clear-to-send flows
            p.sock.sendall(b"R")
        for p in self.peers.values():
            if self._read(p, 1, deadline) != b"R":
                raise TransportError(f"rank {self.rank}: bad ready byte from rank {p.rank}")
            p.sock.setblocking(False)

    def _read(self, p: _Peer, n: int, deadline: float) -> bytes:
        out = b""
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TransportError(f"rank {self.rank}: rank {p.rank} did not send its QP info in time")
            p.sock.settimeout(left)
            try:
                part = p.sock.recv(n - len(out))
            except OSError as exc:
                raise TransportError(f"rank {self.rank}: QP info from rank {p.rank}: {exc}") from None
            if not part:
                raise TransportError(f"rank {self.rank}: rank {p.rank} closed during QP setup")
            out += part
        return out

    # ---- work requests ----

    def _post_ctl_recv(self, p: _Peer, i: int) -> None:
        v = self.v
        sge = v["SGE"](p.ctl_recv.buf + i * CTL_SLOT, CTL_SLOT, p.ctl_recv.lkey)
        p.qp.post_recv(v["RecvWR"](wr_id=(K_RECV << 56) | i, num_sge=1, sg=[sge]))

    def _post(self, p: _Peer, wr) -> None:
        if p.sq_used >= self.send_depth or p.backlog:
            p.backlog.append(wr)
            return
        p.qp.post_send(wr)
        p.sq_used += 1

    def _send_cts(self, p: _Peer, tag: int, addr: int, length: int, rkey: int, slot: int) -> None:
        v = self.v
        e = v["e"]
        if not p.free_ctl:
            raise TransportError(f"rank {self.rank}: more than {self.send_depth} clear-to-sends in flight to "
                                 f"rank {p.rank}")
        i = p.free_ctl.pop()
        off = i * CTL_SLOT
        p.ctl_send.write(CTS.pack(tag, addr, length, rkey, slot), CTS.size, off)
        sge = v["SGE"](p.ctl_send.buf + off, CTS.size, p.ctl_send.lkey)
        wr = v["SendWR"](wr_id=(K_CTL << 56) | (p.rank << 32) | i, opcode=e.IBV_WR_SEND, num_sge=1, sg=[sge],
                         send_flags=e.IBV_SEND_SIGNALED)
        p.stats["cts_sent"] += 1
        self._post(p, wr)

    def _write(self, req: Request, addr: int, length: int, rkey: int, slot: int) -> None:
        v = self.v
        e = v["e"]
        if length != req.nbytes:
            raise TransportError(f"rank {self.rank}: message to rank {req.peer} tag {req.tag} has {req.nbytes} "
                                 f"bytes, the receive expects {length}")
        p = self.peers[req.peer]
        wid = self.next_write
        self.next_write += 1
        self.writes[wid] = req
        if req.nbytes:
            mr, a = self._region(req.buf)
            sge = v["SGE"](a, req.nbytes, mr.lkey)
        else:
            sge = v["SGE"](p.ctl_send.buf, 0, p.ctl_send.lkey)
        wr = v["SendWR"](wr_id=(K_WRITE << 56) | wid, opcode=e.IBV_WR_RDMA_WRITE_WITH_IMM, num_sge=1, sg=[sge],
                         imm_data=slot, send_flags=e.IBV_SEND_SIGNALED)
        wr.set_wr_rdma(rkey, addr)
        self._post(p, wr)

    def _region(self, buf: memoryview):
        """(MR, address) of a buffer: the whole underlying numpy array is registered once and cached."""
        arr = np.frombuffer(buf, dtype=np.uint8)
        a = arr.ctypes.data
        n = len(arr)
        for start, end, mr, _ in self.mrs:
            if start <= a and a + n <= end:
                return mr, a
        root = buf.obj if isinstance(buf, memoryview) else None
        while isinstance(root, np.ndarray) and isinstance(root.base, (np.ndarray, bytearray, bytes)):
            root = root.base
        start, length, owner = a, n, buf
        if isinstance(root, np.ndarray) and root.flags.c_contiguous:
            rs = root.ctypes.data
            if rs <= a and a + n <= rs + root.nbytes:
                start, length, owner = rs, root.nbytes, root
        try:
            mr = self._mr(max(length, 1), owner, address=start)
        except Exception as exc:  # noqa: BLE001 - pyverbs raises its own error types
            raise TransportError(f"rank {self.rank}: registering {length} bytes: {exc}") from None
        self.mrs.append((start, start + length, mr, owner))
        return mr, a

    # ---- posting ----

    def post_send(self, peer: int, tag: int, buf: memoryview, context: Any = None) -> Request:
        if peer not in self.peers:
            raise TransportError(f"rank {self.rank}: no connection to rank {peer}")
        mv = memoryview(buf).cast("B")
        req = Request("send", peer, tag, len(mv), mv, context=context)
        key = (peer, tag)
        cts = self.cts_in.pop(key, None)
        if cts is not None:
            self._write(req, *cts)
        else:
            if key in self.sends:
                raise TransportError(f"rank {self.rank}: send to {peer} tag {tag} posted twice")
            self.sends[key] = req
        return req

    def post_recv(self, peer: int, tag: int, buf: memoryview, context: Any = None) -> Request:
        p = self.peers.get(peer)
        if p is None:
            raise TransportError(f"rank {self.rank}: no connection to rank {peer}")
        mv = memoryview(buf).cast("B")
        req = Request("recv", peer, tag, len(mv), mv, context=context)
        slot = self.next_slot
        self.next_slot = self.next_slot + 1 if self.next_slot < 0x7FFFFFFF else 1
        self.recv_slots[slot] = req
        self.pending_recvs += 1
        if req.nbytes:
            mr, a = self._region(mv)
            self._send_cts(p, tag, a, req.nbytes, mr.rkey, slot)
        else:
            self._send_cts(p, tag, 0, 0, 0, slot)
        return req

    # ---- progress ----

    def _poll(self) -> int:
        e = self.v["e"]
        total = 0
        while True:
            n, wcs = self.cq.poll(num_entries=64)
            if n <= 0:
                return total
            total += n
            for wc in wcs[:n]:
                self._completion(wc, e)

    def _completion(self, wc, e) -> None:
        kind = wc.wr_id >> 56
        if wc.status != e.IBV_WC_SUCCESS:
            p = self.by_qpn.get(wc.qp_num)
            who = f"rank {p.rank}" if p else f"QP {wc.qp_num}"
            raise TransportError(f"rank {self.rank}: work completion error with {who}: status {wc.status} "
                                 f"({wc_status(wc.status)}), kind {kind}")
        now = time.monotonic()
        if kind == K_RECV:
            p = self.by_qpn[wc.qp_num]
            i = wc.wr_id & 0xFFFFFFFF
            if wc.opcode == e.IBV_WC_RECV_RDMA_WITH_IMM:
                req = self.recv_slots.pop(wc.imm_data, None)
                if req is None:  # a binding that byte-swaps the immediate on one side only
                    req = self.recv_slots.pop(int.from_bytes(int(wc.imm_data).to_bytes(4, "little"), "big"), None)
                if req is None:
                    raise TransportError(f"rank {self.rank}: write from rank {p.rank} for unknown slot {wc.imm_data}")
                req.done, req.t_done = True, now
                self.pending_recvs -= 1
                self.bytes_in += req.nbytes
                p.stats["recv_done"] += 1
                self.ready.append(req)
            else:
                tag, addr, length, rkey, slot = CTS.unpack(p.ctl_recv.read(CTS.size, i * CTL_SLOT))
                p.stats["cts_recv"] += 1
                key = (p.rank, tag)
                req = self.sends.pop(key, None)
                if req is not None:
                    self._write(req, addr, length, rkey, slot)
                else:
                    if key in self.cts_in:
                        raise TransportError(f"rank {self.rank}: rank {p.rank} asked for tag {tag} twice")
                    self.cts_in[key] = (addr, length, rkey, slot)
            self._post_ctl_recv(p, i)
        elif kind == K_CTL:
            p = self.peers[(wc.wr_id >> 32) & 0xFFFFFF]
            p.free_ctl.append(wc.wr_id & 0xFFFFFFFF)
            self._sq_done(p)
        elif kind == K_WRITE:
            req = self.writes.pop(wc.wr_id & ((1 << 56) - 1))
            req.done, req.t_done = True, now
            self.bytes_out += req.nbytes
            p = self.peers[req.peer]
            p.stats["writes"] += 1
            p.stats["bytes_written"] += req.nbytes
            self.ready.append(req)
            self._sq_done(p)

    def _sq_done(self, p: _Peer) -> None:
        p.sq_used -= 1
        while p.backlog and p.sq_used < self.send_depth:
            p.qp.post_send(p.backlog.popleft())
            p.sq_used += 1

    def progress(self, timeout_s: float) -> list[Request]:
        end = time.monotonic() + max(0.0, timeout_s)
        while True:
            if self._poll():
                self._sleep = _SLEEP_MIN_S
            if self.ready:
                break
            now = time.monotonic()
            if now >= end:
                break
            d = min(self._sleep, end - now)
            time.sleep(d)
            waited = time.monotonic() - now
            self.blocked_s += waited
            if self.pending_recvs:
                self.blocked_recv_s += waited
            self._sleep = min(self._sleep * 2, _SLEEP_MAX_S)
        out, self.ready = self.ready, []
        return out

    # ---- statistics and teardown ----

    def conn_info(self) -> dict[int, dict[str, float]]:
        return {r: dict(p.stats) for r, p in self.peers.items()}

    def describe(self) -> dict:
        return {"transport": self.name, "device": self.dev_name, "gid_index": self.gid_index,
                "path_mtu": self.path_mtu, "active_mtu": self.active_mtu, "traffic_class": self.tc,
                "timeout": self.timeout, "retry_cnt": self.retry_cnt, "rnr_retry": self.rnr_retry,
                "min_rnr_timer": self.min_rnr_timer, "connections": len(self.peers), "cc": []}

    def close(self) -> None:
        for p in self.peers.values():
            for obj in (p.qp, p.ctl_recv, p.ctl_send):
                try:
                    if obj is not None:
                        obj.close()
                except Exception:  # noqa: BLE001
                    pass
        for _, _, mr, _ in self.mrs:
            try:
                mr.close()
            except Exception:  # noqa: BLE001
                pass
        self.mrs.clear()
        self.peers.clear()
        for obj in (self.cq, self.pd, self.ctx):
            try:
                obj.close()
            except Exception:  # noqa: BLE001
                pass
        if self.boot is not None:
            self.boot.close()
            self.boot = None
