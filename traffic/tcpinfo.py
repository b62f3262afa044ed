"""A TCP socket's kernel state: ``struct tcp_info`` (getsockopt TCP_INFO, include/uapi/linux/tcp.h) as a dict, and
its congestion control (TCP_CONGESTION), for the collective agents' sockets and the incast senders'."""

from __future__ import annotations

import socket
import struct

from traffic.transport import TransportError

# struct tcp_info (include/uapi/linux/tcp.h) up to tcpi_reord_seen
_TCP_INFO_LEN = 232
_TCP_INFO_FIELDS = (
    ["state", "ca_state", "retransmits", "probes", "backoff", "options", "wscale", "flags8"]
    + ["rto_us", "ato_us", "snd_mss", "rcv_mss", "unacked", "sacked", "lost", "retrans", "fackets",
       "last_data_sent_ms", "last_ack_sent_ms", "last_data_recv_ms", "last_ack_recv_ms", "pmtu", "rcv_ssthresh",
       "rtt_us", "rttvar_us", "snd_ssthresh", "snd_cwnd", "advmss", "reordering", "rcv_rtt_us", "rcv_space",
       "total_retrans"]
    + ["pacing_rate", "max_pacing_rate", "bytes_acked", "bytes_received"]
    + ["segs_out", "segs_in", "notsent_bytes", "min_rtt_us", "data_segs_in", "data_segs_out"]
    + ["delivery_rate", "busy_time_us", "rwnd_limited_us", "sndbuf_limited_us"]
    + ["delivered", "delivered_ce", "bytes_sent", "bytes_retrans", "dsack_dups", "reord_seen"]
)
_TCP_INFO = struct.Struct("<8B24I4Q6I4Q2I2Q2I")
assert _TCP_INFO.size == 224 and len(_TCP_INFO_FIELDS) == 8 + 24 + 4 + 6 + 4 + 6
#: the TCP_INFO fields an agent records at op boundaries (tcp_info.csv)
INFO_KEYS = ("state", "ca_state", "retransmits", "backoff", "rto_us", "rtt_us", "rttvar_us", "min_rtt_us",
             "snd_cwnd", "snd_ssthresh", "unacked", "lost", "retrans", "total_retrans", "bytes_acked",
             "bytes_received", "bytes_retrans", "segs_out", "delivered_ce", "delivery_rate", "notsent_bytes")


def tcp_info(sock: socket.socket) -> dict[str, int]:
    """The socket's struct tcp_info as a dict (fields the running kernel does not fill read as 0)."""
    raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
    raw = raw[: _TCP_INFO.size].ljust(_TCP_INFO.size, b"\0")
    return dict(zip(_TCP_INFO_FIELDS, _TCP_INFO.unpack(raw)))


def set_cc(sock: socket.socket, cc: str | None) -> str:
    """Set TCP_CONGESTION on the socket (when cc is given); return what the socket actually uses."""
    if cc:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc.encode())
        except OSError as e:
            raise TransportError(f"setsockopt TCP_CONGESTION {cc!r}: {e.strerror} (is tcp_{cc} loaded?)") from None
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).split(b"\0", 1)[0].decode()
