"""Drive a built fabric from a test: build and tear down, bulk TCP flows, the shaped single path's rate as the
shaper counts it. Shared by the lab VM's integration tests and the host tests (which run it on the real CPU)."""

from __future__ import annotations

import contextlib
import secrets
import socket
import threading
import time

from testbed.network.fabric import Fabric
from testbed.kernel import netns, qdisc
from testbed.kernel.state import RunState
from testbed.kernel.qdiscdump import RawQdiscDump
from topologies import DumbbellSpec, LinkSpec, QueueSpec


def timer_lateness_ms(n: int = 100) -> tuple[float, float]:
    """p50 and p95 of how late time.sleep(0.001) wakes up: a cheap reading of how starved this machine is."""
    late = []
    for _ in range(n):
        t = time.monotonic()
        time.sleep(0.001)
        late.append((time.monotonic() - t - 0.001) * 1e3)
    late.sort()
    return late[n // 2], late[int(n * 0.95)]


@contextlib.contextmanager
def built(topo):
    rid = secrets.token_hex(2)
    state = RunState(rid)
    fab = Fabric(topo, rid)
    undo = []
    try:
        fab.build(state, undo.append)
        yield fab
    finally:
        for fn in reversed(undo):
            fn()
        state.drop()


@contextlib.contextmanager
def fab_ipr(fab: Fabric, node: str):
    from testbed.kernel.netns import ipr_in

    ipr = ipr_in(fab.ns(node))
    try:
        yield ipr
    finally:
        ipr.close()


def bulk(fab: Fabric, pairs: list[tuple[str, str]], seconds: float, port: int = 5400,
         tos: dict[int, int] | None = None) -> list[int]:
    """One TCP flow per (src, dst) pair, all at once, for `seconds`; returns bytes received per flow. `tos`: flow
    index -> IP TOS byte (DSCP << 2)."""
    listeners = {}
    for dst in sorted({d for _, d in pairs}):
        with netns.entered(fab.ns(dst)):
            ls = socket.socket()
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind((fab.host_ip(dst), port))
        ls.listen(64)
        listeners[dst] = ls
    got = [0] * len(pairs)
    threads = []

    def drain(conn, i):
        with conn:
            while True:
                b = conn.recv(1 << 16)
                if not b:
                    return
                got[i] += len(b)

    clients = []
    for i, (src, dst) in enumerate(pairs):
        with netns.entered(fab.ns(src)):
            c = socket.socket()
        if tos and i in tos:
            c.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos[i])
        c.connect((fab.host_ip(dst), port))
        conn, _ = listeners[dst].accept()
        t = threading.Thread(target=drain, args=(conn, i), daemon=True)
        t.start()
        threads.append(t)
        clients.append(c)
    stop = time.monotonic() + seconds
    buf = bytes(1 << 16)

    def pump(c):
        c.settimeout(10)
        with contextlib.suppress(OSError):
            c.sendall(buf * 4)  # every flow carries something, however late its thread starts in a starved VM
            while time.monotonic() < stop:
                c.send(buf)
        c.close()

    senders = [threading.Thread(target=pump, args=(c,), daemon=True) for c in clients]
    for t in senders:
        t.start()
    for t in senders + threads:
        t.join(timeout=seconds + 20)
    for ls in listeners.values():
        ls.close()
    return got


def shaped_path_ratio(rate: float, seconds: float = 3.0) -> dict:
    """One kernel TCP flow h1 -> r1 over a dumbbell whose s1 -> s2 link is shaped to `rate` Mbit/s (drop-tail
    100 kB): bytes the shaper (HTB root, Ethernet headers included) sent in `seconds` after 1 s of slow start,
    over the configured rate. Returns {"ratio", "received", "late_ms", "why"} ("why": the message for a failure)."""
    topo = DumbbellSpec(senders=1, sender_link=LinkSpec(5 * rate), bottleneck_link=LinkSpec(rate),
                        bottleneck_queue=QueueSpec("droptail", buffer_bytes=100_000))
    with built(topo) as fab:
        result = {}

        ns = fab.ns("s1")
        with netns.entered(ns):
            idx = socket.if_nametoindex("s2")
        raw = RawQdiscDump(ns)  # a read takes microseconds, so its timestamp is the counter's (pyroute2: 100s of ms
        #                         in the emulated VM, which would skew the rate)

        def root():
            t = time.monotonic()
            q = raw.root_stats(idx)
            return (t + time.monotonic()) / 2, q

        def measure():
            time.sleep(1.0)  # past slow start
            t0, a = root()
            time.sleep(seconds)
            t1, b = root()
            assert a.kind == "htb"
            result["ratio"] = (b.sent_bytes - a.sent_bytes) * 8 / (t1 - t0) / (rate * 1e6)
            result["root_vs_pyroute2"] = (qdisc.root_stats(ns, "s2")["sent_bytes"], raw.root_stats(idx).sent_bytes)

        m = threading.Thread(target=measure)
        m.start()
        got = bulk(fab, [("h1", "r1")], seconds + 1.5)
        m.join()
        raw.close()
        late = timer_lateness_ms()
    print(f"shaper sent / configured rate at {rate} Mbit/s: {result['ratio']:.4f}; received {got[0]} B; "
          f"1 ms sleeps woke late by p50 {late[0]:.2f} ms, p95 {late[1]:.2f} ms")
    why = (f"{result}: if the 1 ms sleeps woke late by milliseconds ({late[0]:.2f} / {late[1]:.2f} ms p50 / p95), "
           "the (emulated) machine is starved of CPU and no software shaper holds its rate")
    return {"ratio": result["ratio"], "received": got[0], "late_ms": late, "why": why}


def uplink_share(run_dir, spine: str = "spine1") -> tuple[float, dict[str, int]]:
    """Of the bytes the leaves sent up to the spines during a run (queues.csv: the kernel's per-qdisc sent_bytes
    counters of every leaf->spine egress port, increase over the run's samples), the fraction that went up to
    ``spine``; and the bytes per ``leaf:spine`` port. How a load balancer split the traffic, as the switch counted
    it: one run suffices, no timing involved."""
    from analysis import summary as asum

    q = asum.load_quietly(run_dir).queues
    ports = sorted({(n, p) for n, p in zip(q["node"], q["port"]) if n.startswith("leaf") and p.startswith("spine")})
    sent = {f"{n}:{p}": asum.port_backlog(q, n, p)["sent_bytes"] for n, p in ports}
    total = sum(sent.values())
    return (sum(v for k, v in sent.items() if k.endswith(f":{spine}")) / total if total else float("nan")), sent
