"""RDMA (RoCEv2 over SoftRoCE/rxe) transport for collective agents (the traffic.transport.Transport interface).

* Device: the rxe device whose GID table holds this host's data-plane address (``::ffff:<ip>``), or the one named
  by ``device`` (traffic.rxe). Port 1; path MTU = the port's active MTU, or ``mtu`` if the port can take it.
* Connection setup: one RC queue pair per peer; QP numbers, PSNs, GIDs, MTUs and receive rings are exchanged over
  a TCP connection opened exactly as traffic.tcp does it (traffic.rdma_connect). Why not rdma_cm: the agents
  already exchange a listen address through the controller, rdma_cm's address resolution is per netns and its
  defaults (a 655 ms min RNR timer) are not ours to choose, and the socket stays open as a liveness channel.
* QP attributes are explicit parameters: ``timeout`` (4.096 us x 2^timeout), ``retry_cnt``, ``rnr_retry`` (7 =
  forever), ``min_rnr_timer`` (IB encoding; 12 = 0.64 ms), GRH ``traffic_class`` (default ``dscp << 2``; rxe
  copies it into the IPv4 TOS byte and sets no ECN-capable codepoint by itself).
* Data movement (traffic.rdma_eager, the default ``credits`` > 0): as perftest keeps many writes in flight, a send
  is cut into pieces written at once, each by an RDMA WRITE WITH IMMEDIATE into a slot of the receive ring the peer
  registered for us, while we hold credits (traffic.rdma_credits); the receiver copies pieces into the posted
  receive and gives slots back in batches. A send whose pieces fit in free registered send buffers is copied and
  done at once (``drain`` writes what is left before the agent reports). ``credits=0``: the earlier rendezvous
  (traffic.rdma_rendezvous), a clear-to-send per message, then one write straight into the destination buffer.
* Completions: one CQ. Only the requests that need one ask for a completion (traffic.rdma_sendq: the last piece
  of a message, control messages, and one in ``signal_every``); ``progress(timeout)`` polls the CQ in batches of
  64 and, with nothing to do, sleeps in select() on the CQ's completion channel until the next completion (or,
  when the channel's descriptor cannot be found, in short sleeps of 0.2..2 ms), so agents sharing a CPU with the
  rxe kernel threads do not spin it away.
* Memory: the agent's numpy buffers are registered once (the whole underlying array, cached by address); the
  receive rings and control slots are registered at connection setup and reused.
* ``describe()["profile"]``: where the time went (waiting, copying, waiting for clear-to-sends or credits, CPU
  seconds of the process from the first post to the last completion), for benchmarks/rdma_vs_ib_write_bw.py.
"""

from __future__ import annotations

import ipaddress
import os
import select
import time
from typing import Any

import numpy as np

from traffic import rdma_connect
from traffic.rdma_credits import HDR_BYTES, check_ring
from traffic.rdma_eager import Eager
from traffic.rdma_rendezvous import CTS, Rendezvous
from traffic.rdma_sendq import Posted, SendQueue
from traffic.rxe import (IB_MTU, IB_MTU_ENUM, RECOVERY_COUNTERS, check_path_mtu, completion_channel, find_device,
                         ipv4_gid, make_qp, qp_to_rts, rxe_mtu_for_netdev, verbs, wc_status)
from traffic.tcp import TcpTransport
from traffic.transport import Request, Transport, TransportError

#: RdmaTransport, and the device-side names (traffic.rxe) that callers outside traffic (testbed's collective
#: workload, benchmarks/rdma_vs_ib_write_bw.py, tests) import from this module
__all__ = ["RdmaTransport", "INFO_KEYS", "CTS", "IB_MTU", "IB_MTU_ENUM", "RECOVERY_COUNTERS", "check_path_mtu",
           "find_device", "ipv4_gid", "rxe_mtu_for_netdev"]

CTL_SLOT = HDR_BYTES  # a control slot holds a clear-to-send, a credit message or a piece's header
K_RECV, K_CTL = 1, 2  # work-request kinds (the top byte of wr_id); the protocols' writes are 3 and 4
_SLEEP_MIN_S, _SLEEP_MAX_S = 0.0002, 0.002
#: the per-connection statistics conn_info() reports (tcp_info.csv columns the agent fills; others read 0)
INFO_KEYS = ("writes", "bytes_written", "cts_sent", "cts_recv", "recv_done", "pieces", "credit_msgs_sent",
             "credit_msgs_recv", "held_copied_out")
PROFILE_KEYS = ("wait_s", "copy_s", "cts_wait_s", "credit_wait_s", "cpu_s", "cpu_user_s", "cpu_sys_s", "wakeups",
                "completions", "polls_busy", "messages_sent", "messages_received")


class _Peer:
    __slots__ = ("rank", "qp", "sock", "ctl_recv", "ctl_send", "free_ctl", "sq", "stats", "eager")

    def __init__(self, rank: int):
        self.rank = rank
        self.qp = self.sock = self.ctl_recv = self.ctl_send = None
        self.free_ctl: list[int] = []  # control slots (clear-to-sends, credit messages, piece headers) free
        self.sq: SendQueue | None = None
        self.stats = dict.fromkeys(INFO_KEYS, 0)
        self.eager = None  # traffic.rdma_eager.EagerPeer


class RdmaTransport(Transport):
    name = "rdma"
    CTL_SLOT = CTL_SLOT
    CTL_RESERVE = 8  # control slots pieces leave free for credit messages

    def __init__(self, rank: int, ip: str = "0.0.0.0", device: str | None = None, dscp: int = 0,
                 traffic_class: int | None = None, mtu: int = 0, timeout: int = 16, retry_cnt: int = 7,
                 rnr_retry: int = 7, min_rnr_timer: int = 12, send_depth: int = 128, recv_depth: int = 0,
                 credits: int = 8, slot_bytes: int = 128 * 1024, signal_every: int = 16,
                 psn_seed: int | None = None, devices: dict | None = None, **_ignored):
        super().__init__(rank)
        if devices and str(rank) in devices:  # the job names each rank's device: open only that one
            device = devices[str(rank)]
        self._check(dscp, traffic_class, mtu, timeout, retry_cnt, rnr_retry, min_rnr_timer, signal_every)
        check_ring(credits, slot_bytes)
        # receives in use at once: a write per slot of our ring and about as many credit messages
        recv_depth = int(recv_depth) or max(128, 2 * int(credits) + 2)
        if int(send_depth) < 2 * self.CTL_RESERVE or recv_depth < 2 * int(credits) + 2:
            raise ValueError(f"send_depth must be >= {2 * self.CTL_RESERVE} and recv_depth >= 2 x credits + 2")
        self.ip, self.device, self.want_mtu = ip, device, int(mtu)
        self.tc = (int(dscp) << 2) if traffic_class is None or int(traffic_class) < 0 else int(traffic_class)
        self.timeout, self.retry_cnt, self.rnr_retry = int(timeout), int(retry_cnt), int(rnr_retry)
        self.min_rnr_timer = int(min_rnr_timer)
        self.send_depth, self.recv_depth = int(send_depth), recv_depth
        self.credits, self.slot_bytes, self.signal_every = int(credits), int(slot_bytes), int(signal_every)
        self.proto = Eager(self, self.credits, self.slot_bytes) if self.credits else Rendezvous(self)
        self.v = verbs()
        self.dev_name, self.gid_index = find_device(ip, device)
        self.ctx = self.v["Context"](name=self.dev_name)
        self.active_mtu = IB_MTU.get(int(self.ctx.query_port(1).active_mtu), 1024)
        if self.want_mtu and self.want_mtu > self.active_mtu:
            raise TransportError(f"rank {rank}: RDMA MTU {self.want_mtu} is larger than {self.dev_name}'s active "
                                 f"MTU {self.active_mtu} (set by its netdev's MTU)")
        self.path_mtu = self.want_mtu or self.active_mtu
        self.gid = self.ctx.query_gid(1, self.gid_index)
        self.pd = self.v["PD"](self.ctx)
        self.channel, self.cq_fd = completion_channel(self.v, self.ctx)
        self.cq = self.v["CQ"](self.ctx, 4096, None, self.channel, 0)
        self.armed = False
        self.access = self.v["e"].IBV_ACCESS_LOCAL_WRITE | self.v["e"].IBV_ACCESS_REMOTE_WRITE
        self.rng = np.random.default_rng(psn_seed if psn_seed is not None else None)
        self.peers: dict[int, _Peer] = {}
        self.by_qpn: dict[int, _Peer] = {}
        self.mrs: list[tuple[int, int, Any, Any]] = []  # (start, end, MR, owner object kept alive)
        self.boot = None  # the TCP bootstrap (traffic.tcp.TcpTransport): listen/connect, then liveness
        self.next_wid = 1
        self.ready: list[Request] = []
        self.blocked_recv_s = 0.0
        self.pending_recvs = 0
        self.bytes_out = self.bytes_in = 0
        self._sleep = _SLEEP_MIN_S
        self.prof = dict.fromkeys(PROFILE_KEYS, 0)
        self.cpu0: os.times_result | None = None  # the process's CPU times at the first post

    @staticmethod
    def _check(dscp, traffic_class, mtu, timeout, retry_cnt, rnr_retry, min_rnr_timer, signal_every) -> None:
        """ValueError (one line) for an option out of range, before any device is opened."""
        if not 0 <= int(dscp) <= 63:
            raise ValueError(f"dscp must be 0..63 (got {dscp})")
        tc = (int(dscp) << 2) if traffic_class is None or int(traffic_class) < 0 else int(traffic_class)
        for nm, val, lo, hi in (("traffic_class", tc, 0, 255), ("timeout", timeout, 0, 31),
                                ("retry_cnt", retry_cnt, 0, 7), ("rnr_retry", rnr_retry, 0, 7),
                                ("min_rnr_timer", min_rnr_timer, 0, 31), ("signal_every", signal_every, 1, 1024)):
            if not lo <= int(val) <= hi:
                raise ValueError(f"{nm} must be {lo}..{hi} (got {val})")
        if mtu and int(mtu) not in IB_MTU_ENUM:
            raise ValueError(f"mtu must be one of {sorted(IB_MTU_ENUM)} (got {mtu})")

    # ---- setup ----

    def listen(self) -> dict:
        self.boot = TcpTransport(self.rank, ip=self.ip)
        addr = self.boot.listen()
        addr.update({"rdma_device": self.dev_name, "gid_index": self.gid_index})
        return addr

    def mr(self, length: int, address: int | None = None):
        """A memory region of this transport's PD (LOCAL_WRITE | REMOTE_WRITE): new memory, or ``address``'s."""
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
        mine = {}
        for rank in sorted(peers):
            p = _Peer(rank)
            p.qp = make_qp(self.v, self.pd, self.cq, self.access, self.send_depth, self.recv_depth, max_send_sge=2)
            p.ctl_recv = self.mr(self.recv_depth * self.CTL_SLOT)
            p.ctl_send = self.mr(self.send_depth * self.CTL_SLOT)
            p.free_ctl = list(range(self.send_depth))
            p.sq = SendQueue(self.send_depth, self.signal_every)
            ring = self.proto.setup(p)
            for i in range(self.recv_depth):
                self._post_ctl_recv(p, i)
            p.sock = self.boot.conns[rank].sock
            self.peers[rank] = p
            self.by_qpn[p.qp.qp_num] = p
            mine[rank] = rdma_connect.QpInfo(p.qp.qp_num, int(self.rng.integers(0, 1 << 24)), gid_bytes, my_mtu,
                                             *ring)
        socks = {r: p.sock for r, p in self.peers.items()}
        theirs = rdma_connect.exchange(self.rank, socks, mine, deadline)
        for rank, p in self.peers.items():
            t = theirs[rank]
            qp_to_rts(self.v, p.qp, qpn=t.qpn, psn=t.psn, gid=t.gid, my_psn=mine[rank].psn,
                      mtu_enum=min(my_mtu, t.mtu_enum), gid_index=self.gid_index, traffic_class=self.tc,
                      min_rnr_timer=self.min_rnr_timer, timeout=self.timeout, retry_cnt=self.retry_cnt,
                      rnr_retry=self.rnr_retry)
            self.proto.connected(p, t)
        rdma_connect.ready(self.rank, socks, deadline)  # both ends in RTS before anything flows

    # ---- work requests ----

    def _post_ctl_recv(self, p: _Peer, i: int) -> None:
        v = self.v
        sge = v["SGE"](p.ctl_recv.buf + i * self.CTL_SLOT, self.CTL_SLOT, p.ctl_recv.lkey)
        p.qp.post_recv(v["RecvWR"](wr_id=(K_RECV << 56) | i, num_sge=1, sg=[sge]))

    def push(self, p: _Peer, record: tuple, must_signal: bool) -> None:
        """Queue a send-queue entry; ``record``: (kind, the send it completes or None, its control slot or -1,
        what the protocol builds the work request from)."""
        wid = self.next_wid
        self.next_wid = wid + 1 if wid < 0xFFFFFFFF else 1
        for e in p.sq.push(Posted(wid, record, must_signal)):
            self._post_wr(p, e)

    def _post_wr(self, p: _Peer, e: Posted) -> None:
        v = self.v
        flags = v["e"].IBV_SEND_SIGNALED if e.signaled else 0
        wr_id = (e.record[0] << 56) | (p.rank << 32) | e.wid
        if e.record[0] == K_CTL:
            _, _, i, n = e.record
            sge = v["SGE"](p.ctl_send.buf + i * self.CTL_SLOT, n, p.ctl_send.lkey)
            wr = v["SendWR"](wr_id=wr_id, opcode=v["e"].IBV_WR_SEND, num_sge=1, sg=[sge], send_flags=flags)
        else:
            wr = self.proto.build_wr(p, e.record, wr_id, flags)
        p.qp.post_send(wr)

    def send_ctl(self, p: _Peer, payload: bytes) -> bool:
        """SEND ``payload`` (a clear-to-send or a credit message) from a control slot; False if none is free."""
        if not p.free_ctl:
            return False
        i = p.free_ctl.pop()
        p.ctl_send.write(payload, len(payload), i * self.CTL_SLOT)
        self.push(p, (K_CTL, None, i, len(payload)), True)
        return True

    def region(self, buf: memoryview):
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
            mr = self.mr(max(length, 1), address=start)
        except Exception as exc:  # noqa: BLE001 - pyverbs raises its own error types
            raise TransportError(f"rank {self.rank}: registering {length} bytes: {exc}") from None
        self.mrs.append((start, start + length, mr, owner))
        return mr, a

    # ---- posting ----

    def _request(self, kind: str, peer: int, tag: int, buf: memoryview, context: Any) -> tuple[_Peer, Request]:
        p = self.peers.get(peer)
        if p is None:
            raise TransportError(f"rank {self.rank}: no connection to rank {peer}")
        if self.cpu0 is None:
            self.cpu0 = os.times()
        mv = memoryview(buf).cast("B")
        return p, Request(kind, peer, tag, len(mv), mv, context=context)

    def post_send(self, peer: int, tag: int, buf: memoryview, context: Any = None) -> Request:
        p, req = self._request("send", peer, tag, buf, context)
        self.proto.post_send(p, req)
        return req

    def post_recv(self, peer: int, tag: int, buf: memoryview, context: Any = None) -> Request:
        p, req = self._request("recv", peer, tag, buf, context)
        self.pending_recvs += 1
        self.proto.post_recv(p, req)
        return req

    def send_done(self, p: _Peer, req: Request) -> None:
        req.done, req.t_done = True, time.monotonic()
        self.bytes_out += req.nbytes
        p.stats["writes"] += 1
        p.stats["bytes_written"] += req.nbytes
        self.prof["messages_sent"] += 1
        self.ready.append(req)

    def recv_done(self, p: _Peer, req: Request) -> None:
        req.done, req.t_done = True, time.monotonic()
        self.pending_recvs -= 1
        self.bytes_in += req.nbytes
        p.stats["recv_done"] += 1
        self.prof["messages_received"] += 1
        self.ready.append(req)

    # ---- progress ----

    def _poll(self) -> int:
        e = self.v["e"]
        total = 0
        while True:
            n, wcs = self.cq.poll(num_entries=64)
            if n <= 0:
                break
            total += n
            for wc in wcs[:n]:
                self._completion(wc, e)
        if total:
            self.prof["completions"] += total
            self.prof["polls_busy"] += 1
        return total

    def _completion(self, wc, e) -> None:
        kind = wc.wr_id >> 56
        if wc.status != e.IBV_WC_SUCCESS:
            p = self.by_qpn.get(wc.qp_num)
            who = f"rank {p.rank}" if p else f"QP {wc.qp_num}"
            raise TransportError(f"rank {self.rank}: work completion error with {who}: status {wc.status} "
                                 f"({wc_status(wc.status)}), kind {kind}")
        if kind == K_RECV:
            p = self.by_qpn[wc.qp_num]
            i = wc.wr_id & 0xFFFFFFFF
            if wc.opcode == e.IBV_WC_RECV_RDMA_WITH_IMM:
                self.proto.on_write(p, int(wc.imm_data))
            else:
                self.proto.on_message(p, i)
            self._post_ctl_recv(p, i)
            return
        p = self.peers[(wc.wr_id >> 32) & 0xFFFFFF]
        try:
            done, postable = p.sq.completed(wc.wr_id & 0xFFFFFFFF)
        except KeyError:
            raise TransportError(f"rank {self.rank}: completion of request {wc.wr_id & 0xFFFFFFFF} to rank {p.rank}, "
                                 "which did not ask for one") from None
        for d in done:
            kind, req, ctl = d.record[:3]
            if ctl >= 0:
                p.free_ctl.append(ctl)
            if kind != K_CTL:
                self.proto.released(p, d.record)
            if req is not None:
                self.send_done(p, req)
        for d in postable:
            self._post_wr(p, d)
        self.proto.pump(p)  # control slots came free: pieces (and owed credits) that waited for one

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
            self._wait(end - now)
            waited = time.monotonic() - now
            self.blocked_s += waited
            self.prof["wait_s"] += waited
            if self.pending_recvs:
                self.blocked_recv_s += waited
        out, self.ready = self.ready, []
        if out and self.cpu0 is not None:  # user: Python and numpy; system: syscalls, rxe work run in them
            t = os.times()
            self.prof["cpu_user_s"], self.prof["cpu_sys_s"] = t.user - self.cpu0.user, t.system - self.cpu0.system
            self.prof["cpu_s"] = self.prof["cpu_user_s"] + self.prof["cpu_sys_s"]
        return out

    def drain(self, timeout_s: float) -> None:
        """Drive progress until every posted write is acknowledged: a send done from a copy (traffic.rdma_eager)
        may still have pieces waiting for credits, which only this process can write. TransportError on timeout."""
        end = time.monotonic() + timeout_s
        while any(p.sq.in_flight or (p.eager is not None and p.eager.pending) for p in self.peers.values()):
            if time.monotonic() > end:
                raise TransportError(f"rank {self.rank}: writes still in flight after {timeout_s:.0f} s")
            self.progress(0.05)  # the plan is over: nothing waits for what completes now

    def _wait(self, left_s: float) -> None:
        """Block until the CQ may have a completion or ``left_s`` passes: select() on the completion channel armed
        by ibv_req_notify_cq (polled once more after arming: a completion may have come in between)."""
        if self.cq_fd is None:
            time.sleep(min(self._sleep, left_s))
            self._sleep = min(self._sleep * 2, _SLEEP_MAX_S)
            return
        if not self.armed:
            self.cq.req_notify()
            self.armed = True
            if self._poll():
                return
        if select.select([self.cq_fd], [], [], left_s)[0]:
            self.channel.get_cq_event(self.cq)
            self.cq.ack_events(1)
            self.armed = False
            self.prof["wakeups"] += 1

    # ---- statistics and teardown ----

    def conn_info(self) -> dict[int, dict[str, float]]:
        return {r: dict(p.stats) for r, p in self.peers.items()}

    def describe(self) -> dict:
        return {"transport": self.name, "device": self.dev_name, "gid_index": self.gid_index,
                "path_mtu": self.path_mtu, "active_mtu": self.active_mtu, "traffic_class": self.tc,
                "timeout": self.timeout, "retry_cnt": self.retry_cnt, "rnr_retry": self.rnr_retry,
                "min_rnr_timer": self.min_rnr_timer, "connections": len(self.peers), "cc": [],
                "protocol": "eager" if self.credits else "rendezvous", "credits": self.credits,
                "slot_bytes": self.slot_bytes, "completion_channel": self.cq_fd is not None,
                "profile": {k: round(v, 6) if isinstance(v, float) else v for k, v in self.prof.items()}}

    def close(self) -> None:
        objs = [o for p in self.peers.values()
                for o in (p.qp, p.ctl_recv, p.ctl_send, p.eager and p.eager.mr, p.eager and p.eager.bounce_mr)]
        objs += [mr for _, _, mr, _ in self.mrs] + [self.cq, self.channel, self.pd, self.ctx]
        for obj in objs:
            try:
                if obj is not None:
                    obj.close()
            except Exception:  # noqa: BLE001 - teardown goes on whatever one object says
                pass
        self.mrs.clear()
        self.peers.clear()
        self.by_qpn.clear()
        if self.boot is not None:
            self.boot.close()
            self.boot = None
