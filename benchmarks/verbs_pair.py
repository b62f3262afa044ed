"""A pyverbs client/server pair on a two-host rxe fabric, as the verbs benchmarks (verbs_write_bw.py, verbs_steps.py)
run it: the fabric, the two child processes and their handshake, in one place.

What it stands for: perftest's out-of-band connection set-up (ib_write_bw exchanges its QP number, PSN, GID, buffer
address and rkey over a TCP socket before it moves the QPs to RTS), here over the children's stdin/stdout pipes:

    driver                         server child / client child (the benchmark's own script, --child ROLE)
    <- its coordinates (JSON)      connect_end(): print ours
    -> the other's coordinates        read the peer's, qp_to_rts
    <- "ready"                        print ready
    -> "go"                           wait for go; the caller's measurement
    <- its result (JSON)              print the result
    -> "end"                          wait for end; exit

Every line the driver waits for has a deadline (``timeout_s``): a child stuck in a verbs call or dead before its
line is killed and named instead of hanging the benchmark.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def rxe_pair(tag: str):
    """A 1-leaf fabric of two hosts at 1 Gbit/s with SoftRoCE on each host NIC (h1 -> leaf1 -> h2); yields
    ((ns, ip, device, gid_index) of h1, of h2) and tears the fabric down on the way out."""
    from testbed.network.fabric import Fabric
    from topologies import LeafSpineSpec, LinkSpec
    from traffic.rxe import find_device

    fab = Fabric(LeafSpineSpec(spines=1, leaves=1, hosts_per_leaf=2, host_link=LinkSpec(1000.0),
                               fabric_link=LinkSpec(1000.0)), f"{tag}{os.getpid() % 100000}", rxe=True)
    try:
        fab.build(None, None)
        yield tuple((fab.ns(h), fab.host_ip(h), *find_device(fab.host_ip(h))) for h in ("h1", "h2"))
    finally:
        fab.teardown()


def connect_end(v: dict, ctx, gidx: int, qp, mr) -> dict | None:
    """A child's half of the handshake: print this end's coordinates, read the peer's, move ``qp`` to RTS with
    traffic.rxe's attributes, print ready; the peer's coordinates once the driver says go (None if it did not)."""
    from traffic.rxe import IB_MTU, qp_to_rts

    mtu = int(ctx.query_port(1).active_mtu)
    psn = os.getpid() & 0xFFFFFF
    print(json.dumps({"qpn": qp.qp_num, "psn": psn, "gid": str(ctx.query_gid(1, gidx)), "addr": mr.buf,
                      "rkey": mr.rkey, "mtu": mtu, "mtu_bytes": IB_MTU.get(mtu)}), flush=True)
    peer = json.loads(sys.stdin.readline())
    qp_to_rts(v, qp, qpn=peer["qpn"], psn=peer["psn"], gid=peer["gid"], my_psn=psn, mtu_enum=min(mtu, peer["mtu"]),
              gid_index=gidx, traffic_class=0, min_rnr_timer=12, timeout=16, retry_cnt=7, rnr_retry=7)
    print("ready", flush=True)
    return peer if sys.stdin.readline().strip() == "go" else None


class _Child:
    """A child process in a host's namespace whose stdout lines a thread queues, so each read can have a deadline."""

    def __init__(self, ns: str, argv: list[str], role: str):
        from testbed.kernel import netns

        self.role = role
        self.proc = netns.popen(ns, argv, stdin=-1, stdout=-1, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put("")                       # end of output: the child ended

    def read(self, timeout_s: float) -> str:
        try:
            line = self.lines.get(timeout=timeout_s)
        except queue.Empty:
            raise RuntimeError(f"the pyverbs {self.role} said nothing for {timeout_s:.0f} s") from None
        if not line:
            raise RuntimeError(f"the pyverbs {self.role} ended (status {self.proc.wait()}) before its next line")
        return line

    def write(self, line: str) -> None:
        self.proc.stdin.write(line if line.endswith("\n") else line + "\n")
        self.proc.stdin.flush()


def run_pair(script: str, ns_srv: str, ip_srv: str, ns_cli: str, ip_cli: str, args: list[str],
             timeout_s: float = 120.0) -> tuple[dict, dict, dict]:
    """Start ``script --child server|client --ip IP ARGS`` in the two namespaces, swap their coordinates, start the
    measurement at once on both, and return (client's result, server's result, client's coordinates); the children
    are ended (and killed if they do not) whatever happens."""
    ends = [_Child(ns, [sys.executable, script, "--child", role, "--ip", ip, *args], role)
            for ns, ip, role in ((ns_srv, ip_srv, "server"), (ns_cli, ip_cli, "client"))]
    try:
        infos = [e.read(timeout_s) for e in ends]
        for e, other in zip(ends, reversed(infos)):
            e.write(other)
        if any(e.read(timeout_s).strip() != "ready" for e in ends):
            raise RuntimeError("a pyverbs end did not reach RTS")
        for e in ends:
            e.write("go")
        cli = json.loads(ends[1].read(timeout_s))
        srv = json.loads(ends[0].read(timeout_s))
        for e in ends:
            e.write("end")
            e.proc.wait(timeout=30)
    finally:
        for e in ends:
            if e.proc.poll() is None:
                e.proc.kill()
                e.proc.wait()
    return cli, srv, json.loads(infos[1])
