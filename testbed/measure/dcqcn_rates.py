"""DCQCN beside a run: keep every host's QP map current and record each QP's rate over time (dcqcn_rates.csv).

A RoCE NIC knows each QP's peer from the QP's own context; the eBPF reaction and notification points beside rxe
(testbed/kernel/dcqcn.py) learn it from user space. Every ``interval_s`` this sampler reads the hosts' QP tables
over RDMA netlink (testbed.kernel.rdma_qps), pairs them (A's local QPN is B's remote QPN and the other way round),
adds new QPs to each host's map and drops the destroyed ones, and reads every QP's rate state under its lock: the
rows of dcqcn_rates.csv, the per-QP rate a NIC's firmware would show (Rc, Rt, alpha, cuts, CNPs), timestamped with
time.monotonic() as every run-directory file is. The RDMA devices' indexes are resolved once, at the first round.
Rows are buffered and written at the end.

    with DcqcnRates({"h1": (dcqcn_h1, "rxe_h1", "10.0.0.1"), ...}) as sampler:
        ... RDMA traffic ...
    sampler.write(rundir)
"""

from __future__ import annotations

import threading
import time

from testbed.kernel import rdma_qps

COLUMNS = ["t_s", "host", "peer", "rqpn", "rc_kbps", "rt_kbps", "alpha", "rate_cuts", "cnp_received",
           "cnp_ignored"]


class DcqcnRates(threading.Thread):
    """The QP mapper and rate sampler of one run. `hosts`: host name -> (its testbed.kernel.dcqcn.Dcqcn, its rxe
    device's name, its IPv4 address). Hosts named in `first` get their maps filled first in each round (a
    sender before its receiver, so no CNP reaches a sender that cannot map it yet)."""

    def __init__(self, hosts: dict[str, tuple[object, str, str]], interval_s: float = 0.05,
                 first: tuple[str, ...] = ()):
        super().__init__(name="dcqcn-rates", daemon=True)
        self.hosts, self.interval_s = hosts, float(interval_s)
        self.order = sorted(hosts, key=lambda h: (h not in first, h))
        self.rows: list[tuple] = []
        self.errors: list[str] = []
        self._index: dict[str, int] = {}  # rdma device name -> its index, resolved once (at the first round)
        self._stop_event = threading.Event()

    def __enter__(self) -> "DcqcnRates":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop after one last round (so the end state is recorded)."""
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout=10)

    def run(self) -> None:
        while True:
            done = self._stop_event.is_set()
            try:
                self.round()
            except Exception as e:  # noqa: BLE001 - kept for the caller: a sampler must not kill the run
                self.errors.append(repr(e))
            if done:
                return
            self._stop_event.wait(self.interval_s)

    def round(self) -> None:
        """One round: QP tables read and paired, new QPs mapped, every QP's rate state recorded."""
        by_ip = {ip: host for host, (_d, _dev, ip) in self.hosts.items()}
        if not self._index:  # one device-list dump per run, not one per device per round
            listed = rdma_qps.devices()
            missing = sorted(dev for _d, dev, _ip in self.hosts.values() if dev not in listed)
            if missing:
                raise OSError(f"no RDMA device {', '.join(missing)} (listed: {', '.join(sorted(listed)) or 'none'})")
            self._index = {dev: listed[dev] for _d, dev, _ip in self.hosts.values()}
        tables = {ip: rdma_qps.qps(dev, self._index[dev]) for _d, dev, ip in self.hosts.values()}
        pairs = rdma_qps.pair_qps(tables)
        for host in self.order:
            dcqcn, _dev, ip = self.hosts[host]
            # QPs the device no longer lists (destroyed) leave the maps
            dcqcn.sync(pairs.get(ip, []), live={q.lqpn for q in tables[ip]})
        t = time.monotonic()
        for host in self.order:
            for r in self.hosts[host][0].rates():
                self.rows.append((f"{t:.6f}", host, by_ip.get(r.peer_ip, r.peer_ip), r.rqpn, r.rc_kbps, r.rt_kbps,
                                  f"{r.alpha:.5f}", r.rate_cuts, r.cnp_received, r.cnp_ignored))

    def write(self, rundir) -> None:
        """dcqcn_rates.csv into the run directory (testbed.rundir.RunDir)."""
        rundir.write_csv("dcqcn_rates.csv", COLUMNS, self.rows)


__all__ = ["COLUMNS", "DcqcnRates"]
