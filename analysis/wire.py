"""What one capture point counts: per RoCEv2 queue pair (requests in PSN order, retransmitted packets, go-back-N
replays, PSN gaps, ACK / NAK / RNR NAK / CNP) and per TCP flow (segments, retransmitted segments), plus ECN and PFC
frames, and the ``wire_*`` numbers a run puts in summary.json. :mod:`analysis.capture` fills these from a pcap."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

#: RoCEv2's UDP destination port (IANA)
ROCEV2_PORT = 4791
PSN_SPACE = 1 << 24
SEQ_SPACE = 1 << 32
OP_ACK = 0x11  # RC ACKNOWLEDGE (carries an AETH)
OP_CNP = 0x81
#: low five opcode bits of the RC responder's packets (read responses, ACK, atomic ACK): not requests
RESPONSE_OPS = range(0x0D, 0x13)


@dataclass
class QpStats:
    """RoCEv2 packets sent by ``src`` to queue pair ``dqpn`` on ``dst`` that crossed the capture point."""

    src: str
    dst: str
    dqpn: int
    packets: int = 0
    requests: int = 0
    opcodes: Counter = field(default_factory=Counter)
    psn_gaps: int = 0
    psn_missing: int = 0
    retransmitted: int = 0
    replays: int = 0
    acks: int = 0
    naks: int = 0
    nak_seq_err: int = 0
    rnr_naks: int = 0
    cnps: int = 0
    ce: int = 0
    first_psn: int | None = None
    high_psn: int | None = None
    _replaying: bool = False

    def request(self, psn: int) -> None:
        """Follow one request packet's PSN (see the module docstring for gap / retransmission)."""
        self.requests += 1
        if self.high_psn is None:
            self.first_psn = self.high_psn = psn
            return
        d = (psn - self.high_psn) % PSN_SPACE
        if d == 0 or d >= PSN_SPACE // 2:  # seen before, or behind the highest: sent again
            self.retransmitted += 1
            if not self._replaying:
                self.replays += 1
                self._replaying = True
            return
        self._replaying = False
        if d > 1:
            self.psn_gaps += 1
            self.psn_missing += d - 1
        self.high_psn = psn

    def row(self) -> dict:
        return {"src": self.src, "dst": self.dst, "dqpn": self.dqpn, "packets": self.packets,
                "requests": self.requests, "psn_gaps": self.psn_gaps, "psn_missing": self.psn_missing,
                "retransmitted": self.retransmitted, "replays": self.replays, "acks": self.acks, "naks": self.naks,
                "nak_seq_err": self.nak_seq_err, "rnr_naks": self.rnr_naks, "cnps": self.cnps, "ce": self.ce,
                "opcodes": ",".join(f"{k}={v}" for k, v in sorted(self.opcodes.items()))}


@dataclass
class TcpFlowStats:
    """TCP segments of one direction of one connection (``src:sport -> dst:dport``) at the capture point."""

    src: str
    sport: int
    dst: str
    dport: int
    segments: int = 0
    data_segments: int = 0
    payload_bytes: int = 0
    retransmitted: int = 0
    retransmitted_bytes: int = 0
    ce: int = 0
    high_seq: int | None = None

    def segment(self, seq: int, length: int) -> None:
        """Follow one segment occupying ``length`` bytes of sequence space from ``seq`` (0: a pure ACK)."""
        self.segments += 1
        if length <= 0:
            return
        self.data_segments += 1
        end = (seq + length) % SEQ_SPACE
        if self.high_seq is None:
            self.high_seq = end
            return
        if (seq - self.high_seq) % SEQ_SPACE >= SEQ_SPACE // 2:  # starts before the highest byte seen
            self.retransmitted += 1
            self.retransmitted_bytes += min(length, (self.high_seq - seq) % SEQ_SPACE)
            if 0 < (end - self.high_seq) % SEQ_SPACE < SEQ_SPACE // 2:
                self.high_seq = end
            return
        self.high_seq = end

    def row(self) -> dict:
        return {"src": self.src, "sport": self.sport, "dst": self.dst, "dport": self.dport,
                "segments": self.segments, "data_segments": self.data_segments,
                "payload_bytes": self.payload_bytes, "retransmitted": self.retransmitted,
                "retransmitted_bytes": self.retransmitted_bytes, "ce": self.ce}


@dataclass
class Capture:
    """Everything decoded from one capture."""

    path: Path | None = None
    packets: int = 0
    ip_packets: int = 0
    roce_packets: int = 0
    tcp_packets: int = 0
    ce_marked: int = 0
    ect: int = 0
    qps: dict[tuple[str, str, int], QpStats] = field(default_factory=dict)
    tcp: dict[tuple[str, int, str, int], TcpFlowStats] = field(default_factory=dict)
    pfc_frames: int = 0
    pfc: Counter = field(default_factory=Counter)  # (priority, "xoff" | "xon") -> frames
    notes: list[str] = field(default_factory=list)

    def qp_frame(self) -> pd.DataFrame:
        """One row per queue pair (QpStats.row); empty with the columns when there was no RoCE traffic."""
        cols = list(QpStats("", "", 0).row())
        return pd.DataFrame([q.row() for q in self.qps.values()], columns=cols)

    def tcp_frame(self) -> pd.DataFrame:
        cols = list(TcpFlowStats("", 0, "", 0).row())
        return pd.DataFrame([f.row() for f in self.tcp.values()], columns=cols)

    def summary(self) -> dict:
        """The ``wire_*`` numbers for summary.json (docs/analysis.md lists them)."""
        q = list(self.qps.values())
        t = list(self.tcp.values())
        return {
            "wire_packets": self.packets,
            "wire_roce_packets": self.roce_packets,
            "wire_roce_qps": len(q),
            "wire_roce_requests": sum(x.requests for x in q),
            "wire_roce_retransmitted_packets": sum(x.retransmitted for x in q),
            "wire_roce_replays": sum(x.replays for x in q),
            "wire_roce_psn_gaps": sum(x.psn_gaps for x in q),
            "wire_roce_acks": sum(x.acks for x in q),
            "wire_roce_naks": sum(x.naks for x in q),
            "wire_roce_nak_seq_err": sum(x.nak_seq_err for x in q),
            "wire_roce_rnr_naks": sum(x.rnr_naks for x in q),
            "wire_roce_cnps": sum(x.cnps for x in q),
            "wire_tcp_segments": sum(x.segments for x in t),
            "wire_tcp_retransmitted_segments": sum(x.retransmitted for x in t),
            "wire_ce_marked_packets": self.ce_marked,
            "wire_ect_packets": self.ect,
            "wire_pfc_frames": self.pfc_frames,
            "wire_pfc_xoff_frames": sum(n for (_, kind), n in self.pfc.items() if kind == "xoff"),
            "wire_pfc_xon_frames": sum(n for (_, kind), n in self.pfc.items() if kind == "xon"),
            "wire_pfc_by_priority": "; ".join(f"{prio}:{kind}={n}" for (prio, kind), n in sorted(self.pfc.items())),
        }
