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
* Data movement, ``protocol``: ``eager`` (the default; traffic.rdma_eager, traffic.rdma_credits): pieces written
  at once into a receive ring the peer registered for us while we hold credits, copied out by the receiver.
  ``rendezvous`` (``credits=0``, traffic.rdma_rendezvous): a clear-to-send per message, one write into the
  destination. ``grant`` (traffic.rdma_grant): destinations granted ahead, each message one chain of writes, the
  last with an immediate, nothing copied; ``lookahead`` K > 0 grants the agent's next K ops' receives into staging
  buffers (``post_ahead``, traffic.rdma_staging) so several messages per peer are in flight.
* Completions: one CQ (traffic.rdma_cq: polled in batches; with nothing to do, select() on its completion channel,
  so agents sharing a CPU with the rxe kernel threads do not spin it away; ``spin_us``: poll that long first).
  Only the requests that need one ask for a completion (traffic.rdma_sendq: a message's last write, control
  messages, one in ``signal_every``); the requests a protocol queues together go to the device as one chain (one
  ibv_post_send).
* Memory: the agent's numpy buffers are registered once and reused (traffic.rdma_regcache); the receive rings and
  control slots are registered at connection setup.
* ``describe()["profile"]``: where the time went (waiting, copying, waiting for clear-to-sends or credits, CPU
  seconds of the process from the first post to the last completion), for benchmarks/rdma_vs_ib_write_bw.py.
"""

from __future__ import annotations

import ipaddress
import os
import time
from typing import Any

import numpy as np

from traffic import rdma_connect
from traffic import rdma_options as options
from traffic.rdma_cq import CompletionQueue
from traffic.rdma_credits import HDR_BYTES
from traffic.rdma_eager import Eager
from traffic.rdma_grant import GrantProto
from traffic.rdma_regcache import RegistrationCache
from traffic.rdma_rendezvous import CTS, Rendezvous
from traffic.rdma_sendq import Posted, SendQueue
from traffic.rxe import (IB_MTU, IB_MTU_ENUM, RECOVERY_COUNTERS, check_path_mtu, find_device,
                         ipv4_gid, make_qp, qp_to_rts, rxe_mtu_for_netdev, verbs, wc_status)
from traffic.tcp import TcpTransport
from traffic.transport import Request, Transport, TransportError

#: RdmaTransport, and the device-side names (traffic.rxe) that callers outside traffic (testbed's collective
#: workload, benchmarks/rdma_vs_ib_write_bw.py, tests) import from this module
__all__ = ["RdmaTransport", "INFO_KEYS", "CTS", "IB_MTU", "IB_MTU_ENUM", "RECOVERY_COUNTERS", "check_path_mtu",
           "find_device", "ipv4_gid", "rxe_mtu_for_netdev"]

CTL_SLOT = HDR_BYTES  # a control slot holds a clear-to-send, a credit message or a piece's header
K_RECV, K_CTL = 1, 2  # work-request kinds (the top byte of wr_id); the protocols' writes are 3, 4 and 5
#: the per-connection statistics conn_info() reports (tcp_info.csv columns the agent fills; others read 0)
INFO_KEYS = ("writes", "bytes_written", "cts_sent", "cts_recv", "recv_done", "pieces", "credit_msgs_sent",
             "credit_msgs_recv", "held_copied_out", "grant_msgs_sent", "grant_msgs_recv", "grants_sent",
             "grants_recv", "grants_ahead", "staged_copied", "max_grants_open", "max_msgs_in_flight")
PROFILE_KEYS = ("wait_s", "copy_s", "cts_wait_s", "credit_wait_s", "cpu_s", "cpu_user_s", "cpu_sys_s", "wakeups",
                "completions", "polls_busy", "messages_sent", "messages_received")


class _Peer:
    __slots__ = ("rank", "qp", "sock", "ctl_recv", "ctl_send", "free_ctl", "sq", "stats", "eager", "recv_wrs")

    def __init__(self, rank: int):
        self.rank = rank
        self.qp = self.sock = self.ctl_recv = self.ctl_send = None
        self.free_ctl: list[int] = []  # control slots (clear-to-sends, credit messages, piece headers) free
        self.sq: SendQueue | None = None
        self.stats = dict.fromkeys(INFO_KEYS, 0)
        self.eager = None  # traffic.rdma_eager.EagerPeer
        self.recv_wrs: list = []  # the receive work request of each control slot, built once, posted again


class RdmaTransport(Transport):
    name = "rdma"
    CTL_SLOT = CTL_SLOT
    CTL_RESERVE = 8  # control slots pieces leave free for credit messages

    def __init__(self, rank: int, ip: str = "0.0.0.0", device: str | None = None, dscp: int = 0,
                 traffic_class: int | None = None, mtu: int = 0, timeout: int = 16, retry_cnt: int = 7,
                 rnr_retry: int = 7, min_rnr_timer: int = 12, send_depth: int = 128, recv_depth: int = 0,
                 credits: int | None = None, slot_bytes: int = 128 * 1024, signal_every: int = 16, protocol: str = "",
                 piece_bytes: int = 256 * 1024, spin_us: int = 0, psn_seed: int | None = None,
                 devices: dict | None = None, lookahead: int = 0, **_ignored):
        super().__init__(rank)
        if devices and str(rank) in devices:  # the job names each rank's device: open only that one
            device = devices[str(rank)]
        protocol, recv_depth = options.check(dscp, traffic_class, mtu, timeout, retry_cnt, rnr_retry, min_rnr_timer,
                                             signal_every, credits, slot_bytes, protocol, piece_bytes, send_depth,
                                             recv_depth, self.CTL_RESERVE, spin_us, lookahead)
        self.ip, self.device, self.want_mtu = ip, device, int(mtu)
        self.tc = options.traffic_class_of(dscp, traffic_class)
        self.timeout, self.retry_cnt, self.rnr_retry, self.min_rnr_timer = map(int, (timeout, retry_cnt, rnr_retry,
                                                                                      min_rnr_timer))
        self.send_depth, self.recv_depth, self.protocol = int(send_depth), recv_depth, protocol
        self.credits = None if credits is None else int(credits)  # None: traffic.rdma_credits.auto_slots per peer
        self.slot_bytes, self.signal_every = int(slot_bytes), int(signal_every)
        self.proto = (Eager(self, self.credits, self.slot_bytes) if protocol == "eager" else Rendezvous(self)
                      if protocol == "rendezvous" else GrantProto(self, int(piece_bytes), int(lookahead)))
        self.lookahead = int(lookahead)  # the agent announces its next ops' receives (post_ahead) this far ahead
        self.ctl_slot = getattr(self.proto, "ctl_bytes", CTL_SLOT)  # bytes of one control message's slot
        self._flush = getattr(self.proto, "flush", None)  # queued control messages, sent before progress waits
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
        self.e = self.v["e"]
        self.cq = CompletionQueue(self.v, self.ctx, int(spin_us) / 1e6)
        self.access = self.v["e"].IBV_ACCESS_LOCAL_WRITE | self.v["e"].IBV_ACCESS_REMOTE_WRITE
        self.rng = np.random.default_rng(psn_seed if psn_seed is not None else None)
        self.peers: dict[int, _Peer] = {}
        self.by_qpn: dict[int, _Peer] = {}
        self.regs = RegistrationCache(lambda length, start: self.mr(length, address=start))
        self.boot = None  # the TCP bootstrap (traffic.tcp.TcpTransport): listen/connect, then liveness
        self.next_wid = 1
        self.ready: list[Request] = []
        self.blocked_recv_s = 0.0
        self.pending_recvs = 0
        self.bytes_out = self.bytes_in = 0
        self.prof = dict.fromkeys(PROFILE_KEYS, 0)
        self.cpu0: os.times_result | None = None  # the process's CPU times at the first post

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
        getattr(self.proto, "fit", lambda n: None)(len(peers))  # eager: its ring's slots for this many peers
        my_mtu = IB_MTU_ENUM[self.path_mtu]
        gid_bytes = ipaddress.IPv6Address(str(self.gid)).packed
        mine = {}
        for rank in sorted(peers):
            p = _Peer(rank)
            p.qp = make_qp(self.v, self.pd, self.cq.cq, self.access, self.send_depth, self.recv_depth, max_send_sge=2)
            p.ctl_recv = self.mr(self.recv_depth * self.ctl_slot)
            p.ctl_send = self.mr(self.send_depth * self.ctl_slot)
            p.free_ctl = list(range(self.send_depth))
            p.sq = SendQueue(self.send_depth, self.signal_every)
            ring = self.proto.setup(p)
            for i in range(self.recv_depth):
                self._post_ctl_recv(p, i)
            p.sock = self.boot.conns[rank].sock
            self.peers[rank] = p
            self.by_qpn[p.qp.qp_num] = p
            mine[rank] = rdma_connect.QpInfo(p.qp.qp_num, int(self.rng.integers(0, 1 << 24)), gid_bytes, my_mtu,
                                             *ring, options.PROTOCOLS[self.protocol])
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
        if i == len(p.recv_wrs):
            v = self.v
            sge = v["SGE"](p.ctl_recv.buf + i * self.ctl_slot, self.ctl_slot, p.ctl_recv.lkey)
            p.recv_wrs.append(v["RecvWR"](wr_id=(K_RECV << 56) | i, num_sge=1, sg=[sge]))
        p.qp.post_recv(p.recv_wrs[i])

    def push(self, p: _Peer, record: tuple, must_signal: bool) -> None:
        """Queue a send-queue entry; ``record``: (kind, the send it completes or None, its control slot or -1,
        what the protocol builds the work request from)."""
        self.push_chain(p, [(record, must_signal)])

    def push_chain(self, p: _Peer, records: list[tuple[tuple, bool]]) -> None:
        """Queue several entries ((record, must_signal), in order); those the send queue has room for are posted
        as one chain of work requests (one ibv_post_send)."""
        admitted = []
        for record, must_signal in records:
            wid = self.next_wid
            self.next_wid = wid + 1 if wid < 0xFFFFFFFF else 1
            admitted += p.sq.push(Posted(wid, record, must_signal))
        if admitted:
            self._post(p, admitted)

    def _post(self, p: _Peer, entries: list[Posted]) -> None:
        v = self.v
        wrs = []
        for e in entries:
            flags = v["e"].IBV_SEND_SIGNALED if e.signaled else 0
            wr_id = (e.record[0] << 56) | (p.rank << 32) | e.wid
            if e.record[0] == K_CTL:
                _, _, i, n = e.record
                sge = v["SGE"](p.ctl_send.buf + i * self.ctl_slot, n, p.ctl_send.lkey)
                wr = v["SendWR"](wr_id=wr_id, opcode=v["e"].IBV_WR_SEND, num_sge=1, sg=[sge], send_flags=flags)
            else:
                wr = self.proto.build_wr(p, e.record, wr_id, flags)
            if wrs:
                wrs[-1].next_wr = wr  # the chain holds pointers: every object lives in wrs until posted
            wrs.append(wr)
        p.qp.post_send(wrs[0])

    def send_ctl(self, p: _Peer, payload: bytes) -> bool:
        """SEND ``payload`` (a clear-to-send or a credit message) from a control slot; False if none is free."""
        if not p.free_ctl:
            return False
        i = p.free_ctl.pop()
        p.ctl_send.write(payload, len(payload), i * self.ctl_slot)
        self.push(p, (K_CTL, None, i, len(payload)), True)
        return True

    def region(self, buf: memoryview):
        """(MR, address) of a buffer: the whole underlying numpy array is registered once and cached
        (traffic.rdma_regcache)."""
        try:
            return self.regs.region(buf)
        except Exception as exc:  # noqa: BLE001 - pyverbs raises its own error types
            raise TransportError(f"rank {self.rank}: registering {len(buf)} bytes: {exc}") from None

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

    def post_ahead(self, peer: int, tag: int, nbytes: int) -> None:
        """A receive of ``nbytes`` from ``peer`` on ``tag`` that a later op will post (``lookahead`` > 0)."""
        self.proto.post_ahead(peer, tag, nbytes)

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
        return self.cq.poll(self._completion)

    def _completion(self, wc) -> None:
        e = self.e
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
        if postable:
            self._post(p, postable)
        self.proto.pump(p)  # control slots came free: pieces (and owed credits) that waited for one

    def progress(self, timeout_s: float) -> list[Request]:
        end = time.monotonic() + max(0.0, timeout_s)
        while True:
            if self._flush is not None:
                self._flush()  # grants queued by this round's receives
            self._poll()
            if self.ready:
                break
            now = time.monotonic()
            if now >= end:
                break
            self.cq.wait(end - now, self._completion)
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
        busy = getattr(self.proto, "busy", lambda p: False)  # grant: copied sends still waiting for their grant
        while any(p.sq.in_flight or (p.eager is not None and p.eager.pending) or busy(p) for p in self.peers.values()):
            if time.monotonic() > end:
                raise TransportError(f"rank {self.rank}: writes still in flight after {timeout_s:.0f} s")
            self.progress(0.05)  # the plan is over: nothing waits for what completes now

    # ---- statistics and teardown ----

    def conn_info(self) -> dict[int, dict[str, float]]:
        return {r: dict(p.stats) for r, p in self.peers.items()}

    def describe(self) -> dict:
        self.prof["wakeups"], self.prof["polls_busy"] = self.cq.wakeups, self.cq.busy_polls
        self.prof["completions"] = self.cq.completions
        return {"transport": self.name, "device": self.dev_name, "gid_index": self.gid_index,
                "path_mtu": self.path_mtu, "active_mtu": self.active_mtu, "traffic_class": self.tc,
                "timeout": self.timeout, "retry_cnt": self.retry_cnt, "rnr_retry": self.rnr_retry,
                "min_rnr_timer": self.min_rnr_timer, "connections": len(self.peers), "cc": [],
                "protocol": self.protocol, "lookahead": self.lookahead, "credits": self.credits, "slot_bytes":
                self.slot_bytes, "spin_us": round(self.cq.spin_s * 1e6), "completion_channel": self.cq.fd is not None,
                "profile": {k: round(v, 6) if isinstance(v, float) else v for k, v in self.prof.items()}}

    def close(self) -> None:
        objs = [o for p in self.peers.values()
                for o in (p.qp, p.ctl_recv, p.ctl_send, p.eager and p.eager.mr, p.eager and p.eager.bounce_mr)]
        objs += getattr(self.proto, "objects", list)() + self.regs.regions() + self.cq.objects() + [self.pd, self.ctx]
        for obj in objs:
            try:
                if obj is not None:
                    obj.close()
            except Exception:  # noqa: BLE001 - teardown goes on whatever one object says
                pass
        self.regs.clear()
        self.peers.clear()
        self.by_qpn.clear()
        if self.boot is not None:
            self.boot.close()
            self.boot = None
