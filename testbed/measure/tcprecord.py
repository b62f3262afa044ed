"""The hosts' kernel TCP/IP counters around an experiment: what ``nstat`` shows (TcpRetransSegs,
TcpExtTCPTimeouts, IpExtInCEPkts, ...), read once before the traffic and once after, written as ``tcp.csv``
(``host, phase, counter, value``; phase ``before``/``after``), the file analysis computes retransmits, timeouts and
CE marks from."""

from __future__ import annotations

from typing import Mapping

from testbed.kernel import counters

COLUMNS = ["host", "phase", "counter", "value"]


class TcpCounters:
    """``TcpCounters({host: namespace})`` reads the counters now; :meth:`stop` reads them again, writes tcp.csv into
    the run directory (once) and returns the per-host increases of :data:`testbed.kernel.counters.KEY_COUNTERS`."""

    def __init__(self, namespaces: Mapping[str, str]):
        self.namespaces = dict(namespaces)
        self.before = {h: counters.tcp_counters(ns) for h, ns in self.namespaces.items()}
        self.after: dict[str, dict[str, int]] | None = None

    def stop(self, rundir=None) -> dict[str, dict[str, int]]:
        if self.after is None:
            self.after = {h: counters.tcp_counters(ns) for h, ns in self.namespaces.items()}
            if rundir is not None:
                rundir.write_csv("tcp.csv", COLUMNS, [(h, ph, k, d[h].get(k, 0))
                                                      for ph, d in (("before", self.before), ("after", self.after))
                                                      for h in self.namespaces for k in counters.KEY_COUNTERS])
        return {h: {k: self.after[h].get(k, 0) - self.before[h].get(k, 0) for k in counters.KEY_COUNTERS}
                for h in self.namespaces}
