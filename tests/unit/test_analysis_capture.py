"""analysis.capture: small pcaps built with scapy, decoded back into known answers (go-back-N replay, NAK, TCP
retransmission, CE mark), and the edge cases (empty file, missing file, not a pcap, truncated frames)."""

import json

import pytest
from scapy.contrib.roce import AETH, BTH
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw
from scapy.utils import wrpcap

from analysis.capture import CaptureError, decode, decode_packets, find_captures, main

A, B = "10.0.1.1", "10.0.2.1"
WRITE_MIDDLE, WRITE_LAST_IMM, SEND_ONLY, ACK = 0x07, 0x09, 0x04, 0x11


def req(psn, op=WRITE_MIDDLE, qpn=17, src=A, dst=B, tos=0):
    return (Ether() / IP(src=src, dst=dst, tos=tos) / UDP(sport=49152, dport=4791)
            / BTH(opcode=op, dqpn=qpn, psn=psn) / Raw(b"\xab" * 1024))


def ack(psn, syndrome=0x1F, qpn=33, src=B, dst=A):
    return (Ether() / IP(src=src, dst=dst) / UDP(sport=49152, dport=4791)
            / BTH(opcode=ACK, dqpn=qpn, psn=psn) / AETH(syndrome=syndrome, msn=1))


def seg(seq, n, src=A, dst=B, flags="A", tos=0, sport=40000, dport=5201):
    p = Ether() / IP(src=src, dst=dst, tos=tos) / TCP(sport=sport, dport=dport, seq=seq, flags=flags)
    return p / Raw(b"x" * n) if n else p


def write(tmp_path, pkts, name="c.pcap"):
    path = tmp_path / name
    wrpcap(str(path), pkts, snaplen=128)  # what the scenario's tcpdump -s 128 keeps
    return path


def test_go_back_n_replay_after_nak(tmp_path):
    # 100..104 cross the capture point; 102 is lost after it; the responder NAKs (PSN sequence error, expecting
    # 102); the requester replays 102..104 and goes on with 105, 106
    pkts = [req(p) for p in range(100, 105)] + [ack(102, syndrome=0x60)]
    pkts += [req(p) for p in (102, 103, 104, 105)] + [req(106, WRITE_LAST_IMM)] + [ack(106)]
    cap = decode(write(tmp_path, pkts))
    s = cap.summary()
    assert s["wire_packets"] == 12 and s["wire_roce_packets"] == 12
    assert s["wire_roce_requests"] == 10
    assert s["wire_roce_retransmitted_packets"] == 3  # 102, 103, 104 again
    assert s["wire_roce_replays"] == 1
    assert s["wire_roce_psn_gaps"] == 0
    assert s["wire_roce_naks"] == 1 and s["wire_roce_nak_seq_err"] == 1
    assert s["wire_roce_acks"] == 1 and s["wire_roce_rnr_naks"] == 0
    q = cap.qps[(A, B, 17)]
    assert q.high_psn == 106 and q.first_psn == 100
    assert q.opcodes == {"RC_RDMA_WRITE_MIDDLE": 9, "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE": 1}
    back = cap.qps[(B, A, 33)]
    assert back.requests == 0 and back.acks == 1 and back.naks == 1


def test_loss_before_the_capture_point_is_a_gap_then_a_retransmission(tmp_path):
    # 11 and 12 never reach the capture point: a gap of 2; the replay from 11 is 11, 12 (retransmitted: behind
    # the highest PSN seen) and 13, 14 (seen before) -> 4 retransmitted packets in one replay
    pkts = [req(p) for p in (10, 13, 14)] + [req(p) for p in (11, 12, 13, 14, 15)]
    s = decode(write(tmp_path, pkts)).summary()
    assert s["wire_roce_psn_gaps"] == 1
    assert s["wire_roce_retransmitted_packets"] == 4 and s["wire_roce_replays"] == 1


def test_two_replays_and_psn_wraparound(tmp_path):
    top = (1 << 24) - 2
    psns = [top, top + 1, 0, 1, top + 1, 0, 1, 2, 3, 1, 2, 3, 4]  # wraps 2^24 -> 0; two go-back-N episodes
    pkts = [req(p % (1 << 24)) for p in psns]
    q = decode_packets(pkts).qps[(A, B, 17)]
    assert q.retransmitted == 3 + 3 and q.replays == 2 and q.psn_gaps == 0 and q.high_psn == 4


def test_queue_pairs_are_kept_apart(tmp_path):
    pkts = [req(1, qpn=17), req(2, qpn=17), req(50, qpn=18), req(1, qpn=17, src="10.0.3.1"), req(51, qpn=18)]
    cap = decode(write(tmp_path, pkts))
    assert set(cap.qps) == {(A, B, 17), (A, B, 18), ("10.0.3.1", B, 17)}
    assert cap.summary()["wire_roce_retransmitted_packets"] == 0
    df = cap.qp_frame()
    assert len(df) == 3 and df["requests"].sum() == 5


def test_rnr_nak_and_other_nak_codes(tmp_path):
    pkts = [req(5), ack(5, syndrome=0x20 | 12), ack(5, syndrome=0x60 | 2), ack(6, syndrome=0x1F)]
    s = decode(write(tmp_path, pkts)).summary()
    assert s["wire_roce_rnr_naks"] == 1
    assert s["wire_roce_naks"] == 1 and s["wire_roce_nak_seq_err"] == 0  # remote access error, not a PSN error
    assert s["wire_roce_acks"] == 1


def test_tcp_retransmission(tmp_path):
    isn = 1000
    pkts = [seg(isn - 1, 0, flags="S")]  # SYN takes one sequence number
    pkts += [seg(isn + i * 1448, 1448) for i in range(4)]  # 4 segments
    pkts += [seg(isn + 1448, 1448)]  # the second one again: retransmitted
    pkts += [seg(isn + 4 * 1448, 1448)]  # new data
    pkts += [seg(5000, 0, src=B, dst=A, sport=5201, dport=40000)]  # a pure ACK the other way
    cap = decode(write(tmp_path, pkts))
    s = cap.summary()
    assert s["wire_tcp_segments"] == 8
    assert s["wire_tcp_retransmitted_segments"] == 1
    f = cap.tcp[(A, 40000, B, 5201)]
    assert f.data_segments == 7 and f.retransmitted == 1 and f.retransmitted_bytes == 1448
    assert f.payload_bytes == 6 * 1448  # from the IP header: the frames were cut at 128 bytes
    assert cap.tcp[(B, 5201, A, 40000)].data_segments == 0
    assert s["wire_roce_packets"] == 0


def test_tcp_sequence_wraparound_is_not_a_retransmission():
    start = (1 << 32) - 1448
    pkts = [seg(start, 1448), seg(0, 1448), seg(1448, 1448)]
    assert decode_packets(pkts).summary()["wire_tcp_retransmitted_segments"] == 0


def test_ce_marks_and_ect(tmp_path):
    pkts = [seg(1, 100, tos=0x03), seg(101, 100, tos=0x02), seg(201, 100, tos=0x01), seg(301, 100),
            req(7, tos=(26 << 2) | 3), req(8, tos=26 << 2)]
    cap = decode(write(tmp_path, pkts))
    s = cap.summary()
    assert s["wire_ce_marked_packets"] == 2 and s["wire_ect_packets"] == 2
    assert cap.tcp[(A, 40000, B, 5201)].ce == 1 and cap.qps[(A, B, 17)].ce == 1


def test_non_ip_and_other_udp_are_counted_not_decoded(tmp_path):
    from scapy.layers.l2 import ARP

    pkts = [Ether() / ARP(), Ether() / IP(src=A, dst=B) / UDP(sport=4791, dport=53) / Raw(b"q" * 20), req(1)]
    s = decode(write(tmp_path, pkts)).summary()
    assert s["wire_packets"] == 3 and s["wire_roce_packets"] == 1 and s["wire_roce_requests"] == 1


def test_empty_pcap_has_no_packets(tmp_path):
    cap = decode(write(tmp_path, []))  # header only: a capture that saw nothing
    assert cap.packets == 0 and cap.notes == []
    s = cap.summary()
    assert s.pop("wire_pfc_by_priority") == "" and all(v == 0 for v in s.values())
    assert cap.qp_frame().empty and "retransmitted" in cap.qp_frame().columns
    zero = tmp_path / "zero.pcap"
    zero.write_bytes(b"")  # tcpdump killed before it wrote the header
    cap = decode(zero)
    assert cap.packets == 0 and "empty file" in cap.notes[0]


def test_missing_and_garbage_files_are_one_line_errors(tmp_path):
    with pytest.raises(CaptureError, match="no such capture file"):
        decode(tmp_path / "nope.pcap")
    bad = tmp_path / "bad.pcap"
    bad.write_bytes(b"this is not a capture file at all")
    with pytest.raises(CaptureError, match="not a pcap") as e:
        decode(bad)
    assert "\n" not in str(e.value)


def test_truncated_last_record_keeps_the_rest(tmp_path):
    path = write(tmp_path, [req(1), req(2), req(3)])
    data = path.read_bytes()
    path.write_bytes(data[:-40])  # the writer died inside the last frame
    s = decode(path).summary()
    assert s["wire_roce_requests"] in (2, 3) and s["wire_roce_retransmitted_packets"] == 0


def test_find_captures_and_cli(tmp_path, capsys):
    write(tmp_path, [req(1), req(1)], "capture-h1-eth0.pcap")
    (tmp_path / "ops.csv").write_text("x\n")
    assert [p.name for p in find_captures(tmp_path)] == ["capture-h1-eth0.pcap"]
    assert main([str(tmp_path / "capture-h1-eth0.pcap"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["wire_roce_retransmitted_packets"] == 1 and out["notes"] == []
    assert main([str(tmp_path / "nope.pcap")]) == 2
    assert "no such capture file" in capsys.readouterr().err


def test_pfc_frames_are_counted_per_priority(tmp_path):
    from testbed.pfc.frame import pfc_frame

    xoff, xon = pfc_frame("02:00:00:00:00:01", 3, 0xFFFF), pfc_frame("02:00:00:00:00:01", 3, 0)
    other = pfc_frame("02:00:00:00:00:01", 5, 100)
    pause_8023x = bytes.fromhex("0180c2000001020000000001" "8808" "0001" "ffff").ljust(60, b"\0")  # not PFC
    path = write(tmp_path, [Ether(xoff), seg(1000, 100), Ether(xon), Ether(xoff), Ether(other), Ether(pause_8023x)])
    s = decode(path).summary()
    assert s["wire_pfc_frames"] == 4 and s["wire_pfc_xoff_frames"] == 3 and s["wire_pfc_xon_frames"] == 1
    assert s["wire_pfc_by_priority"] == "3:xoff=2; 3:xon=1; 5:xoff=1"
    assert s["wire_tcp_segments"] == 1 and s["wire_packets"] == 6
