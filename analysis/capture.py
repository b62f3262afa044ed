"""A packet capture (pcap) at one port, decoded with scapy: what the wire itself says about loss recovery.

Models the view of **one capture point**: every packet that crossed it, in capture order. From that alone it
counts, per RoCEv2 queue pair and per TCP flow, the packets that were sent again -- so a lab can compare the wire
with the end hosts' own counters (rxe's ``rdma statistic``, the kernel's ``TcpRetransSegs``).

RoCE headers are dissected with scapy's ``scapy.contrib.roce`` BTH/AETH layers; Ethernet, IP, UDP and TCP headers
are read with ``struct`` (a full scapy dissection costs ~5x more per packet, which matters in the emulated VM).

RoCEv2 (UDP destination port 4791), keyed by ``(source IP, destination IP, destination QPN)``:

* request packets (SEND, RDMA WRITE, READ request, atomics) are followed in PSN order (24-bit, wrapping). A PSN
  ahead of the next expected one is a **PSN gap** (packets lost before this capture point); a PSN at or behind
  the highest one seen is a **retransmitted packet** (go-back-N replays everything from the lost PSN on, so
  packets the capture already saw cross it again). A run of consecutive retransmitted packets is one **replay**
  (one go-back-N episode: rxe counts those as ``completer_retry_err``);
* ACKNOWLEDGE packets are split by their AETH syndrome: ACK (``000``), RNR NAK (``001``), NAK (``011``; code 0
  is a PSN sequence error, the receiver asking for go-back-N); CNPs (opcode 0x81) are counted.

TCP, keyed by the 4-tuple of the sender: a segment carrying sequence space (payload, SYN or FIN) that starts
before the highest sequence number seen is a **retransmitted segment** (its range was seen before, at least in
part). Payload lengths come from the IP header, so a short snap length (``tcpdump -s 128``) loses nothing here.
Reordering between the sender and the capture point would also count (the fabric hashes each flow onto one path,
so it does not reorder).

ECN: every IPv4/IPv6 packet's ECN field is read; ``11`` is **CE** (marked by a queue), ``01``/``10`` ECT
(ECN-capable).

PFC: 802.1Qbb MAC control frames (EtherType 0x8808, opcode 0x0101; dissected with scapy's
``scapy.contrib.mac_control``) are counted per priority: an enabled priority with a pause time > 0 is an **XOFF**,
with pause time 0 an **XON** (testbed.pfc.controller's controller sends them when ``pause_frames`` is on).

:func:`decode` reads a file, :func:`decode_packets` any iterable of scapy packets; :meth:`Capture.summary` gives
the ``wire_*`` numbers a run puts in summary.json. ``python -m analysis.capture FILE.pcap`` prints them. The counts
themselves (queue pairs, flows, the summary) are :mod:`analysis.wire`'s; this module reads the file into them.
Pure logic: no kernel, no fabric, only the file.
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path
from typing import Iterable

import pandas as pd

from .wire import OP_ACK, OP_CNP, RESPONSE_OPS, ROCEV2_PORT, Capture, QpStats, TcpFlowStats

__all__ = ["ROCEV2_PORT", "Capture", "CaptureError", "QpStats", "TcpFlowStats", "decode", "decode_packets",
           "find_captures"]


class CaptureError(Exception):
    """The capture file is missing or is not a pcap/pcapng file (one-line message)."""


def _roce_layers():
    from scapy.contrib.roce import AETH, BTH  # importing binds UDP port 4791 to BTH, BTH opcode 0x11 to AETH

    return BTH, AETH


_ETH_IPV4, _ETH_IPV6, _ETH_VLAN = 0x0800, 0x86DD, (0x8100, 0x88A8)
_ETH_MAC_CONTROL = 0x8808
_PFC_OPCODE = 0x0101
_IPPROTO_TCP, _IPPROTO_UDP = 6, 17
#: pcap link types this decoder reads, and where the network-layer header starts (None: Ethernet, walk VLANs)
LINKTYPES = {1: None, 113: 16, 276: 20, 101: 0, 12: 0, 228: 0, 229: 0}


def _l3_offset(linktype: int, data: bytes) -> int | None:
    """Offset of the IP header in a frame of this link type (Ethernet with VLAN tags, Linux cooked v1/v2, raw)."""
    off = LINKTYPES.get(linktype, -1)
    if off == -1:
        return None
    if off is not None:
        return off
    if len(data) < 14:
        return None
    off, etype = 14, struct.unpack_from("!H", data, 12)[0]
    while etype in _ETH_VLAN and len(data) >= off + 4:
        etype = struct.unpack_from("!H", data, off + 2)[0]
        off += 4
    return off if etype in (_ETH_IPV4, _ETH_IPV6) else None


class _Decoder:
    """Walks raw frames: IP/UDP/TCP headers are read with struct (cheap, and exact on truncated frames because
    lengths come from the IP header); RoCE's BTH and AETH are dissected with scapy's layers."""

    def __init__(self, path: Path | None = None):
        self.cap = Capture(path=path)
        self.BTH, self.AETH = _roce_layers()

    def frame(self, linktype: int, data: bytes) -> None:
        cap = self.cap
        cap.packets += 1
        if linktype == 1 and len(data) >= 16 and data[12:14] == b"\x88\x08":
            self._mac_control(data)
            return
        off = _l3_offset(linktype, data)
        if off is None or len(data) < off + 1:
            return
        ver = data[off] >> 4
        if ver == 4 and len(data) >= off + 20:
            ihl = (data[off] & 0x0F) * 4
            tos, total, proto = data[off + 1], struct.unpack_from("!H", data, off + 2)[0], data[off + 9]
            src = ".".join(map(str, data[off + 12:off + 16]))
            dst = ".".join(map(str, data[off + 16:off + 20]))
            ecn, l4, l4_len = tos & 3, off + ihl, total - ihl
        elif ver == 6 and len(data) >= off + 40:
            import ipaddress

            ecn = (struct.unpack_from("!I", data, off)[0] >> 20) & 3
            l4_len, proto = struct.unpack_from("!HB", data, off + 4)
            src = str(ipaddress.IPv6Address(data[off + 8:off + 24]))
            dst = str(ipaddress.IPv6Address(data[off + 24:off + 40]))
            l4 = off + 40
        else:
            return
        cap.ip_packets += 1
        if ecn == 3:
            cap.ce_marked += 1
        elif ecn:
            cap.ect += 1
        if proto == _IPPROTO_UDP and len(data) >= l4 + 8:
            if struct.unpack_from("!H", data, l4 + 2)[0] == ROCEV2_PORT and len(data) >= l4 + 8 + 12:
                cap.roce_packets += 1
                # scapy dissects the BTH (12 bytes) and, on an ACKNOWLEDGE, the AETH (4); the payload is not needed
                # (frames are cut at the snap length) and the ICRC is not checked: zeros stand in for it
                b = l4 + 8
                n = 16 if data[b] == OP_ACK else 12
                bth = self.BTH(bytes(data[b:b + n]).ljust(n, b"\0") + b"\0\0\0\0")
                _roce(cap, src, dst, bth, ecn, self.AETH)
        elif proto == _IPPROTO_TCP and len(data) >= l4 + 14:
            cap.tcp_packets += 1
            sport, dport, seq = struct.unpack_from("!HHI", data, l4)
            hdr = (data[l4 + 12] >> 4) * 4
            flags = data[l4 + 13]
            key = (src, sport, dst, dport)
            f = cap.tcp.get(key)
            if f is None:
                f = cap.tcp[key] = TcpFlowStats(*key)
            payload = max(l4_len - hdr, 0)
            f.payload_bytes += payload
            if ecn == 3:
                f.ce += 1
            f.segment(seq, payload + (1 if flags & 0x02 else 0) + (1 if flags & 0x01 else 0))  # SYN, FIN


    def _mac_control(self, data: bytes) -> None:
        """An 802.3 MAC control frame: PFC (802.1Qbb) frames are counted per priority as XOFF / XON."""
        if struct.unpack_from("!H", data, 14)[0] != _PFC_OPCODE:
            return
        from scapy.contrib.mac_control import MACControlClassBasedFlowControl

        pfc = MACControlClassBasedFlowControl(bytes(data[14:34]).ljust(20, b"\0"))
        self.cap.pfc_frames += 1
        for prio in range(8):
            if getattr(pfc, f"c{prio}_enabled"):
                kind = "xoff" if getattr(pfc, f"c{prio}_pause_time") > 0 else "xon"
                self.cap.pfc[(prio, kind)] += 1


def decode_packets(packets: Iterable, path: Path | None = None) -> Capture:
    """Decode scapy packets (Ethernet frames, in capture order) into a :class:`Capture`."""
    d = _Decoder(path)
    for pkt in packets:
        d.frame(1, bytes(pkt))
    return d.cap


def _roce(cap: Capture, src: str, dst: str, bth, ecn: int, AETH) -> None:
    op = int(bth.opcode)
    key = (src, dst, int(bth.dqpn))
    q = cap.qps.get(key)
    if q is None:
        q = cap.qps[key] = QpStats(*key)
    q.packets += 1
    name = bth.get_field("opcode").i2s.get(op, f"0x{op:02x}")
    q.opcodes[name] += 1
    if ecn == 3:
        q.ce += 1
    if op == OP_CNP:
        q.cnps += 1
        return
    if (op & 0x1F) in RESPONSE_OPS:
        if op == OP_ACK:
            aeth = bth.getlayer(AETH)
            if aeth is None:
                return
            syn = int(aeth.syndrome)
            kind = syn >> 5
            if kind == 0:
                q.acks += 1
            elif kind == 1:
                q.rnr_naks += 1
            elif kind == 3:
                q.naks += 1
                if syn & 0x1F == 0:
                    q.nak_seq_err += 1
        return
    q.request(int(bth.psn))


def decode(path: str | Path) -> Capture:
    """Decode a pcap or pcapng file. A zero-byte file (a capture stopped before it wrote its header) decodes as
    an empty capture with a note; a missing or unreadable file raises :class:`CaptureError`. Frames of a link
    type other than Ethernet, Linux cooked or raw IP are counted and skipped (with a note)."""
    from scapy.error import Scapy_Exception
    from scapy.utils import RawPcapReader

    p = Path(path)
    if not p.is_file():
        raise CaptureError(f"{p}: no such capture file")
    if p.stat().st_size == 0:
        cap = Capture(path=p)
        cap.notes.append(f"{p.name}: empty file (no pcap header): nothing was captured")
        return cap
    try:
        reader = RawPcapReader(str(p))
    except (Scapy_Exception, OSError, EOFError, ValueError) as e:
        raise CaptureError(f"{p}: not a pcap/pcapng file ({str(e).strip() or type(e).__name__})") from None
    d = _Decoder(p)
    default_lt = getattr(reader, "linktype", 1)
    odd: set[int] = set()
    try:
        while True:
            try:
                rec = reader._read_packet()
            except EOFError:
                break
            except (Scapy_Exception, OSError, ValueError, struct.error) as e:
                d.cap.notes.append(f"{p.name}: stopped at a damaged record ({e})")
                break
            if rec is None:
                break
            data, meta = rec
            lt = getattr(meta, "linktype", None) or default_lt
            if lt not in LINKTYPES:
                odd.add(lt)
            d.frame(lt, data)
    finally:
        reader.close()
    if odd:
        d.cap.notes.append(f"{p.name}: frames of link type(s) {sorted(odd)} were not decoded")
    return d.cap


def find_captures(run_dir: str | Path) -> list[Path]:
    """The capture files a run wrote (``capture-<node>-<ifname>.pcap``), sorted."""
    return sorted(Path(run_dir).glob("capture-*.pcap"))


def main(argv: list[str] | None = None) -> int:
    """``python -m analysis.capture FILE.pcap [--json]``: per-QP and per-flow tables and the wire summary."""
    args = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in args
    files = [a for a in args if a != "--json"]
    if len(files) != 1:
        print("usage: python -m analysis.capture FILE.pcap [--json]", file=sys.stderr)
        return 2
    try:
        cap = decode(files[0])
    except CaptureError as e:
        print(f"analysis.capture: {e}", file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps({**cap.summary(), "notes": cap.notes}, indent=2))
        return 0
    with pd.option_context("display.width", 200, "display.max_columns", 30, "display.max_colwidth", 60):
        if cap.qps:
            print(cap.qp_frame().drop(columns=["opcodes"]).to_string(index=False))
        if cap.tcp:
            print(cap.tcp_frame().to_string(index=False))
    for k, v in cap.summary().items():
        print(f"{k:<34} {v}")
    for n in cap.notes:
        print(f"note: {n}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
