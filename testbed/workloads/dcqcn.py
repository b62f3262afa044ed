"""DCQCN on one run: the NIC congestion control of RoCEv2 (docs/dcqcn.md) loaded beside every host's SoftRoCE
device, its QP maps kept current and its rates recorded while the run's RDMA traffic flows, its counters accounted
for at the end.

    dc = start_dcqcn(lab.net.fabric, lab.rundir, lab.on_teardown, DcqcnSettings(), lab.progress)   # or lab.dcqcn()
    ... RDMA traffic ...
    summary.update(dc.finish())      # dcqcn_rates.csv, dcqcn.csv, the dcqcn_* numbers (analysis.dcqcn)

What it stands for: the reaction and notification points a RoCE NIC runs in firmware (testbed.kernel.dcqcn: eBPF at
the host interface's clsact, fq pacing under its shaper), configured with the paper's parameters scaled to the
emulated line rate and tuned to the lab VM's feedback loop (:class:`DcqcnSettings`) unless a parameter is given.
Files: ``dcqcn_rates.csv`` (every QP's rate state every 50 ms, testbed.measure.dcqcn_rates) and ``dcqcn.csv``
(``host, counter, value``: each host's program counters at the end); the summary's numbers are
analysis.dcqcn.dcqcn_metrics over those two files. The programs go and the hosts' own leaf queues come back at
:meth:`DcqcnRun.finish` or at teardown, whichever is first.

Scenarios take :data:`DCQCN_PARAMS` (``--set dcqcn=on`` and the ``dcqcn_*`` knobs); :func:`check_fabric` (or
:func:`check_run` at a given rate) refuses what cannot work before anything is built.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Callable

from analysis.dcqcn import dcqcn_metrics
from analysis.load import load_csv
from testbed.errors import UsageError
from testbed.kernel import dcqcn as kdcqcn
from testbed.measure.dcqcn_rates import DcqcnRates
from testbed.network.portplan import plan_port
from testbed.params import Param
from traffic import dcqcn as model

COUNTER_COLUMNS = ["host", "counter", "value"]
#: rxe's RC ACK timer must outlast the longest wait a paced packet has in fq (rxe has sent it when fq holds it;
#: a NIC's rate limiter sits before its transport timer): 4.096 us x 2^19 = 2.1 s
MIN_RDMA_TIMEOUT = 19  # 128 unacknowledged 1 KiB packets at R_min = 1 Mbit/s: ~1 s

#: the lab's defaults, tuned to the lab VM's feedback loop (docs/dcqcn.md, "Tuning"): the loop a cut closes is not
#: the ~1 ms RTT but the packets rxe has already handed to fq, stamped at the old rate (up to 128 unacknowledged
#: packets per QP: ~105 ms at 10 Mbit/s, seconds at a 1 % floor), so the time constants are the paper's x 1000
#: (N 50 ms, K and T 55 ms), the floor R_min 10 % of the line rate and R_AI 2 % (R_HAI 10 x R_AI, as the paper)
LAB_TIME_SCALE = 1000
LAB_MIN_RATE_FRACTION = 0.10
LAB_AI_RATE_FRACTION = 0.02
LAB_HAI_RATE_FRACTION = 10 * LAB_AI_RATE_FRACTION

P = Param
DCQCN_PARAMS = [
    P("dcqcn", str, "off", "", "on: DCQCN (RoCEv2's NIC congestion control, docs/dcqcn.md) on every host's rxe "
      "device: CNPs for CE-marked packets, per-QP rate cuts and recovery, pacing (transport=rdma, switch ports that "
      "mark ECN); mark: the baseline of a comparison, the switches configured alike: the NICs send ECN-capable "
      "packets and answer CE with CNPs but never slow down or pace (R_min = the line rate), so PFC may pause the "
      "hosts", choices=("off", "on", "mark")),
    P("dcqcn_time_scale", int, LAB_TIME_SCALE, "", "dcqcn: the paper's time constants (microseconds at 40 Gbit/s) "
      "multiplied by this (the emulated feedback loop is that much slower; docs/dcqcn.md, Tuning)", min=1,
      max=100_000),
    P("dcqcn_cnp_interval_ms", float, 0.0, "ms", "dcqcn: N, np_min_time_between_cnps, also the cut interval "
      "(0: 50 us x time scale)", min=0, max=10_000),
    P("dcqcn_alpha_timer_ms", float, 0.0, "ms", "dcqcn: K, rp_dce_tcp_rtt (0: 55 us x time scale)", min=0,
      max=10_000),
    P("dcqcn_increase_timer_ms", float, 0.0, "ms", "dcqcn: T, rp_time_reset (0: 55 us x time scale)", min=0,
      max=10_000),
    P("dcqcn_byte_reset_bytes", int, 0, "bytes", "dcqcn: B, rp_byte_reset (0: 2 ms at line rate x time scale)",
      min=0, max=1 << 40),
    P("dcqcn_ai_rate_mbps", float, 0.0, "Mbit/s", "dcqcn: R_AI, rp_ai_rate (0: 2 % of the host line rate)",
      min=0, max=100_000),
    P("dcqcn_hai_rate_mbps", float, 0.0, "Mbit/s", "dcqcn: R_HAI, rp_hai_rate (0: 20 % of the line rate)", min=0,
      max=100_000),
    P("dcqcn_min_rate_mbps", float, 0.0, "Mbit/s", "dcqcn: R_min, rp_min_rate (0: 10 % of the line rate)", min=0,
      max=100_000),
    P("dcqcn_g", int, 4, "1/1024", "dcqcn: g, rp_dce_tcp_g (4 = 1/256)", min=1, max=1023),
    P("dcqcn_threshold", int, 5, "", "dcqcn: F, rp_threshold (fast-recovery events)", min=1, max=31),
]


@dataclass(frozen=True)
class DcqcnSettings:
    """DCQCN's knobs as the run takes them: time constants scaled from the paper (traffic.dcqcn.scaled) by
    ``time_scale``, rates as fractions of the line rate (LAB_*), unless given (0 means "the default")."""

    time_scale: int = LAB_TIME_SCALE
    cnp_interval_ms: float = 0.0
    alpha_timer_ms: float = 0.0
    increase_timer_ms: float = 0.0
    byte_reset_bytes: int = 0
    ai_rate_mbps: float = 0.0
    hai_rate_mbps: float = 0.0
    min_rate_mbps: float = 0.0
    g: int = 4
    threshold: int = 5

    @classmethod
    def from_params(cls, p: dict) -> "DcqcnSettings":
        return cls(**{f.name: p[f"dcqcn_{f.name}"] for f in dataclasses.fields(cls)})

    def params(self, line_rate_mbps: float) -> model.Params:
        """The programs' parameters for hosts at `line_rate_mbps`; UsageError (one line) when they cannot work."""
        try:
            base = model.scaled(line_rate_mbps, time_scale=self.time_scale)
            over: dict = {"g": self.g, "threshold": self.threshold}
            for ms, names in ((self.cnp_interval_ms, ("cnp_interval_ns", "cut_interval_ns")),
                              (self.alpha_timer_ms, ("alpha_timer_ns",)),
                              (self.increase_timer_ms, ("increase_timer_ns",))):
                if ms:
                    over.update({n: round(ms * 1e6) for n in names})
            for mbps, fraction, name in ((self.ai_rate_mbps, LAB_AI_RATE_FRACTION, "ai_rate_kbps"),
                                         (self.hai_rate_mbps, LAB_HAI_RATE_FRACTION, "hai_rate_kbps"),
                                         (self.min_rate_mbps, LAB_MIN_RATE_FRACTION, "min_rate_kbps")):
                over[name] = max(1, round((mbps or line_rate_mbps * fraction) * 1000))
            if self.byte_reset_bytes:
                over["byte_reset"] = self.byte_reset_bytes
            return dataclasses.replace(base, **over)
        except ValueError as e:
            raise UsageError(f"dcqcn: {e}") from None


def check_run(p: dict, line_rate_mbps: float) -> None:
    """UsageError (one line) before anything exists when dcqcn=on cannot work with these parameters: another
    transport than RDMA, switch ports that cannot mark ECN (what DCQCN reacts to), PFC pausing the host NICs (the
    lossless class there holds DCQCN's pacing queue instead of PFC's plug), an RC ACK timeout shorter than a paced
    packet's wait (dcqcn=on only: mark installs no fq), or DCQCN parameters out of range."""
    if p.get("dcqcn", "off") == "off":
        return
    if p.get("transport") != "rdma":
        raise UsageError(f"dcqcn={p['dcqcn']} needs transport=rdma (DCQCN is RoCE's congestion control; got transport="
                         f"{p.get('transport')}; for TCP use cc=dctcp)")
    if not p.get("topology_file"):
        disc = p.get("discipline")
        if disc not in ("red", "step") or (disc == "red" and not p.get("ecn")):
            raise UsageError(f"dcqcn={p['dcqcn']} needs switch ports that mark ECN: discipline=step, or "
                             "discipline=red with ecn=true")
    if p.get("dcqcn") == "on" and p.get("pfc") == "on" and p.get("pfc_pause_hosts", True):
        raise UsageError("dcqcn=on with pfc=on needs pfc_pause_hosts=false: a host NIC's lossless class holds "
                         "DCQCN's pacing queue (fq), which cannot also be PFC's plug")
    if p.get("dcqcn") == "on" and p.get("rdma_timeout", MIN_RDMA_TIMEOUT) < MIN_RDMA_TIMEOUT:  # mark paces nothing
        raise UsageError(f"dcqcn=on needs rdma_timeout >= {MIN_RDMA_TIMEOUT} (an ACK timeout of 2.1 s or more): "
                         f"rxe's ACK timer runs while DCQCN's pacing holds a sent packet (got {p['rdma_timeout']})")
    DcqcnSettings.from_params(p).params(line_rate_mbps)


def line_rate_mbps(ports, hosts) -> float:
    """The line rate DCQCN runs at: the slowest egress of the host NICs, per-port rate overrides included.
    `ports`: the fabric's PortPlans or the topology's EgressPorts (both have node and rate_mbps); `hosts`: the
    hosts' names. The one definition for the check before the build and the install after it."""
    return min(p.rate_mbps for p in ports if p.node in hosts)


def check_fabric(p: dict, spec) -> None:
    """:func:`check_run` at the rate :func:`start_dcqcn` will use on `spec` (a topology spec), and with dcqcn=on
    the host NICs' leaf queues: fq replaces them and puts them back, which it can do for drop-tail queues only
    (testbed.kernel.dcqcn.RESTORABLE; a topology file may give the host NICs RED or step). UsageError, one line."""
    if p.get("dcqcn", "off") == "off":
        return
    hosts = {h.name for h in spec.hosts}
    plans = [plan_port(ep) for ep in spec.egress_ports() if ep.node in hosts]
    check_run(p, line_rate_mbps(plans, hosts))
    kinds = sorted({q.kind for plan in plans for _m, _n, q, *_ in plan.classes} - set(kdcqcn.RESTORABLE))
    if p.get("dcqcn") == "on" and kinds:
        raise UsageError(f"dcqcn=on needs drop-tail host NIC queues (DCQCN's fq takes their place and puts them "
                         f"back); the topology gives the host NICs {', '.join(kinds)}")


def dcqcn_needs(p: dict) -> tuple[str, ...]:
    """dcqcn=on: the pacing qdisc (fq) and the programs' hook (clsact); mark: the hook."""
    return {"on": ("qdisc:fq", "qdisc:clsact"), "mark": ("qdisc:clsact",)}.get(p.get("dcqcn", "off"), ())


class DcqcnRun:
    """DCQCN loaded on every host with an rxe device (see the module docstring)."""

    def __init__(self, fabric, rundir, params: model.Params, progress: Callable[[str], None] | None = None,
                 react: bool = True):
        self.fabric, self.rundir, self.params, self.react = fabric, rundir, params, react
        self.progress = progress or (lambda _m: None)
        self.loaded: dict[str, kdcqcn.Dcqcn] = {}
        self.sampler: DcqcnRates | None = None
        self._summary: dict | None = None

    def install(self) -> "DcqcnRun":
        """The programs on every RDMA host's interface (closed again if one fails)."""
        try:
            for host, (_dev, netdev) in sorted(self.fabric.rxe.items()):
                self.loaded[host] = kdcqcn.install(self.fabric.ns(host), netdev, self.params, pace=self.react)
        except BaseException:
            self.close()
            raise
        return self

    def start(self, first: tuple[str, ...] = ()) -> "DcqcnRun":
        """The QP mapper and rate sampler (a thread: start it after any process the run forks). `first`: hosts
        whose maps are filled first in each round (known senders: no CNP then reaches a sender not mapped yet)."""
        hosts = {h: (d, self.fabric.rxe[h][0], self.fabric.host_ip(h)) for h, d in self.loaded.items()}
        self.sampler = DcqcnRates(hosts, interval_s=0.05, first=first)
        self.sampler.start()
        p = self.params
        self.progress(f"DCQCN {'on' if self.react else 'marking only (no reaction, no pacing)'} on "
                      f"{len(self.loaded)} hosts: line {p.line_rate_kbps / 1e3:g} Mbit/s, N "
                      f"{p.cnp_interval_ns / 1e6:g} ms, K {p.alpha_timer_ns / 1e6:g} ms, T "
                      f"{p.increase_timer_ns / 1e6:g} ms, R_min {p.min_rate_kbps / 1e3:g} Mbit/s")
        return self

    def counters(self) -> dict[str, dict[str, int]]:
        """Per host the programs' counters and, paced, fq's (fq_drops, fq_throttled, fq_flows_plimit: read before
        the leaf queues come back with fresh counters)."""
        return {h: {**d.stats(), **d.fq_stats()} for h, d in sorted(self.loaded.items())}

    def finish(self) -> dict:
        """Stop the sampler, write dcqcn_rates.csv and dcqcn.csv, unload; the dcqcn_* numbers. Idempotent."""
        if self._summary is not None:
            return dict(self._summary)
        try:
            if self.sampler is not None:
                self.sampler.stop()
                self.sampler.write(self.rundir)
                for e in self.sampler.errors[:3]:
                    self.progress(f"DCQCN sampler: {e}")
            counters = self.counters()
            path = self.rundir.write_csv("dcqcn.csv", COUNTER_COLUMNS,
                                         ((h, k, v) for h, c in counters.items() for k, v in c.items()))
        finally:
            self.close()
        self._summary = dcqcn_metrics(load_csv(path, "dcqcn"),
                                      load_csv(self.rundir.path / "dcqcn_rates.csv", "dcqcn_rates"))
        self._summary["dcqcn"] = "on" if self.react else "mark"
        if self.sampler is not None:
            self._summary["dcqcn_sampler_errors"] = len(self.sampler.errors)
        return dict(self._summary)

    def close(self) -> None:
        """Unload every host's programs and put its leaf queues back (idempotent)."""
        if self.sampler is not None and self.sampler.is_alive():
            self.sampler.stop()
        for d in self.loaded.values():
            with contextlib.suppress(Exception):
                d.close()


def start_dcqcn(fabric, rundir, on_teardown: Callable[[Callable[[], object]], None], settings: DcqcnSettings,
                progress: Callable[[str], None] | None = None, start: bool = True, react: bool = True) -> DcqcnRun:
    """DCQCN on every host of `fabric` with an rxe device, at the host link's rate (see the module docstring).
    ``start=False``: call :meth:`DcqcnRun.start` later (after forking). ``react=False``: marking only (dcqcn=mark:
    ECN-capable packets and CNPs, R_min raised to the line rate, no fq, the hosts' queues untouched)."""
    if not fabric.rxe:
        raise UsageError("dcqcn: the fabric has no rxe devices (a Lab with rxe=True, a run with transport=rdma)")
    params = settings.params(line_rate_mbps(fabric.port_plans, fabric.rxe))
    if not react:
        params = dataclasses.replace(params, min_rate_kbps=params.line_rate_kbps)
    run = DcqcnRun(fabric, rundir, params, progress, react)
    on_teardown(run.close)
    run.install()
    return run.start() if start else run


__all__ = ["DCQCN_PARAMS", "DcqcnRun", "DcqcnSettings", "check_fabric", "check_run", "dcqcn_needs", "line_rate_mbps",
           "start_dcqcn"]
