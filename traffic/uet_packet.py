"""The wire format of the agents' Ultra Ethernet-style transport (traffic.uet): one fixed header after UDP for every
packet, data, ACK and NACK alike, so a switch program (testbed/kernel/trim.bpf.c) finds the fields it needs at fixed
offsets.

What it stands for in UEC 1.0: the PDS header (packet delivery sublayer, RUD mode: reliable unordered delivery)
with its PSN, the SES header (semantic sublayer: message id, tag, offset, total length) and, in ACKs, the PDS ACK /
SACK fields (CACK_PSN: every PSN below it has arrived; ACK_PSN: the packet this ACK answers; SACK_PSN and a 64-bit
SACK bitmap; an ECN-CE echo) and the PDS NACK (here only one NACK code: the packet arrived trimmed). The spec packs
these into several smaller headers chosen by packet type; one header for all types is simpler to parse in eBPF and
costs ~40 bytes per packet. Over UDP, UEC puts the entropy value (EV) in the UDP source port; the destination port
is UEC's assigned 4793.

Layout (network byte order, HEADER_BYTES = 72):

    0  magic u8 (0x55)   1 type u8   2 flags u8   3 reserved u8
    4  src rank u16      6 dst rank u16
    8  psn u32 (DATA: its PSN; ACK/NACK: CACK_PSN)
   12  ack_psn u32 (ACK/NACK: the PSN answered)
   16  msg_id u32        20 payload_bytes u32 (DATA: bytes this packet carries, or carried before it was trimmed)
   24  tag u64           32 msg_bytes u64    40 offset u64 (ACK/NACK: rx_ts_ns, the data packet's arrival time)
   48  sack_psn u32      52 reserved u32     56 sack_bitmap u64
   64  ts_ns u64 (DATA: sender's clock at transmission; ACK/NACK: echoed from the data packet)

Both times are CLOCK_MONOTONIC, one clock for every namespace of one kernel (the host's, or the lab VM's: the VM
has its own clock, not the host's), so with both ends on the same kernel rx_ts_ns - ts_ns is the packet's one-way
delay: the window reacts to the queues on its own path, not to the queue the ACK met on the way back (another
flow's data; the spec's NSCC measures RTT, where ACKs have their own traffic class).
"""

from __future__ import annotations

import struct
from typing import NamedTuple

MAGIC = 0x55
UET_UDP_PORT = 4793  # IANA's port for UET over UDP
PORT_SPAN = 16  # several ranks on one host listen on 4793, 4794, ... (the trimming program matches all of them)
TYPE_DATA, TYPE_ACK, TYPE_NACK = 1, 2, 3
FLAG_TRIMMED = 0x01  # set by a switch that cut the payload off (packet trimming)
FLAG_ECN_ECHO = 0x02  # ACK/NACK: the data packet answered arrived with ECN-CE
FLAG_RETX = 0x04  # DATA: a retransmission

_HDR = struct.Struct("!BBBBHHIIIIQQQIIQQ")
HEADER_BYTES = _HDR.size
assert HEADER_BYTES == 72
#: offsets the switch program reads and writes (kept in step with trim.bpf.c)
TYPE_OFFSET, FLAGS_OFFSET = 1, 2
IPV4_UDP_BYTES = 20 + 8


def payload_bytes_for(mtu_bytes: int) -> int:
    """Payload per packet so that IPv4 + UDP + this header + payload fill `mtu_bytes`."""
    n = mtu_bytes - IPV4_UDP_BYTES - HEADER_BYTES
    if n <= 0:
        raise ValueError(f"mtu {mtu_bytes} leaves no room for a payload")
    return n


class Header(NamedTuple):
    type: int
    flags: int
    src: int
    dst: int
    psn: int
    ack_psn: int = 0
    msg_id: int = 0
    payload_bytes: int = 0
    tag: int = 0
    msg_bytes: int = 0
    offset: int = 0
    sack_psn: int = 0
    sack_bitmap: int = 0
    ts_ns: int = 0

    def pack(self) -> bytes:
        return _HDR.pack(MAGIC, self.type, self.flags, 0, self.src, self.dst, self.psn & 0xFFFFFFFF,
                         self.ack_psn & 0xFFFFFFFF, self.msg_id & 0xFFFFFFFF, self.payload_bytes, self.tag,
                         self.msg_bytes, self.offset, self.sack_psn & 0xFFFFFFFF, 0, self.sack_bitmap, self.ts_ns)


class BadPacket(ValueError):
    """Not a packet of this transport (wrong magic, too short, unknown type)."""


def unpack(data: bytes | memoryview) -> Header:
    if len(data) < HEADER_BYTES:
        raise BadPacket(f"{len(data)} bytes: shorter than the {HEADER_BYTES}-byte header")
    (magic, typ, flags, _r, src, dst, psn, ack_psn, msg_id, pbytes, tag, msg_bytes, offset, sack_psn, _r2, bitmap,
     ts) = _HDR.unpack_from(data)
    if magic != MAGIC or typ not in (TYPE_DATA, TYPE_ACK, TYPE_NACK):
        raise BadPacket(f"magic {magic:#x} type {typ}")
    return Header(typ, flags, src, dst, psn, ack_psn, msg_id, pbytes, tag, msg_bytes, offset, sack_psn, bitmap, ts)


__all__ = ["BadPacket", "FLAG_ECN_ECHO", "FLAG_RETX", "FLAG_TRIMMED", "HEADER_BYTES", "Header", "MAGIC",
           "TYPE_ACK", "TYPE_DATA", "TYPE_NACK", "UET_UDP_PORT", "payload_bytes_for", "unpack"]
