"""The hosts' SoftRoCE counters around a job (rdma.csv): what each rxe device's ``rdma statistic`` counted, read
before and after, as the RDMA NIC's hardware counters (retransmissions, sequence errors, RNR NAKs) would be on a
real host."""

from __future__ import annotations

from testbed.kernel.counters import rdma_counters

RDMA_COLUMNS = ["host", "device", "phase", "counter", "value"]


class RdmaCounters:
    """The hosts' rxe counters (``rdma statistic``) now; :meth:`stop` reads them again, writes rdma.csv (host,
    device, phase, counter, value) and returns the summed increase of every counter over the hosts."""

    def __init__(self, fabric, hosts):

        self._read = lambda: {h: rdma_counters(fabric.ns(h), fabric.rxe[h][0]) for h in hosts if h in fabric.rxe}
        self.device = {h: d for h, (d, _) in fabric.rxe.items()}
        self.before = self._read()
        self.after: dict | None = None

    def stop(self, rundir) -> dict[str, int]:
        if self.after is None:
            self.after = self._read()
            rundir.write_csv("rdma.csv", RDMA_COLUMNS, [(h, self.device[h], ph, k, v)
                                                        for ph, d in (("before", self.before), ("after", self.after))
                                                        for h in sorted(d) for k, v in sorted(d[h].items())])
        names = sorted({k for d in self.after.values() for k in d})
        return {k: sum(self.after[h].get(k, 0) - self.before.get(h, {}).get(k, 0) for h in self.after)
                for k in names}
