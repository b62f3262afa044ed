"""Kernel counters of one namespace: TCP (/proc/net/snmp and /proc/net/netstat, as `nstat` reads them) and rxe's
RDMA port counters (`rdma statistic`)."""

from __future__ import annotations

import json
import subprocess

from testbed.errors import KernelToolError
from testbed.kernel import netns


def _parse(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    lines = text.splitlines()
    for head, vals in zip(lines[::2], lines[1::2]):
        proto, names = head.split(":", 1)
        _, values = vals.split(":", 1)
        for n, v in zip(names.split(), values.split()):
            if proto in ("Tcp", "TcpExt", "IpExt", "Ip"):
                try:
                    out[f"{proto}{n}"] = int(v)
                except ValueError:
                    pass
    return out


def tcp_counters(ns: str | None) -> dict[str, int]:
    """TcpRetransSegs, TcpOutSegs, TcpExtTCPTimeouts, IpExtInCEPkts, ... of the namespace."""
    def read() -> dict[str, int]:
        c = {}
        for f in ("snmp", "netstat"):
            with open(f"/proc/thread-self/net/{f}") as fh:
                c.update(_parse(fh.read()))
        return c

    if ns is None:
        return read()
    with netns.entered(ns):
        return read()


KEY_COUNTERS = ("TcpRetransSegs", "TcpOutSegs", "TcpInSegs", "TcpExtTCPTimeouts", "TcpExtTCPLostRetransmit",
                "TcpExtTCPSpuriousRTOs", "TcpExtTCPFastRetrans", "IpExtInCEPkts", "IpExtInECT0Pkts",
                "IpExtInECT1Pkts", "IpExtInNoECTPkts", "TcpExtTCPDeliveredCE", "TcpExtTCPSynRetrans",
                "TcpExtTCPLossProbes", "TcpExtTCPDSACKRecv", "TcpExtTCPRcvQDrop", "TcpExtTCPBacklogDrop",
                "TcpExtTCPOFODrop", "TcpExtTCPRcvCollapsed", "TcpExtTCPSpuriousRtxHostQueues")


def rdma_counters(ns: str | None, dev: str) -> dict[str, int]:
    """rxe's hardware counters of port 1 (``rdma statistic show link <dev>/1``), run inside namespace ``ns``."""
    argv = ["rdma", "-j", "statistic", "show", "link", f"{dev}/1"]
    if ns:
        r = netns.run(ns, argv, timeout=30)
    else:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise KernelToolError(f"rdma statistic {dev}: {(r.stderr or r.stdout).strip()}")
    out: dict[str, int] = {}
    for entry in json.loads(r.stdout or "[]"):
        for k, val in entry.items():
            if k not in ("ifindex", "port") and isinstance(val, int) and not isinstance(val, bool):
                out[k] = val
    return out
