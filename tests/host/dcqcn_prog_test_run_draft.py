"""Ad-hoc check (not committed): run dcqcn.bpf.c's programs on synthetic packets with BPF_PROG_TEST_RUN (no device,
no namespace, no traffic) and compare the rp state with traffic.dcqcn replayed at the same times."""
import ctypes, random, socket, struct, sys, time
from pathlib import Path
from testbed.kernel.ebpf import BpfObject, compile_object, lib
from traffic.dcqcn import Params, ReactionPoint

L = lib()
class Opts(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("data_in", ctypes.c_void_p), ("data_out", ctypes.c_void_p),
                ("data_size_in", ctypes.c_uint32), ("data_size_out", ctypes.c_uint32), ("ctx_in", ctypes.c_void_p),
                ("ctx_out", ctypes.c_void_p), ("ctx_size_in", ctypes.c_uint32), ("ctx_size_out", ctypes.c_uint32),
                ("retval", ctypes.c_uint32), ("repeat", ctypes.c_int), ("duration", ctypes.c_uint32),
                ("flags", ctypes.c_uint32), ("cpu", ctypes.c_uint32), ("batch_size", ctypes.c_uint32)]
L.bpf_prog_test_run_opts.argtypes = [ctypes.c_int, ctypes.POINTER(Opts)]
L.bpf_prog_test_run_opts.restype = ctypes.c_int

def run(fd, pkt, mark=0):
    inb = ctypes.create_string_buffer(pkt, len(pkt)); out = ctypes.create_string_buffer(4096)
    ctx = ctypes.create_string_buffer(192); struct.pack_into("<I", ctx, 8, mark)
    o = Opts(sz=ctypes.sizeof(Opts), data_in=ctypes.cast(inb, ctypes.c_void_p), data_out=ctypes.cast(out, ctypes.c_void_p),
             data_size_in=len(pkt), data_size_out=4096, ctx_in=ctypes.cast(ctx, ctypes.c_void_p), ctx_size_in=192)
    r = L.bpf_prog_test_run_opts(fd, ctypes.byref(o))
    assert r == 0, (r, ctypes.get_errno())
    return o.retval, out.raw[:o.data_size_out]

def csum(b):
    s = sum(struct.unpack("!10H", b)); s = (s & 0xffff) + (s >> 16); s = (s & 0xffff) + (s >> 16); return ~s & 0xffff

def roce(src, dst, qpn, opcode=0x04, tos=0, payload=1024):
    bth = struct.pack("!BBHB3sB3s", opcode, 0, 0xffff, 0, qpn.to_bytes(3, "big"), 0, (7).to_bytes(3, "big"))
    body = bth + bytes(payload) + bytes(4)
    udp = struct.pack("!HHHH", 49152 + qpn, 4791, 8 + len(body), 0)
    ip = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, tos, 20 + len(udp) + len(body), 1, 0x4000, 64, 17, 0,
                               socket.inet_aton(src), socket.inet_aton(dst)))
    struct.pack_into("!H", ip, 10, csum(bytes(ip)))
    return b"\x02" * 6 + b"\x04" * 6 + b"\x08\x00" + bytes(ip) + udp + body

class Cfg(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint32) for n in ("line", "minr", "ai", "hai", "g", "F")] + \
               [(n, ctypes.c_uint64) for n in ("K", "T", "B", "N", "cut")] + [("dscp", ctypes.c_uint32), ("ifindex", ctypes.c_uint32)]
class Peer(ctypes.Structure):
    _fields_ = [("rqpn", ctypes.c_uint32), ("peer_ip", ctypes.c_uint32)]
class Key(ctypes.Structure):
    _fields_ = [("peer_ip", ctypes.c_uint32), ("rqpn", ctypes.c_uint32)]
class St(ctypes.Structure):
    _fields_ = [("lock", ctypes.c_uint32)] + [(n, ctypes.c_uint32) for n in ("started", "rc", "rt", "alpha", "t", "bc", "has_cut")] + \
               [(n, ctypes.c_uint64) for n in ("now", "a0", "i0", "last_cut", "next_tx", "bytes", "cnp_rx", "cnp_ign", "cuts", "dropped")]

def ip32(a): return ctypes.c_uint32.from_buffer_copy(socket.inet_aton(a)).value

obj = BpfObject(compile_object(Path(sys.argv[1])))
ing, eg = obj.program_fd("dcqcn_ingress"), obj.program_fd("dcqcn_egress")
p = Params(line_rate_kbps=10_000, min_rate_kbps=100, ai_rate_kbps=200, hai_rate_kbps=1000, g=64,
           alpha_timer_ns=300_000, increase_timer_ns=400_000, byte_reset=20_000, threshold=5,
           cnp_interval_ns=500_000, cut_interval_ns=500_000)
obj.update("config", ctypes.c_uint32(0), Cfg(p.line_rate_kbps, p.min_rate_kbps, p.ai_rate_kbps, p.hai_rate_kbps, p.g,
           p.threshold, p.alpha_timer_ns, p.increase_timer_ns, p.byte_reset, p.cnp_interval_ns, p.cut_interval_ns, 26, 0))
ME, PEER = "10.0.0.1", "10.0.0.2"
obj.update("qpmap", ctypes.c_uint32(17), Peer(18, ip32(PEER)))
key = Key(ip32(PEER), 18)
obj.update("rp", key, St(0, 0, p.line_rate_kbps, p.line_rate_kbps, 1 << 20))

def state():
    s = St(); assert obj.lookup("rp", key, s); return s

# 1. the first data packet starts the state, gets ECT(0) and a departure time
rc, out = run(eg, roce(ME, PEER, 18))
s = state(); model = ReactionPoint(p, now_ns=s.now)
assert rc == 0 and out[15] & 3 == 2 and csum(out[14:34]) == 0, "ECT(0) with a valid checksum"
model.departure(s.now, len(out)); assert s.next_tx == model.next_tx_ns
# 2. random mix of packets and CNPs, compared event by event
random.seed(1); events = 0
for i in range(3000):
    if random.random() < 0.05:
        rc, _ = run(ing, roce(PEER, ME, 17, opcode=0x81, payload=16))
        assert rc == 2  # TC_ACT_SHOT: rxe never sees a CNP
        s = state(); model.on_cnp(s.now)
    else:
        n = random.choice([64, 512, 1024, 2048])
        rc, out = run(eg, roce(ME, PEER, 18, payload=n))
        s = state(); model.departure(s.now, len(out))
    got = (s.rc, s.rt, s.alpha, s.t, s.bc, s.cuts, s.cnp_ign, s.next_tx, s.dropped)
    want = (model.rc_kbps, model.rt_kbps, model.alpha, model.t_count, model.bc_count, model.rate_cuts, model.cnp_ignored,
            model.next_tx_ns, model.dropped_events)
    assert got == want, (i, got, want)
    events += 1
    if random.random() < 0.01:
        time.sleep(random.choice([0.002, 0.05, 0.5]))
print(f"{events} events: eBPF state == model; cuts {s.cuts}, ignored {s.cnp_ign}, rc {s.rc} rt {s.rt} "
      f"alpha {s.alpha / (1 << 20):.3f}, t {s.t} bc {s.bc}, dropped {s.dropped}")
# 3. NP: a CE packet for QP 17 -> a clone (fails here: ifindex 0, no device), then suppression inside N
st = lambda: [(lambda v: (obj.lookup("stats", ctypes.c_uint32(i), v), v.value)[1])(ctypes.c_uint64()) for i in range(9)]
rc1, o1 = run(ing, roce(PEER, ME, 17, tos=3)); rc2, _ = run(ing, roce(PEER, ME, 17, tos=3))
c = st(); print("stats ce_seen, cnp_sent, suppressed, cnp_rx, ignored, cuts, paced, unknown, failed:", c)
assert rc1 == rc2 == 0 and c[0] == 2 and c[2] == 1 and c[8] == 1 and o1 == roce(PEER, ME, 17, tos=3)
# 4. the clone's rewrite at egress: a CNP to QP 18 at the peer
rc, cnp = run(eg, roce(PEER, ME, 17, tos=3), mark=0xDC0C)
assert rc == 0 and len(cnp) == 74, (rc, len(cnp))
ip = cnp[14:34]
assert ip[12:16] == socket.inet_aton(ME) and ip[16:20] == socket.inet_aton(PEER) and csum(ip) == 0 and ip[1] == 26 << 2
assert cnp[0:6] == b"\x04" * 6 and cnp[6:12] == b"\x02" * 6
udp = struct.unpack("!HHHH", cnp[34:42]); bth = cnp[42:54]
assert udp[1] == 4791 and udp[2] == 40 and bth[0] == 0x81 and int.from_bytes(bth[5:8], "big") == 18
print("CNP:", cnp.hex())
print("stats:", st())
obj.close()
