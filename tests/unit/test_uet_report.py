"""The report of a UET run, on hand-made run directories (tests.unit.test_report_story's incast, plus uet.csv and
trim.csv): the story's UET sentences with their numbers (trimming answered by NACKs; losses found by the timer;
trimmed headers left unanswered; trimming on with nothing trimmed), a UET timer expiry counting as a timeout for
the incast's RTOmin rounds, the UET panel (with and without the switch ports' row), and a run without uet.csv
getting neither."""

from __future__ import annotations

import struct
from pathlib import Path

import pandas as pd

from analysis.load import load_run
from analysis.report import write_report
from analysis.uet import per_host, per_port
from analysis.uetplot import _ports, uet_panel
from analysis.uet import sentences as uet_sentences
from tests.unit.test_report_story import collective_run, incast_run, sentences

UCOLS = ["rank", "host", "counter", "value"]
TCOLS = ["node", "port", "counter", "value"]


def add_uet(run: Path, per_sender: dict[str, dict[str, int]], trimmed_received: int = 0) -> Path:
    """uet.csv: receiver h1 (the trimmed headers it got, ACKs), then each sender's counters, as two appends (every
    burst writes its rows: the analysis sums them)."""
    rows = [(0, "h1", "trimmed_received", trimmed_received), (0, "h1", "acks_sent", 160)]
    for i, (host, counters) in enumerate(per_sender.items(), start=1):
        half = {k: v // 2 for k, v in counters.items()}
        rows += [(i, host, k, v) for k, v in half.items()]
        rows += [(i, host, k, v - half[k]) for k, v in counters.items()]
    pd.DataFrame(rows, columns=UCOLS).to_csv(run / "uet.csv", index=False)
    return run


def add_trim(run: Path, ports: dict[str, tuple[int, int]], buffer_bytes: int | None = 8000) -> Path:
    """trim.csv: per "node:port", (trimmed packets, virtual queue peak bytes), and each port's buffer with half of
    it as its threshold (None: a file written before trim.csv had them)."""
    rows = []
    for name, (trimmed, peak) in ports.items():
        node, port = name.split(":")
        rows += [(node, port, "packets", 500), (node, port, "trimmed_packets", trimmed),
                 (node, port, "vq_peak_bytes", peak)]
        if buffer_bytes:
            rows += [(node, port, "threshold_bytes", buffer_bytes // 2), (node, port, "buffer_bytes", buffer_bytes)]
    pd.DataFrame(rows, columns=TCOLS).to_csv(run / "trim.csv", index=False)
    return run


def zero_tcp_timeouts(run: Path) -> None:
    """tcp.csv as a UET incast records it: TCP carried nothing, so it never timed out."""
    pd.DataFrame([("h5", "before", "TcpExtTCPTimeouts", 2), ("h5", "after", "TcpExtTCPTimeouts", 2)],
                 columns=["host", "phase", "counter", "value"]).to_csv(run / "tcp.csv", index=False)


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


SENT = {"h2": 40, "h3": 40, "h4": 40, "h5": 40}


def trimmed_run(run: Path, nack=(10, 8, 7, 5), received=30, ports=None, buffer_bytes: int | None = 8000) -> Path:
    """Trim on: 4 senders x 40 packets, every loss a trimmed packet resent on a NACK."""
    incast_run(run, rto_rounds=())
    add_uet(run, {h: {"data_packets": d, "retransmitted_packets": r, "nack_retransmits": r, "nacks_received": r}
                  for (h, d), r in zip(SENT.items(), nack)}, trimmed_received=received)
    return add_trim(run, ports or {"leaf1:h1": (30, 7900), "spine1:leaf1": (0, 1200)}, buffer_bytes)


def timer_run(run: Path) -> Path:
    """Trim off: the incast's 3 RTOmin rounds (drops at leaf1:h1), h5's timer expired 3 times."""
    incast_run(run)
    zero_tcp_timeouts(run)
    return add_uet(run, {"h2": {"data_packets": 40, "retransmitted_packets": 4, "fast_retransmits": 4},
                         "h5": {"data_packets": 40, "retransmitted_packets": 6, "rto_retransmits": 6,
                                "rto_events": 3}})


def test_trimming_answered_by_nacks_is_told_with_its_numbers(tmp_path):
    said = sentences(trimmed_run(tmp_path / "on"))
    assert said[-2] == ("The UET senders sent 160 data packets and 30 retransmissions (18.8% of the data packets); "
                        "they found 0 losses by the timer, 0 by the SACK rule and 30 by a NACK.")
    assert said[-1] == ("30 packets were trimmed at switch ports (all at leaf1:h1) and all 30 were answered by NACK "
                        "resends; no retransmission timer expired.")


def test_losses_found_by_the_timer_are_told_and_make_the_slow_rounds_rtomin_rounds(tmp_path):
    said = sentences(timer_run(tmp_path / "off"))
    # TCP carried nothing and never timed out; UET's own timer did: the slow rounds are RTOmin rounds
    assert said[0].startswith("3 of 10 incast rounds took 216-226 ms against an ideal 32 ms; each had a sender that "
                              "waited RTOmin (200 ms) after drops at leaf1:h1"), said
    assert said[-2] == ("The UET senders sent 80 data packets and 10 retransmissions (12.5% of the data packets); "
                        "they found 6 losses by the timer, 4 by the SACK rule and 0 by a NACK.")
    assert said[-1] == "3 retransmission timer expiries: 6 losses were found by timeout."


def test_slow_uet_rounds_without_a_timer_expiry_are_not_blamed_on_rtomin(tmp_path):
    run = incast_run(tmp_path / "i")
    zero_tcp_timeouts(run)
    add_uet(run, {"h5": {"data_packets": 40}})
    said = sentences(run)
    assert said[0].startswith("All 10 incast rounds took 33-226 ms") and "RTOmin" not in said[0], said
    assert said[-2] == "The UET senders sent 40 data packets and resent none."
    assert said[-1] == "No retransmission timer expired."


def test_unanswered_headers_and_the_busiest_port_are_named(tmp_path):
    run = trimmed_run(tmp_path / "u", nack=(10, 8, 7, 2), received=28,
                      ports={"leaf1:h1": (20, 7900), "spine1:leaf1": (10, 6000)})
    assert sentences(run)[-1] == ("30 packets were trimmed at switch ports (most at leaf1:h1: 20); the receivers got "
                                  "28 trimmed headers and the senders resent 27 on a NACK (1 trimmed header "
                                  "unanswered); no retransmission timer expired.")
    run = trimmed_run(tmp_path / "z", nack=(0, 0, 0, 0), received=0, ports={"leaf1:h1": (0, 900), "s:p": (0, 0)})
    assert sentences(run)[-1] == ("Trimming was on at 2 switch ports but no port's queue reached its threshold "
                                  "(nothing trimmed); no retransmission timer expired.")


def test_a_count_of_one_is_told_in_the_singular():
    m = {"uet_hosts": 2, "uet_data_packets": 1, "uet_retransmitted_packets": 1, "uet_nack_retransmits": 1,
         "uet_retransmit_fraction": 1.0, "uet_trimmed_packets": 1, "uet_trimmed_received": 1, "uet_rto_events": 0}
    said = uet_sentences(m)
    assert said[0].startswith("The UET senders sent 1 data packet and 1 retransmission (100.0% of the data packets)")
    assert said[1] == ("1 packet was trimmed at switch ports and it was answered by a NACK resend; no retransmission "
                       "timer expired.")
    one = uet_sentences({**m, "uet_trimmed_packets": None, "uet_nack_retransmits": 0, "uet_trimmed_unanswered": 1})
    assert one[1].startswith("The receivers got 1 trimmed header and their senders resent 0 on a NACK (1 trimmed "
                             "header unanswered)"), one


def test_the_retransmit_share_is_the_summary_key_not_a_second_computation():
    m = {"uet_hosts": 1, "uet_data_packets": 160, "uet_retransmitted_packets": 30, "uet_retransmit_fraction": 0.5}
    assert "(50.0% of the data packets)" in uet_sentences(m)[0]


def test_nothing_trimmed_blames_no_threshold_only_when_no_queue_reached_it():
    base = {"uet_hosts": 1, "uet_data_packets": 5, "uet_trimmed_packets": 0, "uet_trim_ports": 1}
    assert uet_sentences({**base, "uet_too_short_to_trim": 0, "uet_trim_ports_at_threshold": 0})[1].startswith(
        "Trimming was on at 1 switch port but no port's queue reached its threshold (nothing trimmed)")
    assert uet_sentences({**base, "uet_too_short_to_trim": 3})[1].startswith(
        "Trimming was on at 1 switch port but nothing was trimmed (3 packets too short to trim);")
    assert uet_sentences({**base, "uet_trim_ports_at_threshold": 1})[1].startswith(
        "Trimming was on at 1 switch port but nothing was trimmed;")


def test_trimmed_headers_that_never_reached_a_receiver_are_said(tmp_path):
    run = trimmed_run(tmp_path / "lost", nack=(10, 8, 7, 3), received=28)
    assert sentences(run)[-1] == ("30 packets were trimmed at switch ports (all at leaf1:h1); the receivers got 28 "
                                  "trimmed headers and the senders resent 28 on a NACK (2 trimmed headers did not "
                                  "reach their receivers); no retransmission timer expired.")


def test_without_trim_csv_unanswered_headers_are_said(tmp_path):
    run = trimmed_run(tmp_path / "n", nack=(10, 8, 7, 2), received=30)
    (run / "trim.csv").unlink()
    assert sentences(run)[-1] == ("The receivers got 30 trimmed headers and their senders resent 27 on a NACK "
                                  "(3 trimmed headers unanswered); no retransmission timer expired.")


def test_tcp_timeouts_do_not_make_uet_rounds_rtomin_rounds(tmp_path):
    """TCP timed out (its own traffic), UET's timer never expired: the slow rounds are no RTOmin rounds."""
    run = incast_run(tmp_path / "t")
    pd.DataFrame([("h5", "before", "TcpExtTCPTimeouts", 2), ("h5", "after", "TcpExtTCPTimeouts", 5)],
                 columns=["host", "phase", "counter", "value"]).to_csv(run / "tcp.csv", index=False)
    add_uet(run, {"h5": {"data_packets": 40}})
    said = sentences(run)
    assert said[0].startswith("All 10 incast rounds took 33-226 ms") and "RTOmin (200 ms)" not in said[0], said


def test_a_collective_whose_switches_trimmed_does_not_blame_the_straggler_alone(tmp_path):
    run = collective_run(tmp_path / "c", late_ms=600.0, late_rank=2)
    add_uet(run, {"h2": {"data_packets": 40, "retransmitted_packets": 5, "nack_retransmits": 5}}, trimmed_received=5)
    add_trim(run, {"spine1:leaf1": (5, 7000)})
    said = sentences(run)
    assert "Rank 2 (h3) was late" in said[0] and "not the network" not in said[0], said
    assert said[1] == ("The network dropped, ECN-marked and paused nothing; its switch ports trimmed packets instead "
                       "(below).")
    resent = collective_run(tmp_path / "r", late_ms=600.0, late_rank=2)  # no trimming, but a sender resent
    add_uet(resent, {"h2": {"data_packets": 40, "retransmitted_packets": 2, "fast_retransmits": 2}})
    assert "not the network" not in sentences(resent)[0]


def test_the_panel_has_a_row_for_the_hosts_and_one_for_the_ports_with_trim_csv(tmp_path):
    _, md = write_report(trimmed_run(tmp_path / "on"), tmp_path / "r_on")
    text = md.read_text()
    png = tmp_path / "r_on" / "report_files" / "uet.png"
    assert png.exists() and "report_files/uet.png" in text
    assert "Ultra Ethernet (uet.csv, 5 hosts)" in text and "2 switch ports carried the trimming program" in text
    assert "as a share of the port's own buffer" in text and "all 30 were answered by NACK resends" in text
    _, md = write_report(trimmed_run(tmp_path / "old", buffer_bytes=None), tmp_path / "r_old")
    assert "trimming program" in md.read_text() and "share of the port" not in md.read_text()  # kB then
    _, md = write_report(timer_run(tmp_path / "off"), tmp_path / "r_off")
    one_row = tmp_path / "r_off" / "report_files" / "uet.png"
    assert "trimming program" not in md.read_text()
    (w2, h2), (w1, h1) = png_size(png), png_size(one_row)
    assert w1 == w2 == 900 and h2 == 700 and h1 == 370  # 3.3 in a row + 0.4 at 100 dpi


def test_the_caption_counts_one_host_and_one_port_in_the_singular(tmp_path):
    run = incast_run(tmp_path / "one", rto_rounds=())
    pd.DataFrame([(0, "h5", "data_packets", 40)], columns=UCOLS).to_csv(run / "uet.csv", index=False)
    add_trim(run, {"leaf1:h1": (0, 900)})
    _, caption = uet_panel(load_run(run), tmp_path / "p.png")
    assert "(uet.csv, 1 host)" in caption and "1 switch port carried the trimming program" in caption, caption


def _threshold_dashes(trim: pd.DataFrame, most: int) -> tuple[bool, int]:
    from matplotlib.figure import Figure

    ax = Figure().add_subplot()
    share = _ports(ax, trim, most)
    return share, sum(ln.get_label() == "trimming threshold" for a in ax.figure.axes for ln in a.get_lines())


def test_the_share_of_buffer_is_decided_over_the_ports_drawn_and_the_caption_follows_it(tmp_path):
    ports = {f"leaf{i}:h1": (20 - i, 7000) for i in range(9)}  # the 9th (fewest trimmed) is not drawn with 8
    run = trimmed_run(tmp_path / "s", ports=ports)
    rows = pd.read_csv(run / "trim.csv")
    rows = rows[~((rows["node"] == "leaf8") & (rows["counter"] == "buffer_bytes"))]  # its buffer unknown
    rows.to_csv(run / "trim.csv", index=False)
    assert _threshold_dashes(rows, 8) == (True, 1)
    _, caption = uet_panel(load_run(run), tmp_path / "p.png")
    assert "as a share of the port's own buffer" in caption
    assert _threshold_dashes(rows, 9) == (False, 0)  # thresholds known, a buffer not: kB, and no dash in kB
    no_buf = rows[rows["counter"] != "buffer_bytes"]
    assert _threshold_dashes(no_buf, 8) == (False, 0)
    no_buf.to_csv(run / "trim.csv", index=False)
    _, caption = uet_panel(load_run(run), tmp_path / "q.png")
    assert "right axis, in kB)" in caption and "share of the port" not in caption, caption


def test_a_run_without_uet_csv_gets_no_panel_and_no_uet_sentences(tmp_path):
    run = incast_run(tmp_path / "tcp", rto_rounds=())
    add_trim(run, {"leaf1:h1": (0, 0)})  # a stray trim.csv alone does not make a UET run
    _, md = write_report(run, tmp_path / "r")
    assert not (tmp_path / "r" / "report_files" / "uet.png").exists()
    assert "UET" not in md.read_text() and not any("UET" in s or "trim" in s for s in sentences(run))


def test_per_host_and_per_port_sum_the_appended_rows_in_reading_order():
    rows = pd.DataFrame([(1, "h10", "rto_events", 1), (2, "h2", "rto_events", 2), (1, "h10", "rto_events", 3),
                         (3, "h9", "custom", 5)], columns=UCOLS)
    t = per_host(rows)
    assert list(t.index) == ["h2", "h9", "h10"] and t["rto_events"].tolist() == [2, 0, 4]
    assert t.at["h9", "custom"] == 5 and t.at["h9", "data_packets"] == 0
    ports = per_port(pd.DataFrame([("s1", "a", "vq_peak_bytes", 9), ("s2", "b", "trimmed_packets", 3),
                                   ("s1", "a", "trimmed_packets", 3)], columns=TCOLS))
    assert ports.to_dict("records") == [
        {"port": "s1:a", "trimmed_packets": 3, "vq_peak_bytes": 9, "threshold_bytes": 0, "buffer_bytes": 0},
        {"port": "s2:b", "trimmed_packets": 3, "vq_peak_bytes": 0, "threshold_bytes": 0, "buffer_bytes": 0}]
