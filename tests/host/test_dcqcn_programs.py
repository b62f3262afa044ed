"""DCQCN's eBPF programs (testbed/kernel/dcqcn.bpf.c) against the reference model (traffic/dcqcn.py), on the host
kernel through BPF_PROG_TEST_RUN: the kernel's verifier loads both programs and runs them on synthetic RoCEv2 frames
(no device, no namespace, no traffic). What the real kernel computes is compared with the model replayed at the
times the programs themselves recorded, event by event, and the CNP the notification point writes is compared
byte by byte with the RoCEv2 CNP format (IBTA Annex A17.9.3: BTH opcode 0x81, P_Key 0xffff, BECN set, 16 reserved
bytes, ICRC).

Deterministic: the programs read the kernel clock, but every comparison uses the time the program stored in the
QP's state, so the only timing involved is how many rate-increase events an idle gap owes (up to 1250 for 0.5 s
at T = 400 us), which both sides compute from the same numbers. No repeats needed: a mismatch is a wrong program."""

from __future__ import annotations

import ctypes
import os
import random
import socket
import struct
import time
from pathlib import Path

import pytest

from testbed.kernel.ebpf import BpfObject, compile_object, lib
from traffic.dcqcn import Params, ReactionPoint


pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="loads eBPF programs: run as root")

BPF_SOURCE = Path(__file__).resolve().parents[2] / "testbed" / "kernel" / "dcqcn.bpf.c"
TC_ACT_OK, TC_ACT_SHOT = 0, 2
CNP_MARK = 0xDC0C
SKB_SIZE, SKB_MARK, SKB_TSTAMP = 192, 8, 152  # struct __sk_buff: size and offsets (uapi linux/bpf.h)
STATS = ("ce_seen", "cnp_sent", "cnp_suppressed", "cnp_received", "cnp_ignored", "rate_cuts", "paced_packets",
         "unknown_qp", "cnp_failed")
ME, PEER = "10.0.0.1", "10.0.0.2"
LOCAL_QPN, REMOTE_QPN = 17, 18


class _TestRunOpts(ctypes.Structure):
    """struct bpf_test_run_opts (libbpf)."""

    _fields_ = [("sz", ctypes.c_size_t), ("data_in", ctypes.c_void_p), ("data_out", ctypes.c_void_p),
                ("data_size_in", ctypes.c_uint32), ("data_size_out", ctypes.c_uint32),
                ("ctx_in", ctypes.c_void_p), ("ctx_out", ctypes.c_void_p), ("ctx_size_in", ctypes.c_uint32),
                ("ctx_size_out", ctypes.c_uint32), ("retval", ctypes.c_uint32), ("repeat", ctypes.c_int),
                ("duration", ctypes.c_uint32), ("flags", ctypes.c_uint32), ("cpu", ctypes.c_uint32),
                ("batch_size", ctypes.c_uint32)]


class _Config(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint32) for n in ("line", "minr", "ai", "hai", "g", "F")] + \
               [(n, ctypes.c_uint64) for n in ("K", "T", "B", "N", "cut")] + \
               [("dscp", ctypes.c_uint32), ("ifindex", ctypes.c_uint32)]


class _Peer(ctypes.Structure):
    _fields_ = [("rqpn", ctypes.c_uint32), ("peer_ip", ctypes.c_uint32)]


class _Key(ctypes.Structure):
    _fields_ = [("peer_ip", ctypes.c_uint32), ("rqpn", ctypes.c_uint32)]


class _State(ctypes.Structure):
    _fields_ = [("lock", ctypes.c_uint32)] + \
               [(n, ctypes.c_uint32) for n in ("started", "rc", "rt", "alpha", "t", "bc", "has_cut")] + \
               [(n, ctypes.c_uint64) for n in ("now", "a0", "i0", "last_cut", "next_tx", "bytes", "cnp_rx",
                                               "cnp_ign", "cuts", "dropped")]


def _run(fd: int, frame: bytes, mark: int = 0) -> tuple[int, bytes, int]:
    """One BPF_PROG_TEST_RUN: the program's verdict, the frame it left, and skb->tstamp after it."""
    f = lib().bpf_prog_test_run_opts
    f.argtypes, f.restype = [ctypes.c_int, ctypes.POINTER(_TestRunOpts)], ctypes.c_int
    data_in = ctypes.create_string_buffer(frame, len(frame))
    data_out = ctypes.create_string_buffer(4096)
    ctx_in = ctypes.create_string_buffer(SKB_SIZE)
    ctx_out = ctypes.create_string_buffer(SKB_SIZE)
    struct.pack_into("<I", ctx_in, SKB_MARK, mark)
    o = _TestRunOpts(sz=ctypes.sizeof(_TestRunOpts), data_in=ctypes.cast(data_in, ctypes.c_void_p),
                     data_out=ctypes.cast(data_out, ctypes.c_void_p), data_size_in=len(frame), data_size_out=4096,
                     ctx_in=ctypes.cast(ctx_in, ctypes.c_void_p), ctx_size_in=SKB_SIZE,
                     ctx_out=ctypes.cast(ctx_out, ctypes.c_void_p), ctx_size_out=SKB_SIZE)
    assert f(fd, ctypes.byref(o)) == 0, os.strerror(ctypes.get_errno())
    return o.retval, data_out.raw[:o.data_size_out], struct.unpack_from("<Q", ctx_out, SKB_TSTAMP)[0]


def _ip_checksum(header: bytes) -> int:
    s = sum(struct.unpack("!10H", header))
    s = (s & 0xFFFF) + (s >> 16)
    return ~((s & 0xFFFF) + (s >> 16)) & 0xFFFF


def roce(src: str, dst: str, qpn: int, opcode: int = 0x04, tos: int = 0, payload: int = 1024) -> bytes:
    """A RoCEv2 frame as rxe sends it: Ethernet, IPv4, UDP to 4791, BTH for `qpn`, payload, ICRC (zero)."""
    bth = struct.pack("!BBHB3sB3s", opcode, 0, 0xFFFF, 0, qpn.to_bytes(3, "big"), 0, (7).to_bytes(3, "big"))
    body = bth + bytes(payload) + bytes(4)
    udp = struct.pack("!HHHH", 49152 + qpn, 4791, 8 + len(body), 0)
    ip = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, tos, 20 + len(udp) + len(body), 1, 0x4000, 64, 17, 0,
                               socket.inet_aton(src), socket.inet_aton(dst)))
    struct.pack_into("!H", ip, 10, _ip_checksum(bytes(ip)))
    return b"\x02" * 6 + b"\x04" * 6 + b"\x08\x00" + bytes(ip) + udp + body


def _ip32(a: str) -> int:
    return ctypes.c_uint32.from_buffer_copy(socket.inet_aton(a)).value


PARAMS = Params(line_rate_kbps=10_000, min_rate_kbps=100, ai_rate_kbps=200, hai_rate_kbps=1000, g=64,
                alpha_timer_ns=300_000, increase_timer_ns=400_000, byte_reset=20_000, threshold=5,
                cnp_interval_ns=500_000, cut_interval_ns=500_000)


class Loaded:
    """dcqcn.bpf.c loaded through the verifier, with one QP mapped (local 17 <-> remote 18 at PEER)."""

    def __init__(self, p: Params = PARAMS):
        self.obj = BpfObject(compile_object(BPF_SOURCE))
        self.ingress = self.obj.program_fd("dcqcn_ingress")
        self.egress = self.obj.program_fd("dcqcn_egress")
        self.obj.update("config", ctypes.c_uint32(0),
                        _Config(p.line_rate_kbps, p.min_rate_kbps, p.ai_rate_kbps, p.hai_rate_kbps, p.g,
                                p.threshold, p.alpha_timer_ns, p.increase_timer_ns, p.byte_reset, p.cnp_interval_ns,
                                p.cut_interval_ns, 26, 0))
        self.obj.update("qpmap", ctypes.c_uint32(LOCAL_QPN), _Peer(REMOTE_QPN, _ip32(PEER)))
        self.key = _Key(_ip32(PEER), REMOTE_QPN)
        self.obj.update("rp", self.key, _State(0, 0, p.line_rate_kbps, p.line_rate_kbps, 1 << 20))

    def state(self) -> _State:
        s = _State()
        assert self.obj.lookup("rp", self.key, s)
        return s

    def stats(self) -> dict[str, int]:
        out = {}
        for i, name in enumerate(STATS):
            v = ctypes.c_uint64()
            assert self.obj.lookup("stats", ctypes.c_uint32(i), v)
            out[name] = v.value
        return out


@pytest.fixture
def loaded():
    prog = Loaded()
    yield prog
    prog.obj.close()


def test_rp_state_equals_the_model_event_by_event(loaded):
    """3000 mixed events (data packets of 64-2048 bytes, 5 % CNPs, idle gaps up to 0.5 s): after each one the
    kernel's rp entry (Rc, Rt, alpha, both counts, cuts, ignored CNPs, next departure, dropped events) and the
    departure time written into skb->tstamp equal the model replayed at the time the program recorded."""
    rc, out, tstamp = _run(loaded.egress, roce(ME, PEER, REMOTE_QPN))
    s = loaded.state()
    model = ReactionPoint(PARAMS, now_ns=s.now)
    assert rc == TC_ACT_OK and tstamp == model.departure(s.now, len(out)) == s.now
    assert s.next_tx == model.next_tx_ns
    rng = random.Random(1)
    for i in range(3000):
        if rng.random() < 0.05:
            rc, _, _ = _run(loaded.ingress, roce(PEER, ME, LOCAL_QPN, opcode=0x81, payload=16))
            assert rc == TC_ACT_SHOT  # rxe never sees a CNP
            s = loaded.state()
            model.on_cnp(s.now)
        else:
            rc, out, tstamp = _run(loaded.egress, roce(ME, PEER, REMOTE_QPN, payload=rng.choice([64, 512, 1024, 2048])))
            s = loaded.state()
            assert rc == TC_ACT_OK and tstamp == model.departure(s.now, len(out)), i
        got = (s.rc, s.rt, s.alpha, s.t, s.bc, s.cuts, s.cnp_ign, s.cnp_rx, s.next_tx, s.bytes, s.dropped)
        want = (model.rc_kbps, model.rt_kbps, model.alpha, model.t_count, model.bc_count, model.rate_cuts,
                model.cnp_ignored, model.cnp_received, model.next_tx_ns, model.bytes_since, model.dropped_events)
        assert got == want, (i, got, want)
        if rng.random() < 0.01:
            time.sleep(rng.choice([0.002, 0.05, 0.5]))
    assert model.rate_cuts > 10 and model.cnp_ignored > 0 and model.dropped_events == 0
    st = loaded.stats()
    assert st["cnp_received"] == model.cnp_received and st["rate_cuts"] == model.rate_cuts
    assert st["cnp_ignored"] == model.cnp_ignored and st["paced_packets"] == 3001 - model.cnp_received


def test_data_packets_leave_ect0_with_a_valid_checksum_and_unmapped_qps_unpaced(loaded):
    rc, out, tstamp = _run(loaded.egress, roce(ME, PEER, REMOTE_QPN))
    assert rc == TC_ACT_OK and out[15] & 3 == 2 and _ip_checksum(out[14:34]) == 0 and tstamp > 0
    other = roce(ME, PEER, 99)
    rc, out, tstamp = _run(loaded.egress, other)
    # no rate state: not paced, but ECN-capable all the same (a RED queue drops Not-ECT packets above its min)
    assert rc == TC_ACT_OK and tstamp == 0 and out[15] & 3 == 2 and _ip_checksum(out[14:34]) == 0
    assert out[:15] == other[:15] and out[16:24] == other[16:24] and out[26:] == other[26:]


def test_a_ce_packet_passes_unchanged_and_a_second_inside_the_cnp_interval_is_suppressed(loaded):
    frame = roce(PEER, ME, LOCAL_QPN, tos=3)
    rc1, out1, _ = _run(loaded.ingress, frame)
    rc2, out2, _ = _run(loaded.ingress, frame)
    st = loaded.stats()
    assert rc1 == rc2 == TC_ACT_OK and out1 == out2 == frame  # rxe gets the packet as it came
    # the clone to ifindex 0 fails here (no device under BPF_PROG_TEST_RUN): counted, the original still passes
    assert (st["ce_seen"], st["cnp_suppressed"], st["cnp_failed"]) == (2, 1, 1)
    rc, out, _ = _run(loaded.ingress, roce(PEER, ME, 12345, tos=3))  # a QP nobody mapped
    assert rc == TC_ACT_OK and loaded.stats()["unknown_qp"] == 1
    rc, _, _ = _run(loaded.ingress, roce(PEER, ME, 12345, opcode=0x81, payload=16))
    assert rc == TC_ACT_SHOT and loaded.stats()["unknown_qp"] == 2


def test_the_clone_is_rewritten_into_a_rocev2_cnp_for_the_sending_qp(loaded):
    """The CE packet's clone, seen at egress with CNP_MARK, becomes a 74-byte CNP: addresses swapped, DSCP 26
    without ECN, UDP 4791, BTH 81 00 ff ff 40 <the sender's QPN> 00 000000 (opcode CNP, P_Key default, BECN; as the
    Annex A17.9.3 example of a CNP), 16 reserved zero bytes, and the 4-byte ICRC (left zero: see docs/dcqcn.md)."""
    rc, cnp, tstamp = _run(loaded.egress, roce(PEER, ME, LOCAL_QPN, tos=3), mark=CNP_MARK)
    assert rc == TC_ACT_OK and len(cnp) == 74 and tstamp == 0
    assert cnp[0:6] == b"\x04" * 6 and cnp[6:12] == b"\x02" * 6 and cnp[12:14] == b"\x08\x00"
    ip = cnp[14:34]
    assert ip[0] == 0x45 and ip[1] == 26 << 2 and struct.unpack("!H", ip[2:4])[0] == 60 and ip[9] == 17
    assert ip[12:16] == socket.inet_aton(ME) and ip[16:20] == socket.inet_aton(PEER) and _ip_checksum(ip) == 0
    assert struct.unpack("!HHH", cnp[36:42]) == (4791, 40, 0)
    assert cnp[42:54] == bytes([0x81, 0x00, 0xFF, 0xFF, 0x40]) + REMOTE_QPN.to_bytes(3, "big") + bytes(4)
    assert cnp[54:74] == bytes(20)
    assert loaded.stats()["cnp_sent"] == 1
