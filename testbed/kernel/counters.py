"""Kernel TCP counters of one namespace (/proc/net/snmp and /proc/net/netstat, as `nstat` reads them)."""

from __future__ import annotations

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
