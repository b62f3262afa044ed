#!/usr/bin/env python3
"""One collective over kernel TCP, RoCE (rxe, go-back-N) and UET (selective retransmit) at 0% and 1% random loss
(issue 28 item 3; a benchmark, not a test; needs root and the lab VM for rxe and netem)

    sudo testbed vm --rwdir results/xport-loss -- .venv/bin/python benchmarks/transports_under_loss.py \\
        --rounds 2 --first-round R --out results/xport-loss   # R = 0, 2, 4...: rows.jsonl gathers the sessions
    .venv/bin/python benchmarks/transports_under_loss.py --table-only --out results/xport-loss

Each round runs the `collective` scenario (testbed.commands.runner.run_scenario: build, run, tear down) once per
transport and loss, the six cells in an order rotated round by round so that the machine's load hits every cell
alike; one seed per round, shared by its cells. The loss is netem on an IFB at ``--loss-host``'s NIC ingress (the
scenario's loss_percent/loss_host): every packet lost is one on its way to that host, so a capture there
(capture=HOST:eth0, before the IFB drops) sees every retransmission the loss caused, go-back-N's included
(analysis.capture: wire_roce_retransmitted_packets, wire_tcp_retransmitted_segments). Every run's numbers are
appended as one JSON line to OUT/rows.jsonl (several VM sessions add up); the table is computed from all of them.

Per run and transport: CCT p50 and p99 over the measured iterations (cct_ms_p50, cct_ms_p99); retransmitted
packets (TCP: tcp_retrans_segs, the hosts' TcpRetransSegs delta; RoCE: the go-back-N resends on the wire at the
lossy host; UET: uet_retransmitted_packets, its senders' resends, and uet_retransmitted_bytes); recovery rounds
(RoCE: rdma_retransmit_events, rxe's completer_retry_err: one per go-back-N restart); timer expiries (TCP:
tcp_timeouts, TcpExtTCPTimeouts; RoCE: rdma_timeout_retries, restarts by the local ACK timer rather than a NAK;
UET: uet_rto_events). Printed per transport: medians over runs with their intervals (analysis.stats.estimate),
the 1%/0% slowdown of p50 and p99 as a ratio of medians with its bootstrap interval (analysis.stats.compare), and
at 1% loss each transport's CCT against TCP's.

Measured: docs/uet.md, "1% loss: TCP, RoCE go-back-N and UET".
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analysis.stats import compare, estimate  # noqa: E402

TRANSPORTS = ("tcp", "rdma", "uet")
NAMES = {"tcp": "TCP (cubic)", "rdma": "RoCE (rxe, go-back-N)", "uet": "UET (selective)"}


def cells(transports: list[str], losses: list[float], round_no: int) -> list[tuple[str, float]]:
    """The round's (transport, loss) cells, rotated by the round number: each cell takes each place in turn."""
    all_cells = [(t, loss) for loss in losses for t in transports]
    k = round_no % len(all_cells)
    return all_cells[k:] + all_cells[:k]


def metrics(transport: str, s: dict) -> dict:
    """One run's numbers from its summary.json (keys: the module docstring)."""
    m = {"cct_p50_ms": s.get("cct_ms_p50"), "cct_p99_ms": s.get("cct_ms_p99"), "verified": s.get("data_verified")}
    if transport == "tcp":
        m.update(retrans_pkts=s.get("tcp_retrans_segs"), wire_retrans=s.get("wire_tcp_retransmitted_segments"),
                 timer_expiries=s.get("tcp_timeouts"))
    elif transport == "rdma":
        wire = s.get("wire_roce_retransmitted_packets")
        m.update(retrans_pkts=wire, wire_retrans=wire,
                 recovery_rounds=s.get("rdma_retransmit_events"), timer_expiries=s.get("rdma_timeout_retries"),
                 seq_naks=s.get("rdma_rcvd_seq_err"))
    else:
        m.update(retrans_pkts=s.get("uet_retransmitted_packets"), retrans_bytes=s.get("uet_retransmitted_bytes"),
                 timer_expiries=s.get("uet_rto_events"), nack_resends=s.get("uet_nack_retransmits"),
                 sack_resends=s.get("uet_fast_retransmits"), rto_resends=s.get("uet_rto_retransmits"))
    m["capture_drops"] = s.get("wire_capture_kernel_drops")
    return m


def params(args: argparse.Namespace, transport: str, loss: float) -> dict:
    from testbed.scenario import get

    sc = get("collective")
    p = {x.name: x.default for x in sc.params}
    p.update(transport=transport, collective=args.collective, size=args.size, iterations=args.iterations, ranks=4,
             spines=2, leaves=2, hosts_per_leaf=2, host_rate_mbps=args.rate_mbps, fabric_rate_mbps=args.rate_mbps,
             loss_percent=loss, loss_host=args.loss_host, capture=f"{args.loss_host}:eth0")
    sc.validate(p)
    return p


def run_round(args: argparse.Namespace, round_no: int, rows_file: Path) -> None:
    from testbed.commands.runner import run_scenario
    from testbed.scenario import get

    seed = args.seed + round_no
    for transport, loss in cells(args.transports.split(","), [float(x) for x in args.losses.split(",")], round_no):
        d = Path(args.out) / f"{transport}-loss{loss:g}-seed{seed}-{time.strftime('%H%M%S')}"
        t0 = time.monotonic()
        try:
            s = run_scenario(get("collective"), params(args, transport, loss), seed, d, quiet=True)
            row = {"transport": transport, "loss": loss, "seed": seed, **metrics(transport, s)}
        except Exception as e:  # noqa: BLE001 - a failed run is reported, the others still run
            row = {"transport": transport, "loss": loss, "seed": seed, "error": f"{type(e).__name__}: {e}"[:300]}
        row.update(wall_s=round(time.monotonic() - t0, 1), dir=str(d))
        print(json.dumps(row), flush=True)
        with rows_file.open("a") as f:
            f.write(json.dumps(row) + "\n")


def _vals(rows: list[dict], transport: str, loss: float, key: str) -> list[float]:
    return [r[key] for r in rows if r["transport"] == transport and r["loss"] == loss and r.get(key) is not None]


def _est(values: list[float], fmt: str = "{:.0f}") -> str:
    e = estimate(values)
    if e.n == 0:
        return "-"
    if e.n == 1:
        return f"{fmt.format(e.median)} (n=1)"
    return f"{fmt.format(e.median)} [{fmt.format(e.low)}, {fmt.format(e.high)}]"


def _ratio(a: list[float], b: list[float]) -> str:
    d = compare(a, b)
    if d.a.n == 0 or d.b.n == 0:
        return "-"
    return f"{d.ratio:.2f} [{d.ratio_low:.2f}, {d.ratio_high:.2f}] {d.verdict}, p={d.p_value:.3g}"


def table(rows: list[dict], losses: list[float]) -> str:
    """The markdown table: per transport, medians [interval] over runs, slowdowns and contrasts against TCP."""
    ok = [r for r in rows if "error" not in r and r.get("verified") is not False]
    ts = [t for t in TRANSPORTS if any(r["transport"] == t for r in ok)]
    lo, hi = min(losses), max(losses)
    head = "| | " + " | ".join(NAMES[t] for t in ts) + " |\n|---|" + "---|" * len(ts)
    lines = [head]

    def line(label: str, f) -> None:
        lines.append(f"| {label} | " + " | ".join(f(t) for t in ts) + " |")

    line(f"runs (loss {lo:g}% / {hi:g}%)",
         lambda t: f"{len(_vals(ok, t, lo, 'cct_p50_ms'))} / {len(_vals(ok, t, hi, 'cct_p50_ms'))}")
    for q in ("p50", "p99"):
        for loss in (lo, hi):
            line(f"CCT {q} ms, loss {loss:g}%", lambda t, q=q, loss=loss: _est(_vals(ok, t, loss, f"cct_{q}_ms")))
    for q in ("p50", "p99"):
        line(f"slowdown {q} {hi:g}%/{lo:g}%", lambda t, q=q: _ratio(_vals(ok, t, hi, f"cct_{q}_ms"),
                                                                    _vals(ok, t, lo, f"cct_{q}_ms")))
    for q in ("p50", "p99"):
        line(f"CCT {q} at {hi:g}% / TCP's", lambda t, q=q: "-" if t == "tcp" else
             _ratio(_vals(ok, t, hi, f"cct_{q}_ms"), _vals(ok, "tcp", hi, f"cct_{q}_ms")))
    for key, label in (("retrans_pkts", "retransmitted packets"), ("retrans_bytes", "retransmitted bytes"),
                       ("recovery_rounds", "go-back-N rounds"), ("timer_expiries", "timer expiries")):
        for loss in (lo, hi):
            line(f"{label}, loss {loss:g}%", lambda t, key=key, loss=loss: _est(_vals(ok, t, loss, key)))
    bad = [r for r in rows if r not in ok]
    if bad:
        lines.append(f"\nleft out: {len(bad)} runs: " + "; ".join(
            f"{r['transport']} {r['loss']:g}% seed {r['seed']}: {r.get('error', 'data not verified')}" for r in bad))
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2, help="rounds this session, each every cell once (default 2)")
    ap.add_argument("--transports", default="tcp,rdma,uet", help="comma list of tcp, rdma, uet")
    ap.add_argument("--losses", default="0,1", help="loss percents at --loss-host's NIC (default 0,1)")
    ap.add_argument("--loss-host", default="h1", help="the host whose NIC drops arriving packets (default h1)")
    ap.add_argument("--collective", default="allreduce", help="the collective (default allreduce, ring)")
    ap.add_argument("--size", default="256K", help="per-rank message size (default 256K)")
    ap.add_argument("--iterations", type=int, default=8, help="measured iterations a run (default 8)")
    ap.add_argument("--rate-mbps", type=float, default=10.0, help="every link's rate (default 10)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the first round (default 1); round r: seed + r")
    ap.add_argument("--first-round", type=int, default=0, help="round number to start at (rotation, seed)")
    ap.add_argument("--out", default="results/xport-loss", help="run directories and rows.jsonl")
    ap.add_argument("--table-only", action="store_true", help="only print the table from OUT/rows.jsonl")
    args = ap.parse_args()
    bad = [t for t in args.transports.split(",") if t not in TRANSPORTS]
    if bad or args.rounds < 1:
        ap.error(f"unknown transport {bad[0]!r}" if bad else "--rounds must be >= 1")
    try:
        losses = [float(x) for x in args.losses.split(",")]
    except ValueError:
        ap.error(f"--losses: comma-separated percents, e.g. 0,1 (got {args.losses!r})")
    if len(losses) < 2 or not all(0 <= x < 100 for x in losses):
        ap.error(f"--losses: at least two percents in 0..100 (got {args.losses!r})")
    out = Path(args.out)
    rows_file = out / "rows.jsonl"
    if not args.table_only:
        from testbed.errors import require_root

        require_root("the transports-under-loss benchmark")
        out.mkdir(parents=True, exist_ok=True)
        for r in range(args.first_round, args.first_round + args.rounds):
            run_round(args, r, rows_file)
    rows = [json.loads(x) for x in rows_file.read_text().splitlines() if x.strip()] if rows_file.exists() else []
    print(f"\n{args.collective} {args.size} x {args.iterations} iterations, 4 ranks, 2x2 leaf-spine, "
          f"{args.rate_mbps:g} Mbit/s, loss at {args.loss_host}'s NIC; medians [interval] over runs\n")
    print(table(rows, losses))
    return 0


if __name__ == "__main__":
    sys.exit(main())
