"""The packet-trimming program (testbed/kernel/trim.bpf.c) on the host kernel through BPF_PROG_TEST_RUN: the
verifier loads it and it runs on synthetic frames (no device, no namespace, no traffic). Below the threshold every
frame passes untouched; above it a UET data packet leaves as its 114-byte headers (Ethernet, IPv4 with the new
length and a valid checksum, UDP with the new length and no checksum, the UET header with FLAG_TRIMMED and every
other field as it was) in the high-priority class, while other packets (TCP, UET ACKs, UET data to another port)
pass whole.

Deterministic: the virtual queue drains at 1 kbit/s here (8 ms a byte), so over the test's few milliseconds it
drains less than a byte per frame and its content is the sum of the frames' lengths."""

from __future__ import annotations

import ctypes
import os
import socket
import struct

import pytest

from testbed.kernel import trim
from testbed.kernel.ebpf import BpfObject, compile_object, lib
from traffic import uet_packet as up

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="loads eBPF programs: run as root")

TC_ACT_OK, TC_ACT_SHOT, TC_ACT_REDIRECT = 0, 2, 7
SKB_SIZE, SKB_PRIORITY = 192, 32  # struct __sk_buff: size and the offset of priority (uapi linux/bpf.h)
THRESHOLD = 10_000
BUFFER = 20_000
TRIM_MINOR = 0x11


class _TestRunOpts(ctypes.Structure):
    """struct bpf_test_run_opts (libbpf)."""

    _fields_ = [("sz", ctypes.c_size_t), ("data_in", ctypes.c_void_p), ("data_out", ctypes.c_void_p),
                ("data_size_in", ctypes.c_uint32), ("data_size_out", ctypes.c_uint32),
                ("ctx_in", ctypes.c_void_p), ("ctx_out", ctypes.c_void_p), ("ctx_size_in", ctypes.c_uint32),
                ("ctx_size_out", ctypes.c_uint32), ("retval", ctypes.c_uint32), ("repeat", ctypes.c_int),
                ("duration", ctypes.c_uint32), ("flags", ctypes.c_uint32), ("cpu", ctypes.c_uint32),
                ("batch_size", ctypes.c_uint32)]


def _run(fd: int, frame: bytes) -> tuple[int, bytes, int]:
    """One BPF_PROG_TEST_RUN: the verdict, the frame it left, and skb->priority after it."""
    f = lib().bpf_prog_test_run_opts
    f.argtypes, f.restype = [ctypes.c_int, ctypes.POINTER(_TestRunOpts)], ctypes.c_int
    data_in = ctypes.create_string_buffer(frame, len(frame))
    data_out = ctypes.create_string_buffer(4096)
    ctx_in = ctypes.create_string_buffer(SKB_SIZE)
    ctx_out = ctypes.create_string_buffer(SKB_SIZE)
    o = _TestRunOpts(sz=ctypes.sizeof(_TestRunOpts), data_in=ctypes.cast(data_in, ctypes.c_void_p),
                     data_out=ctypes.cast(data_out, ctypes.c_void_p), data_size_in=len(frame), data_size_out=4096,
                     ctx_in=ctypes.cast(ctx_in, ctypes.c_void_p), ctx_size_in=SKB_SIZE,
                     ctx_out=ctypes.cast(ctx_out, ctypes.c_void_p), ctx_size_out=SKB_SIZE)
    assert f(fd, ctypes.byref(o)) == 0, os.strerror(ctypes.get_errno())
    return o.retval, data_out.raw[:o.data_size_out], struct.unpack_from("<I", ctx_out, SKB_PRIORITY)[0]


def _ip_checksum(header: bytes) -> int:
    s = sum(struct.unpack("!10H", header))
    s = (s & 0xFFFF) + (s >> 16)
    return ~((s & 0xFFFF) + (s >> 16)) & 0xFFFF


def frame(payload: int = 1328, typ: int = up.TYPE_DATA, dport: int = up.UET_UDP_PORT, proto: int = 17,
          psn: int = 7) -> tuple[bytes, up.Header]:
    """Ethernet + IPv4 + UDP (source port 50000: an entropy value) + UET header + payload."""
    h = up.Header(typ, 0, 2, 0, psn, msg_id=3, payload_bytes=payload, tag=(5 << 32) | 9, msg_bytes=10_000,
                  offset=1328, ts_ns=123456789)
    body = h.pack() + bytes(range(256)) * (payload // 256) + bytes(payload % 256)
    udp = struct.pack("!HHHH", 50000, dport, 8 + len(body), 0x1234)
    ip = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, 2, 20 + len(udp) + len(body), 1, 0x4000, 64, proto, 0,
                               socket.inet_aton("10.0.1.1"), socket.inet_aton("10.0.9.1")))
    struct.pack_into("!H", ip, 10, _ip_checksum(bytes(ip)))
    return b"\x02" * 6 + b"\x04" * 6 + b"\x08\x00" + bytes(ip) + udp + body, h


@pytest.fixture
def prog():
    obj = BpfObject(compile_object(trim.SOURCE))
    t = trim.Trimmer(obj)
    t.set_rate(0.001, THRESHOLD, BUFFER, TRIM_MINOR)
    yield t, obj.program_fd(trim.PROGRAM)
    obj.close()


def test_below_the_threshold_everything_passes_whole_and_fills_the_virtual_queue(prog):
    t, fd = prog
    f, _ = frame()
    for _ in range(THRESHOLD // len(f)):
        rc, out, priority = _run(fd, f)
        assert rc == TC_ACT_OK and out == f and priority == 0
    st = t.stats()
    assert st["trimmed_packets"] == 0 and st["uet_data_packets"] == st["packets"] == THRESHOLD // len(f)
    assert st["vq_peak_bytes"] == len(f) * (THRESHOLD // len(f))


def test_the_virtual_queue_is_capped_at_the_port_buffer_as_the_real_queue_drops_what_does_not_fit(prog):
    t, fd = prog
    f, _ = frame(typ=up.TYPE_ACK)  # never trimmed: only the buffer limits what the queue holds
    for _ in range(2 * BUFFER // len(f)):
        assert _run(fd, f)[0] == TC_ACT_OK
    assert BUFFER - len(f) < t.stats()["vq_peak_bytes"] <= BUFFER


def test_above_the_threshold_a_uet_data_packet_leaves_as_its_headers_in_the_priority_class(prog):
    t, fd = prog
    f, h = frame()
    while t.stats()["vq_peak_bytes"] < THRESHOLD:
        _run(fd, f)
    rc, out, priority = _run(fd, f)
    # redirected to the port's own egress: enqueued anew, the qdisc measures its new length
    assert rc == TC_ACT_REDIRECT and len(out) == 14 + 20 + 8 + up.HEADER_BYTES == 114
    assert out[:14] == f[:14]
    ip = out[14:34]
    assert struct.unpack("!H", ip[2:4])[0] == 100 and _ip_checksum(ip) == 0 and ip[:2] == f[14:16]
    assert struct.unpack("!HHHH", out[34:42]) == (50000, up.UET_UDP_PORT, 80, 0)
    got = up.unpack(out[42:])
    assert got == h._replace(flags=up.FLAG_TRIMMED)  # every field kept: the receiver NACKs this PSN
    assert priority == (1 << 16) | TRIM_MINOR
    st = t.stats()
    assert st["trimmed_packets"] == 1 and st["trimmed_bytes_cut"] == len(f) - 114
    peak = st["vq_peak_bytes"]
    rc, again, priority = _run(fd, out)  # its second pass: through untouched, counted with its trimmed length
    assert rc == TC_ACT_OK and again == out and t.stats()["trimmed_packets"] == 1
    assert t.stats()["vq_peak_bytes"] == peak + 114


@pytest.mark.parametrize("kind", ["ack", "other_port", "past_the_span", "tcp", "header_only"])
def test_above_the_threshold_what_is_not_a_trimmable_uet_data_packet_passes_whole(prog, kind):
    t, fd = prog
    f, _ = frame()
    while t.stats()["vq_peak_bytes"] < THRESHOLD:
        _run(fd, f)
    other, _ = {"ack": lambda: frame(0, typ=up.TYPE_ACK), "other_port": lambda: frame(dport=4791),
                "past_the_span": lambda: frame(dport=up.UET_UDP_PORT + up.PORT_SPAN),
                "tcp": lambda: frame(proto=6), "header_only": lambda: frame(0)}[kind]()
    rc, out, priority = _run(fd, other)
    assert rc == TC_ACT_OK and out == other and priority == 0
    st = t.stats()
    assert st["trimmed_packets"] == 0
    assert st["too_short_to_trim"] == (1 if kind == "header_only" else 0)


def test_a_second_rank_on_a_host_listening_on_the_next_port_is_trimmed_too(prog):
    t, fd = prog
    f, _ = frame(dport=up.UET_UDP_PORT + up.PORT_SPAN - 1)
    while t.stats()["vq_peak_bytes"] < THRESHOLD:
        _run(fd, f)
    rc, out, _ = _run(fd, f)
    assert rc == TC_ACT_REDIRECT and len(out) == 114


def test_bad_settings_are_refused_before_anything_is_loaded():
    with pytest.raises(ValueError):
        trim.ps_per_byte(0)
    with pytest.raises(ValueError):
        trim.install(None, 1, 100.0, 0, BUFFER)
    with pytest.raises(ValueError):
        trim.install(None, 1, 100.0, THRESHOLD, THRESHOLD - 1)
