"""A lossless RDMA incast with PFC alone or PFC + DCQCN, on one small fabric (issue 28's "what it shows"):
two senders on leaf2 (h3, h4) write to h1 on leaf1 with perftest's ib_write_bw (RC RDMA WRITE over SoftRoCE).
Every port has a lossless class for the RDMA traffic (DSCP 26, PFC on 802.1p priority 3) beside a lossy default
class (perftest's TCP exchange, ping, the CNPs). PFC alone pauses every port, the hosts' too; with DCQCN the hosts'
lossless class holds DCQCN's fq instead of PFC's plug, so PFC pauses switch ports only (each mode at its best: the
first hop is protected by PFC in one, by DCQCN's rate in the other). Every switch port marks ECN at
K (DCTCP-style step, K below XOFF, as DCQCN deployments set Kmin under the PFC threshold). h1's downlink is the
bottleneck; its queue crossing XOFF pauses spine1 -> leaf1, whose queue can pause leaf2 -> spine1.

    numbers = run_incast(out_dir, DcqcnSettings())               # PFC + DCQCN (the run option's defaults)
    numbers = run_incast(out_dir, DcqcnSettings(), react=False)  # PFC alone: ECN-capable, no reaction
    numbers = run_incast(out_dir, DcqcnSettings(), incast=Incast(start_s=(0, 1), messages=(100, 48),
                                                                 bottleneck_mbps=12.0))  # convergence

DCQCN is the library's (testbed.workloads.dcqcn.start_dcqcn, as ``--set dcqcn=on`` loads it), PFC too
(testbed.pfc.run.start_pfc). A staggered start (:class:`Incast`'s ``start_s``) shows convergence: the first
writer alone takes the port, the later one starts at the line rate as a new QP does, and the summary's
``dcqcn_stagger_s`` and ``dcqcn_convergence_s`` (analysis.dcqcn.convergence) say how long they took to share it.

"PFC alone" still loads the programs, unpaced and with R_min at the line rate: the senders' packets are ECN-capable
(ECT(0)) and the receiver sends CNPs, but a cut leaves the rate at the line rate, as a NIC whose reaction point is
disabled.
Without the programs rxe sends Not-ECT, and a marking queue drops Not-ECT packets above K instead of marking them
(rxe's go-back-N storms then dominate: a lossless class must not drop); so the switch configuration is the same in
both modes.

What each run returns (all from the kernel and the maps): ``pause_events`` and ``paused_ms`` (the PFC controller's,
every paused port), ``switch_pause_events`` (those of switch ports), ``peak_backlog_bytes`` (h1's downlink, the
controller's 1 ms samples), ``lossless_drops``, ``cct_s`` (from the first writer's start until the last one
ends), ``started`` (each writer's start, time.monotonic()), ``utilisation`` (the bytes moved over cct_s, against
the bottleneck's rate), ``base_rtt_ms`` (idle ping), the
programs' counters and the summary's other dcqcn_* numbers, ``jain_last`` (Jain's index of the flows' Rc over the last
third; NaN rather than dcqcn_jain_last's None), ``counters`` (dcqcn.csv), ``rates`` (dcqcn_rates.csv),
``sampler_errors`` and ``line_rate_kbps``. Used by tests/integration/test_dcqcn_incast.py and scripts/dcqcn_compare.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from pathlib import Path

import pandas as pd

from analysis.dcqcn import jain_last
from analysis.load import load_csv
from testbed.errors import UsageError
from testbed.kernel import netns
from testbed.pfc.run import start_pfc
from testbed.rundir import RunDir
from testbed.workloads.dcqcn import DcqcnSettings, start_dcqcn

HOST_MBPS, FABRIC_MBPS, BOTTLENECK_MBPS = 10.0, 20.0, 5.0
K_BYTES, XOFF_BYTES, XON_BYTES, BUFFER_BYTES = 6_000, 30_000, 15_000, 200_000
SENDERS, RECEIVER = ("h3", "h4"), "h1"
#: the fabric's hosts (incast_spec: 2 leaves x 2 hosts); any but the receiver can write
HOSTS = ("h1", "h2", "h3", "h4")
#: the RDMA traffic's DSCP (perftest's --tclass = DSCP << 2): the lossless class; everything else is lossy ``bulk``
DSCP = 26
#: per writer: 64 KiB messages; 24 of them = 1.5 MiB, so the incast moves 3 MiB through the 5 Mbit/s port (~5 s)
MESSAGE_BYTES, MESSAGES = 65536, 24
#: the RC ACK timeout exponent (4.096 us x 2^22 = 17 s): above the longest wait a paced packet has in fq
#: (rxe keeps up to 128 packets unacknowledged per QP: 128 KiB at R_min)
RC_TIMEOUT = 22


def incast_spec(bottleneck_mbps: float = BOTTLENECK_MBPS):
    from topologies import ClassSpec, LeafSpineSpec, LinkSpec, PortOverride, QueueSpec

    step = QueueSpec("step", buffer_bytes=BUFFER_BYTES, k_bytes=K_BYTES)
    lossless = ClassSpec("rdma", dscp=[DSCP], weight=1, lossless=True, pcp=3, xoff_bytes=XOFF_BYTES,
                         xon_bytes=XON_BYTES, headroom_bytes=BUFFER_BYTES - XOFF_BYTES)
    bulk = ClassSpec("bulk", dscp=[0], weight=1, default=True)  # perftest's TCP exchange, ping, the CNPs
    return LeafSpineSpec(spines=1, leaves=2, hosts_per_leaf=2, host_link=LinkSpec(HOST_MBPS),
                         fabric_link=LinkSpec(FABRIC_MBPS), host_queue=QueueSpec("droptail", buffer_bytes=BUFFER_BYTES),
                         leaf_down_queue=step, leaf_up_queue=step,
                         spine_queue=step, classes=(bulk, lossless),
                         ports=(PortOverride(f"leaf1:{RECEIVER}", rate_mbps=bottleneck_mbps),))


def _writers(fabric, out: Path, senders: tuple[str, ...], start_s: tuple[float, ...], messages: tuple[int, ...],
             port0: int = 18515) -> tuple[float, dict[str, float]]:
    """An ib_write_bw server per sender on h1, then each sender's writer `start_s` seconds after the first (the
    staggered start of a convergence run; all 0: together); seconds from the first writer's start until the last
    one ended, and each writer's start (time.monotonic(), the clock of dcqcn_rates.csv)."""
    from traffic.rxe import find_device

    dev = {h: find_device(fabric.host_ip(h)) for h in (*senders, RECEIVER)}
    common = ["-s", str(MESSAGE_BYTES), "-F", "-u", str(RC_TIMEOUT), f"--tclass={DSCP << 2}"]
    procs, clients, started = [], [], {}
    try:
        for i, _s in enumerate(senders):
            procs.append(netns.popen(fabric.ns(RECEIVER), ["ib_write_bw", "-d", dev[RECEIVER][0], "-x",
                                                           str(dev[RECEIVER][1]), *common, "-n", str(messages[i]),
                                                           "-p", str(port0 + i)],
                                     stdout=open(out / f"srv{i}.txt", "w"), stderr=open(out / f"srv{i}.err", "w")))
        time.sleep(1.0)
        t0 = time.monotonic()
        for i in sorted(range(len(senders)), key=lambda k: start_s[k]):
            s = senders[i]
            time.sleep(max(0.0, t0 + start_s[i] - time.monotonic()))
            started[s] = time.monotonic()
            clients.append((i, netns.popen(fabric.ns(s), ["ib_write_bw", "-d", dev[s][0], "-x", str(dev[s][1]),
                                                           *common, "-n", str(messages[i]), "-p", str(port0 + i),
                                                           fabric.host_ip(RECEIVER)],
                                           stdout=open(out / f"cli{i}.txt", "w"),
                                           stderr=open(out / f"cli{i}.err", "w"))))
            procs.append(clients[-1][1])
        for i, c in clients:
            rc = c.wait(timeout=120)
            if rc != 0:
                raise RuntimeError(f"ib_write_bw ended with {rc}: {(out / f'cli{i}.err').read_text()[-300:]}")
        return time.monotonic() - t0, started
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except Exception:  # noqa: BLE001
                    p.kill()
                    p.wait()


def base_rtt_ms(fabric, count: int = 10) -> float:
    """Median ping RTT from the first sender to the receiver on the idle fabric (the loop a CNP closes: data out,
    CNP back, without queueing)."""
    import re
    import statistics

    r = netns.run(fabric.ns(SENDERS[0]), ["ping", "-n", "-c", str(count), "-i", "0.05", fabric.host_ip(RECEIVER)],
                  timeout=30)
    rtts = [float(x) for x in re.findall(r"time=([0-9.]+) ms", r.stdout)]
    return statistics.median(rtts) if rtts else float("nan")


@dataclasses.dataclass(frozen=True)
class Incast:
    """What one run sends: `senders` (hosts writing to h1), each starting `start_s` seconds after the first
    (default: all together) and writing `messages` 64 KiB messages (default MESSAGES each), through h1's downlink
    at `bottleneck_mbps`. Bad input is a UsageError (one line), before anything is built."""

    senders: tuple[str, ...] = SENDERS
    start_s: tuple[float, ...] = ()
    messages: tuple[int, ...] = ()
    bottleneck_mbps: float = BOTTLENECK_MBPS

    def __post_init__(self):
        senders = tuple(self.senders)
        n = len(senders)
        object.__setattr__(self, "senders", senders)
        object.__setattr__(self, "start_s", tuple(self.start_s) or (0.0,) * n)
        object.__setattr__(self, "messages", tuple(self.messages) or (MESSAGES,) * n)
        writers = [h for h in HOSTS if h != RECEIVER]
        if not n or len(set(senders)) != n or not set(senders) <= set(writers):
            raise UsageError(f"incast: senders must be distinct hosts among {', '.join(writers)} (not the receiver "
                             f"{RECEIVER}), at least one: got {', '.join(senders) or 'none'}")
        if not self.bottleneck_mbps > 0:
            raise UsageError(f"incast: bottleneck_mbps must be > 0 (got {self.bottleneck_mbps})")
        if len(self.start_s) != n or len(self.messages) != n or min(self.start_s) < 0 or min(self.messages) < 1:
            raise UsageError(f"incast: one start (>= 0 s) and one message count (>= 1) per sender: {self}")


def run_incast(out: str | Path, settings: DcqcnSettings, react: bool = True, incast: Incast = Incast()) -> dict:
    """One incast on a fabric built for it and torn down after it (PFC's plugs stay in a fabric's queues, so each
    run gets a fresh one); files into `out`. `settings`: DCQCN's (testbed.workloads.dcqcn, at the hosts' line rate);
    `react=False`: PFC alone (R_min raised to the line rate, no pacing)."""
    fabric = build(bottleneck_mbps=incast.bottleneck_mbps)
    try:
        return _run(fabric, Path(out), settings, react, incast)
    finally:
        fabric.teardown()


def _run(fabric, out: Path, settings: DcqcnSettings, react: bool, incast: Incast) -> dict:
    rundir = RunDir(out, "dcqcn-incast", {"dcqcn": react, **dataclasses.asdict(incast)}, 0)
    undo: list = []
    try:
        # PFC alone pauses the hosts too (their lossless class holds PFC's plug, the programs do not pace); with
        # DCQCN that class holds fq, so PFC pauses switch ports only
        pfc = start_pfc(fabric, rundir, undo.append, interval_ms=1, frames=False, pause_hosts=not react)
        dc = start_dcqcn(fabric, rundir, undo.append, settings, start=False, react=react)
        rtt_ms = base_rtt_ms(fabric)
        dc.start(first=incast.senders)
        cct_s, started = _writers(fabric, out, incast.senders, incast.start_s, incast.messages)
        dc.sampler.stop()
        summary = pfc.finish()
        switch_pauses = sum(q.pause_events for q in pfc.queues.values() if q.is_switch)
        m = dc.finish()  # dcqcn_rates.csv, dcqcn.csv (the counters, fq's too), the programs unloaded
    finally:
        for fn in reversed(undo):  # the programs' close and PFC's undo, whatever failed above
            with contextlib.suppress(Exception):
                fn()
    q = pd.read_csv(out / "queues.csv")
    port = next(p.ifname for p in fabric.port_plans if p.node == "leaf1" and p.peer == RECEIVER)
    down = q[(q["node"] == "leaf1") & (q["port"].astype(str) == port)]
    moved_bits = sum(incast.messages) * MESSAGE_BYTES * 8
    rates = load_csv(out / "dcqcn_rates.csv", "dcqcn_rates")  # as analysis reads a run's file
    return {"dcqcn": react, "cct_s": cct_s, "base_rtt_ms": rtt_ms, "started": started,
            "utilisation": moved_bits / cct_s / (incast.bottleneck_mbps * 1e6),
            "pause_events": summary["pfc_pause_events"], "switch_pause_events": switch_pauses,
            "paused_ms": summary["pfc_paused_ms_total"], "lossless_drops": summary["lossless_drops"],
            "peak_backlog_bytes": int(down["backlog_bytes"].max()) if len(down) else 0,
            **{k: v for k, v in m.items() if k != "dcqcn"}, "jain_last": jain_last(rates),
            "counters": load_csv(out / "dcqcn.csv", "dcqcn"), "rates": rates,
            "sampler_errors": list(dc.sampler.errors), "line_rate_kbps": dc.params.line_rate_kbps}


def build(run_id: str | None = None, bottleneck_mbps: float = BOTTLENECK_MBPS):
    """The incast fabric, built with an rxe device per host (tear it down with ``.teardown()``)."""
    from testbed.network.fabric import Fabric

    fab = Fabric(incast_spec(bottleneck_mbps), run_id or f"dqi{os.getpid() % 100000}", rxe=True)
    try:
        fab.build(None, None)
    except BaseException:
        fab.teardown()
        raise
    return fab


__all__ = ["Incast", "build", "incast_spec", "run_incast"]
