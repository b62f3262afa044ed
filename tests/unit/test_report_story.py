"""analysis.story and the report's shorter page, on hand-made run directories: the story sentences for an incast
with RTOmin rounds, a straggler on a clean network and a clean run; the queue plot's thresholds and events; the
parts a page leaves out (counters that stayed 0, parameters of features that are off, a slowest-ops table that
says nothing)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from analysis import metrics as m
from analysis import story
from analysis import summary as summ
from analysis.load import load_run
from analysis.report import write_report

QCOLS = ["t_s", "node", "port", "class", "backlog_bytes", "backlog_packets", "drops", "marks", "sent_bytes",
         "sent_packets", "overlimits"]


def manifest(run: Path, scenario: str, params: dict, summary: dict | None = None) -> None:
    run.mkdir(parents=True, exist_ok=True)
    (run / "manifest.json").write_text(json.dumps({"scenario": scenario, "params": params, "seed": 1,
                                                   "complete": True, "t0_monotonic": 100.0}))
    if summary is not None:
        (run / "summary.json").write_text(json.dumps(summary))


def incast_run(run: Path, rto_rounds=(2, 5, 7), rto_ms=200.0, drops_at="leaf1:h1", n_rounds=10, block=20_000,
               hit_ms=216.0, base_ms=33.0) -> Path:
    """4 senders x 20 kB at 20 Mbit/s: an ideal round of 32 ms. Every round takes 33 ms, except ``rto_rounds``,
    where sender h5 finishes 216 + 5 x i ms after the start (a retransmission timeout after a drop at
    ``drops_at``: the port's drop counter rises during the round). Queue samples every 5 ms."""
    manifest(run, "incast", {"senders": 4, "block_bytes": block, "host_rate_mbps": 20.0, "buffer_bytes": 16_000,
                             "discipline": "droptail", "k_bytes": 20_000, "rto_min_ms": int(rto_ms), "cc": "cubic"})
    rows, t, windows = [], 100.0, []
    for r in range(n_rounds):
        hit = r in rto_rounds
        dur = (hit_ms + 5 * rto_rounds.index(r)) / 1e3 if hit else base_ms / 1e3
        for s in range(4):
            end = t + (dur if (s == 3 or not hit) else 0.030)
            rows.append((r, f"h{s + 2}", t, round(end, 6), block))
        if hit:
            windows.append((t + 0.010, t + 0.012))
        t += dur + 0.005
    pd.DataFrame(rows, columns=["round", "sender", "start_s", "end_s", "bytes"]).to_csv(run / "rounds.csv",
                                                                                       index=False)
    q, drops, node, port = [], 0, *drops_at.split(":")
    ts = 100.0
    while ts <= t:
        drops += 3 * sum(1 for a, b in windows if a <= ts < a + 0.005)
        q.append((round(ts, 6), node, port, "1:10", 8_000, 5, drops, 0, 0, 0, 0))
        q.append((round(ts, 6), "spine1", "leaf1", "1:10", 0, 0, 0, 0, 0, 0, 0))
        ts += 0.005
    pd.DataFrame(q, columns=QCOLS).to_csv(run / "queues.csv", index=False)
    return run


def collective_run(run: Path, late_ms=600.0, late_rank=2, drops=0) -> Path:
    """3 ranks x 4 iterations of one allreduce; rank ``late_rank`` starts every op ``late_ms`` after the others,
    which wait for it (wait_s), then all transfer for 20 ms. queues.csv: two ports, ``drops`` at spine1:leaf1.
    tcp.csv: two counters, one that stayed 0 on every host. Parameters include PFC's, with PFC off."""
    manifest(run, "collective", {"collective": "allreduce", "ranks": 3, "pfc": "off", "pfc_xoff_bytes": 32_000,
                                 "pfc_xon_bytes": 16_000, "pfc_watchdog_ms": 0.0, "discipline": "droptail",
                                 "k_bytes": 30_000, "buffer_bytes": 262_144, "loss_percent": 0.0, "loss_host": "h1"},
             {"fidelity_ok": True, "fidelity_reasons": ""})
    ops, t = [], 100.0
    late = late_ms / 1e3
    for it in range(4):
        for rank in range(3):
            start = t + (late if rank == late_rank else 0.0)
            wait = 0.0 if rank == late_rank else late
            ops.append((it, "grad", 0, "allreduce", rank, f"h{rank + 1}", start, t + late + 0.020, 400_000, 400_000,
                        wait))
        t += late + 0.020 + 0.010
    pd.DataFrame(ops, columns=["iteration", "op", "op_index", "collective", "rank", "host", "start_s", "end_s",
                               "bytes_sent", "bytes_recv", "wait_s"]).to_csv(run / "ops.csv", index=False)
    q = []
    for i in range(int((t - 100.0) / 0.01) + 1):
        ts = 100.0 + i * 0.01
        q.append((round(ts, 6), "spine1", "leaf1", "1:10", 3000, 2, drops if i > 10 else 0, 0, i * 1000, i, 0))
        q.append((round(ts, 6), "leaf1", "h1", "1:10", 1000, 1, 0, 0, i * 1000, i, 0))
    pd.DataFrame(q, columns=QCOLS).to_csv(run / "queues.csv", index=False)
    tcp = [(h, ph, c, v) for h in ("h1", "h2", "h3") for c, (b, a) in
           (("TcpOutSegs", (10, 900)), ("TcpExtTCPLossProbes", (4, 4))) for ph, v in (("before", b), ("after", a))]
    pd.DataFrame(tcp, columns=["host", "phase", "counter", "value"]).to_csv(run / "tcp.csv", index=False)
    return run


def sentences(run_dir: Path) -> list[str]:
    run = load_run(run_dir)
    return story.tell(run, summ.summarize(run), m.port_counter_deltas(run.queues)).sentences


# ---------------------------------------------------------------------------------------------- the stories

def test_incast_story_names_the_rto_rounds_and_the_port(tmp_path):
    said = sentences(incast_run(tmp_path / "i"))
    assert said[0].startswith("3 of 10 incast rounds took 216-226 ms against an ideal 32 ms; each had a sender "
                              "that waited RTOmin (200 ms) after drops at leaf1:h1 (9 drops during those rounds)"), said
    assert "The other 7 took 33 ms" in said[0]
    assert said[1] == "The switch queues dropped 9 packets (9 at leaf1:h1)."
    hit = story.rto_rounds(load_run(tmp_path / "i").rounds, load_run(tmp_path / "i").queues, 32.0, 200.0)
    assert hit["round"].tolist() == [2, 5, 7] and set(hit["sender"]) == {"h5"}


def test_incast_story_only_names_the_port_where_the_drops_were(tmp_path):
    said = sentences(incast_run(tmp_path / "i", drops_at="spine1:leaf2"))
    assert "after drops at spine1:leaf2" in said[0]
    # a 1 ms RTOmin: a round 190 ms late did not wait one RTOmin (nor four)
    said = sentences(incast_run(tmp_path / "j", rto_ms=1.0))
    assert said[0].startswith("All 10 incast rounds took 33-226 ms") and "waited" not in said[0], said


def test_a_timeout_overlapping_the_round_still_counts(tmp_path):
    """As on the host kernel (8 x 32 kB, 16 kB buffer: rounds of 234-284 ms against an ideal 102 ms): the sender
    times out while the others still send, so its round takes RTOmin plus part of the ideal, not ideal + RTOmin."""
    said = sentences(incast_run(tmp_path / "i", block=64_000, hit_ms=234.0, base_ms=107.0))
    assert said[0].startswith("3 of 10 incast rounds took 234-244 ms against an ideal 102.4 ms; each had a sender "
                              "that waited RTOmin (200 ms) after drops at leaf1:h1"), said


def test_clean_incast_story(tmp_path):
    said = sentences(incast_run(tmp_path / "c", rto_rounds=()))
    assert said[0] == ("All 10 incast rounds took 33 ms (median 33 ms) against an ideal 32 ms; none took "
                       "about one RTOmin (200 ms) longer.")
    assert said[1] == "The network dropped, ECN-marked and paused nothing."


def test_straggler_on_a_clean_network_is_named_as_the_cause(tmp_path):
    said = sentences(collective_run(tmp_path / "s", late_ms=600.0, late_rank=2))
    assert said[0].startswith("Rank 2 (h3) was late: it started 4 of 4 ops a median 600 ms after the first rank. "
                              "An op took a median 620 ms, of which about 600 ms was waiting for the late rank and "
                              "20 ms transfer"), said
    assert said[0].endswith("The cause is the late rank (a straggler), not the network.")
    assert said[1] == "The network dropped, ECN-marked and paused nothing."
    assert "no pauses" not in " ".join(said)


def test_straggler_with_drops_does_not_blame_the_rank_alone(tmp_path):
    said = sentences(collective_run(tmp_path / "s", late_ms=600.0, drops=5))
    assert "Rank 2 (h3) was late" in said[0] and "not the network" not in said[0]
    assert said[1] == "The switch queues dropped 5 packets (5 at spine1:leaf1)."


def test_clean_collective_has_no_late_rank(tmp_path):
    said = sentences(collective_run(tmp_path / "c", late_ms=0.0))
    assert said[0] == ("4 collective ops took 20 ms (median 20 ms); the ranks started each op close together "
                       "(no late rank).")
    assert story.late_rank(load_run(tmp_path / "c").ops) is None


# ---------------------------------------------------------------------------------------------- numbers, plots

def test_key_numbers_have_plain_names_and_units(tmp_path):
    run = load_run(incast_run(tmp_path / "i"))
    nums = dict(story.key_numbers(run, summ.summarize(run)))
    assert nums["incast round time, p99 (n=10)"] == "226 ms"
    assert nums["incast round time, median (n=10)"] == "33 ms"
    assert nums["ideal round time"] == "32 ms"
    assert nums["packets dropped by switch queues"] == "9"
    assert len(nums) <= 6 and not any("_" in k for k in nums)


def test_queue_thresholds_follow_the_features_in_use(tmp_path):
    def thr(params):
        manifest(tmp_path / "t", "x", params)
        return story.queue_thresholds(load_run(tmp_path / "t"))

    assert thr({"buffer_bytes": 16000, "discipline": "droptail", "k_bytes": 20000}) == [("buffer", 16000.0)]
    assert thr({"buffer_bytes": 150000, "discipline": "step", "k_bytes": 30000}) == [("buffer", 150000.0),
                                                                                     ("ECN K", 30000.0)]
    assert thr({"buffer_bytes": 50000, "discipline": "red", "k_bytes": 20000}) == [
        ("buffer", 50000.0), ("RED min (K)", 20000.0), ("RED max", 50000.0)]
    assert thr({"buffer_bytes": 262144, "pfc": "on", "pfc_xoff_bytes": 32000, "pfc_xon_bytes": 16000}) == [
        ("buffer", 262144.0), ("PFC XOFF", 32000.0), ("PFC XON", 16000.0)]
    assert thr({"buffer_bytes": 262144, "pfc": "off", "pfc_xoff_bytes": 32000}) == [("buffer", 262144.0)]
    assert thr({"mode": "lossless_ecn", "discipline": "droptail", "k_bytes": 10000, "xoff_bytes": 15000,
                "xon_bytes": 7500}) == [("ECN K", 10000.0), ("PFC XOFF", 15000.0), ("PFC XON", 7500.0)]


def test_event_times_are_where_the_counter_rose(tmp_path):
    run = load_run(incast_run(tmp_path / "i"))
    ev = story.event_times(run.queues, "drops")
    assert set(ev["port"]) == {"leaf1:h1"} and ev["count"].sum() == 9 and len(ev) == 3
    rt = m.round_times(run.rounds).set_index("round")
    for t, r in zip(ev["t_s"], (2, 5, 7)):  # each rise falls inside its RTO round
        assert rt.loc[r, "start_s"] < t < rt.loc[r, "end_s"]


# ---------------------------------------------------------------------------------------------- the page

def test_incast_page_opens_with_the_story_and_draws_the_rto_lines(tmp_path):
    _, md_p = write_report(incast_run(tmp_path / "i"))
    md = md_p.read_text()
    first = md.index("3 of 10 incast rounds took 216-226 ms")
    assert first < md.index("| incast round time, p99 (n=10) | 226 ms |") < md.index("## Plots")
    assert "(vertical lines: ideal, ideal + RTOmin)" in md
    assert "horizontal lines: each port's own buffer, ECN K or RED levels and PFC XOFF/XON" in md
    assert md.index("## Plots") < md.index("<summary>All metrics (") and md.rstrip().endswith("</details>")
    assert "| round_ms_p99 | 226 | the files |" in md  # every metric is still there, folded


def test_collective_page_leaves_out_what_says_nothing(tmp_path):
    run = collective_run(tmp_path / "c", late_ms=600.0)
    html_p, md_p = write_report(run)
    md, html = md_p.read_text(), html_p.read_text()
    # host TCP counters: the one that stayed 0 everywhere is left out
    assert "| TcpOutSegs | 890 | 890 | 890 |" in md and "TcpExtTCPLossProbes" not in md
    assert "1 counters that stayed 0 on every host omitted" in md
    # PFC is off: its parameters are left out (named in the caption), the others stay
    params = md[md.index("## Parameters"):]
    assert "| pfc_xoff_bytes |" not in params and "| pfc | off |" in params and "| buffer_bytes | 262144 |" in params
    assert re.search(r"parameters of features this run left off omitted: .*pfc_xoff_bytes", params)
    assert "| k_bytes |" not in params and "| loss_host |" not in params
    # every op took 620 ms: the slowest ops table would list ten equal rows
    assert "10 slowest ops" not in md
    # one-line fidelity verdict, green
    assert '<div class="ok">Fidelity: faithful' in html
    assert html.count("<details>") >= 2 and "<summary>All metrics (" in html


def test_slowest_ops_table_when_the_tail_stands_out(tmp_path):
    run = collective_run(tmp_path / "c", late_ms=0.0)
    ops = pd.read_csv(run / "ops.csv")
    ops.loc[ops["iteration"] == 3, "end_s"] += 0.050  # 70 ms against 20 ms
    ops.to_csv(run / "ops.csv", index=False)
    _, md_p = write_report(run)
    assert "## The 10 slowest ops" in md_p.read_text()


def test_a_run_with_flows_only_tells_goodput_and_retransmissions(tmp_path):
    run = tmp_path / "smoke"
    manifest(run, "smoke", {"rate_mbps": 20.0}, {"goodput_mbps": 18.7654})
    pd.DataFrame([("h1", "before", "TcpRetransSegs", 1), ("h1", "after", "TcpRetransSegs", 5)],
                 columns=["host", "phase", "counter", "value"]).to_csv(run / "tcp.csv", index=False)
    assert sentences(run) == ["The flows moved 18.77 Mbit/s; TCP sent 4 segments again (no rounds, ops or queue "
                              "samples recorded)."]


def test_slow_rounds_without_a_tcp_timeout_are_not_blamed_on_rtomin(tmp_path):
    run = incast_run(tmp_path / "i")
    pd.DataFrame([("h5", "before", "TcpExtTCPTimeouts", 2), ("h5", "after", "TcpExtTCPTimeouts", 2)],
                 columns=["host", "phase", "counter", "value"]).to_csv(run / "tcp.csv", index=False)
    said = sentences(run)
    assert said[0].startswith("All 10 incast rounds took 33-226 ms") and "RTOmin" not in said[0], said


def test_plots_with_thresholds_lines_and_events_render(tmp_path):
    from analysis import plots

    run = load_run(incast_run(tmp_path / "i"))
    events = story.event_times(run.queues, "drops").assign(kind="drops")
    spike = run.queues.copy()
    spike.loc[spike.index[4], "backlog_bytes"] = 90_000  # a spike far above the buffer: clipped, not the y-range
    png = b"\x89PNG\r\n\x1a\n"
    q = plots.plot_queue_occupancy(spike, tmp_path / "q.png", thresholds=story.queue_thresholds(run), events=events,
                                   ylim_bytes=16_000, ops=m.round_times(run.rounds))
    c = plots.plot_cdf({"round": m.round_times(run.rounds)["round_s"] * 1e3}, tmp_path / "c.png",
                       lines={"ideal": 32.0, "ideal + RTOmin": 232.0})
    assert q.read_bytes()[:8] == png and c.read_bytes()[:8] == png
