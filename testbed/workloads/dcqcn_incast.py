"""A lossless RDMA incast with PFC alone or PFC + DCQCN, on one small fabric (issue 28's "what it shows"):
two senders on leaf2 (h3, h4) write to h1 on leaf1 with perftest's ib_write_bw (RC RDMA WRITE over SoftRoCE).
Every port has a lossless class for the RDMA traffic (DSCP 26, PFC on 802.1p priority 3) beside a lossy default
class (perftest's TCP exchange, ping, the CNPs). PFC alone pauses every port, the hosts' too; with DCQCN the hosts'
lossless class holds DCQCN's fq instead of PFC's plug, so PFC pauses switch ports only (each mode at its best: the
first hop is protected by PFC in one, by DCQCN's rate in the other). Every switch port marks ECN at
K (DCTCP-style step, K below XOFF, as DCQCN deployments set Kmin under the PFC threshold). h1's downlink is the
bottleneck; its queue crossing XOFF pauses spine1 -> leaf1, whose queue can pause leaf2 -> spine1.

    params = DcqcnSettings().params(HOST_MBPS)          # testbed.workloads.dcqcn: the run option's defaults
    numbers = run_incast(out_dir, params)                # PFC + DCQCN, on a fabric of its own
    numbers = run_incast(out_dir, params, react=False)   # PFC alone: ECN-capable, no reaction

"PFC alone" still loads the programs, unpaced and with R_min at the line rate: the senders' packets are ECN-capable
(ECT(0)) and the receiver sends CNPs, but a cut leaves the rate at the line rate, as a NIC whose reaction point is
disabled.
Without the programs rxe sends Not-ECT, and a marking queue drops Not-ECT packets above K instead of marking them
(rxe's go-back-N storms then dominate: a lossless class must not drop); so the switch configuration is the same in
both modes.

What each run returns (all from the kernel and the maps): ``pause_events`` and ``paused_ms`` (the PFC controller's,
every paused port), ``switch_pause_events`` (those of switch ports), ``peak_backlog_bytes`` (h1's downlink, the
controller's 1 ms samples), ``lossless_drops``, ``cct_s`` (both writers started together, until the last one ends),
``utilisation`` (the bytes moved over cct_s, against the bottleneck's rate), ``base_rtt_ms`` (idle ping), the
programs' counters (dcqcn_*), ``jain_last`` (Jain's index of the two flows' Rc over the last third) and the rows of
dcqcn_rates.csv. Used by tests/integration/test_dcqcn_incast.py and scripts/dcqcn_compare.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from pathlib import Path

import pandas as pd

from analysis.dcqcn import dcqcn_metrics, jain_last
from testbed.kernel import dcqcn as kdcqcn
from testbed.kernel import netns
from testbed.measure.dcqcn_rates import COLUMNS as RATE_COLUMNS, DcqcnRates
from testbed.pfc.run import start_pfc
from testbed.rundir import RunDir

HOST_MBPS, FABRIC_MBPS, BOTTLENECK_MBPS = 10.0, 20.0, 5.0
K_BYTES, XOFF_BYTES, XON_BYTES, BUFFER_BYTES = 6_000, 30_000, 15_000, 200_000
SENDERS, RECEIVER = ("h3", "h4"), "h1"
#: the RDMA traffic's DSCP (perftest's --tclass = DSCP << 2): the lossless class; everything else is lossy ``bulk``
DSCP = 26
#: per writer: 64 KiB messages; 24 of them = 1.5 MiB, so the incast moves 3 MiB through the 5 Mbit/s port (~5 s)
MESSAGE_BYTES, MESSAGES = 65536, 24
#: the RC ACK timeout exponent (4.096 us x 2^22 = 17 s): above the longest wait a paced packet has in fq
#: (rxe keeps up to 128 packets unacknowledged per QP: 128 KiB at R_min)
RC_TIMEOUT = 22


def incast_spec():
    from topologies import ClassSpec, LeafSpineSpec, LinkSpec, PortOverride, QueueSpec

    step = QueueSpec("step", buffer_bytes=BUFFER_BYTES, k_bytes=K_BYTES)
    lossless = ClassSpec("rdma", dscp=[DSCP], weight=1, lossless=True, pcp=3, xoff_bytes=XOFF_BYTES,
                         xon_bytes=XON_BYTES, headroom_bytes=BUFFER_BYTES - XOFF_BYTES)
    bulk = ClassSpec("bulk", dscp=[0], weight=1, default=True)  # perftest's TCP exchange, ping, the CNPs
    return LeafSpineSpec(spines=1, leaves=2, hosts_per_leaf=2, host_link=LinkSpec(HOST_MBPS),
                         fabric_link=LinkSpec(FABRIC_MBPS), host_queue=QueueSpec("droptail", buffer_bytes=BUFFER_BYTES),
                         leaf_down_queue=step, leaf_up_queue=step,
                         spine_queue=step, classes=(bulk, lossless),
                         ports=(PortOverride(f"leaf1:{RECEIVER}", rate_mbps=BOTTLENECK_MBPS),))


def _writers(fabric, out: Path, port0: int = 18515) -> float:
    """Both ib_write_bw writers started together against two servers on h1; seconds until the last one ended."""
    from traffic.rxe import find_device

    dev = {h: find_device(fabric.host_ip(h)) for h in (*SENDERS, RECEIVER)}
    common = ["-s", str(MESSAGE_BYTES), "-n", str(MESSAGES), "-F", "-u", str(RC_TIMEOUT), f"--tclass={DSCP << 2}"]
    procs = []
    try:
        for i, _s in enumerate(SENDERS):
            procs.append(netns.popen(fabric.ns(RECEIVER), ["ib_write_bw", "-d", dev[RECEIVER][0], "-x",
                                                           str(dev[RECEIVER][1]), *common, "-p", str(port0 + i)],
                                     stdout=open(out / f"srv{i}.txt", "w"), stderr=open(out / f"srv{i}.err", "w")))
        time.sleep(1.0)
        t0 = time.monotonic()
        clients = [netns.popen(fabric.ns(s), ["ib_write_bw", "-d", dev[s][0], "-x", str(dev[s][1]), *common, "-p",
                                              str(port0 + i), fabric.host_ip(RECEIVER)],
                               stdout=open(out / f"cli{i}.txt", "w"), stderr=open(out / f"cli{i}.err", "w"))
                   for i, s in enumerate(SENDERS)]
        procs += clients
        for c in clients:
            rc = c.wait(timeout=120)
            if rc != 0:
                raise RuntimeError(f"ib_write_bw ended with {rc}: {(out / 'cli0.err').read_text()[-300:]}")
        return time.monotonic() - t0
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


def run_incast(out: str | Path, dcqcn, react: bool = True) -> dict:
    """One incast on a fabric built for it and torn down after it (PFC's plugs stay in a fabric's queues, so each
    run gets a fresh one); files into `out`. `dcqcn`: the programs' parameters (traffic.dcqcn.Params);
    `react=False`: PFC alone (R_min raised to the line rate)."""
    fabric = build()
    try:
        return _run(fabric, out, dcqcn, react)
    finally:
        fabric.teardown()


def _run(fabric, out: str | Path, dcqcn, react: bool) -> dict:
    from traffic.rxe import find_device

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if not react:
        dcqcn = dataclasses.replace(dcqcn, min_rate_kbps=dcqcn.line_rate_kbps)
    rundir = RunDir(out, "dcqcn-incast", {"dcqcn": react}, 0)
    undo: list = []
    loaded: dict = {}
    sampler = None
    try:
        # PFC alone pauses the hosts too (their lossless class holds PFC's plug, the programs do not pace); with
        # DCQCN that class holds fq, so PFC pauses switch ports only
        pfc = start_pfc(fabric, rundir, undo.append, interval_ms=1, frames=False, pause_hosts=not react)
        for h in (*SENDERS, RECEIVER):
            loaded[h] = kdcqcn.install(fabric.ns(h), "eth0", dcqcn, pace=react)
        sampler = DcqcnRates({h: (d, find_device(fabric.host_ip(h))[0], fabric.host_ip(h))
                              for h, d in loaded.items()}, interval_s=0.05, first=SENDERS)
        rtt_ms = base_rtt_ms(fabric)
        sampler.start()
        cct_s = _writers(fabric, out)
        sampler.stop()
        summary = pfc.finish()
        switch_pauses = sum(q.pause_events for q in pfc.queues.values() if q.is_switch)
    finally:
        if sampler is not None:
            sampler.stop()
        counters: dict = {}
        for h, d in loaded.items():   # a failed read must not skip the close and PFC's undo below
            with contextlib.suppress(Exception):
                counters[h] = d.stats()
        for d in loaded.values():
            with contextlib.suppress(Exception):
                d.close()
        for fn in reversed(undo):
            with contextlib.suppress(Exception):
                fn()
    q = pd.read_csv(out / "queues.csv")
    port = next(p.ifname for p in fabric.port_plans if p.node == "leaf1" and p.peer == RECEIVER)
    down = q[(q["node"] == "leaf1") & (q["port"].astype(str) == port)]
    moved_bits = len(SENDERS) * MESSAGES * MESSAGE_BYTES * 8
    numbers = {"dcqcn": react, "cct_s": cct_s, "base_rtt_ms": rtt_ms,
               "utilisation": moved_bits / cct_s / (BOTTLENECK_MBPS * 1e6), "pause_events": summary["pfc_pause_events"],
               "switch_pause_events": switch_pauses,
               "paused_ms": summary["pfc_paused_ms_total"], "lossless_drops": summary["lossless_drops"],
               "peak_backlog_bytes": int(down["backlog_bytes"].max()) if len(down) else 0}
    if sampler is not None:  # always, once the programs were loaded
        pd.DataFrame(sampler.rows, columns=RATE_COLUMNS).to_csv(out / "dcqcn_rates.csv", index=False)
        rates = pd.read_csv(out / "dcqcn_rates.csv")  # as analysis reads a run's file: one definition, its dtypes
        m = dcqcn_metrics(pd.DataFrame([(h, k, v) for h, c in counters.items() for k, v in c.items()],
                                       columns=["host", "counter", "value"]), rates)
        numbers.update({k: v for k, v in m.items() if k != "dcqcn"}, jain_last=jain_last(rates),
                       counters=counters, rates=rates, sampler_errors=list(sampler.errors))
    return numbers


def build(run_id: str | None = None):
    """The incast fabric, built with an rxe device per host (tear it down with ``.teardown()``)."""
    from testbed.network.fabric import Fabric

    fab = Fabric(incast_spec(), run_id or f"dqi{os.getpid() % 100000}", rxe=True)
    try:
        fab.build(None, None)
    except BaseException:
        fab.teardown()
        raise
    return fab


__all__ = ["build", "incast_spec", "run_incast"]
