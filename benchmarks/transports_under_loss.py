#!/usr/bin/env python3
"""One collective over kernel TCP, RoCE (rxe, go-back-N) and UET (selective retransmit), healthy and under one
condition: 1% random loss, an incast into a small drop-tail port, or a slow spine (issue 28 item 3; a benchmark,
not a test; needs root and the lab VM for rxe and netem)

    sudo testbed vm --rwdir results/xport-loss -- .venv/bin/python benchmarks/transports_under_loss.py \\
        --rounds 2 --first-round R --out results/xport-loss   # R = 0, 2, 4...: rows.jsonl gathers the sessions
    .venv/bin/python benchmarks/transports_under_loss.py --table-only --out results/xport-loss
    ... --condition both --rounds 1 --iterations 6 --out results/xport-fabric   # incast and slow spine

``--condition`` (the cells of a transport: healthy, faulted):

* ``loss`` (``--losses``, default 0,1): the ring all-reduce below at each loss percent.
* ``incast``: the collective scenario's incast (``collective=incast``, a direct gather: ranks 1-3 send their whole
  message to h1 at once) on the same 2x2 leaf-spine with 1 MiB drop-tail queues everywhere (more than the 3 x
  256 kB sent at once: no drop) healthy, and faulted the same but h1's leaf port (leaf1:h1, the incast's
  bottleneck) at ``--incast-buffer`` bytes (drop-tail, no PFC: every overflow is a loss; RoCE goes back N on each;
  UET trims there, trim=auto). The faulted fabric is a topology file written into OUT (the scenario's
  topology_file with a per-port override: docs/topologies.md), seeded as the scenario seeds its own.
* ``slow-spine``: the same healthy incast, and with ``slow-port spine1:leaf1 at_s=0 fraction=F``
  (``--slow-fraction``; testbed.faults.plan, as docs/uet.md's slow-spine runs): the senders behind leaf2 whose
  packets ECMP (TCP, RoCE: per flow) or spraying (UET: per packet) puts on spine1 drain at F of the rate.
* ``both``: incast and slow-spine in one session, three cells a transport, the healthy one shared (the two
  conditions' healthy cells are the same run; the tables read level-0 rows of either).

For ``loss``: each round runs the `collective` scenario (testbed.commands.runner.run_scenario: build, run, tear
down) once per transport and loss, the six cells in an order rotated round by round so that the machine's load hits
every cell alike; one seed per round, shared by its cells. The loss is netem on an IFB at ``--loss-host``'s NIC
ingress (the scenario's loss_percent/loss_host): every packet lost is one on its way to that host, so a capture
there (capture=HOST:eth0, before the IFB drops) sees every retransmission the loss caused, go-back-N's included
(analysis.capture: wire_roce_retransmitted_packets, wire_tcp_retransmitted_segments). Every run's numbers are
appended as one JSON line to OUT/rows.jsonl (several VM sessions add up); the table is computed from all of them.

Per run and transport: CCT p50 and p99 over the measured iterations (cct_ms_p50, cct_ms_p99); retransmitted
packets (TCP: tcp_retrans_segs, the hosts' TcpRetransSegs delta; RoCE: the go-back-N resends on the wire at the
lossy host; UET: uet_retransmitted_packets, its senders' resends, and uet_retransmitted_bytes); recovery rounds
(RoCE: rdma_retransmit_events, rxe's completer_retry_err: one per go-back-N restart); timer expiries (TCP:
tcp_timeouts, TcpExtTCPTimeouts; RoCE: rdma_timeout_retries, restarts by the local ACK timer rather than a NAK;
UET: uet_rto_events). Printed per transport: medians over runs with their intervals (analysis.stats.estimate),
the 1%/0% slowdown of p50 and p99 as a ratio of medians with its bootstrap interval (analysis.stats.compare), and
at 1% loss each transport's CCT against TCP's. ``incast`` and ``slow-spine`` run the same way (capture at h1:eth0,
the incast's root); their losses are queue drops before the capture, so RoCE's retransmitted packets there are the
capture's resends, a lower bound (a resend dropped again never reaches the capture; the resend of a packet dropped
at first is counted, as later packets had crossed), with the switch drops beside them (the capture's resends plus
the drops bound the resends from above), and the rows carry ``condition`` and ``level`` (0 healthy, 1 faulted), a
slow spine's ``slow_fraction``, and ``spine1_share``: which part of the bytes toward h1's leaf crossed spine1
(ECMP's luck for TCP and RoCE, whose flows take one spine each; spraying's split for UET).

Measured: docs/uet.md, "1% loss: TCP, RoCE go-back-N and UET" and "Incast and a slow spine: TCP, RoCE go-back-N
and UET".
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
#: ``both``: incast and slow-spine in one session, sharing their healthy cell (the same run)
CONDITIONS = ("loss", "incast", "slow-spine", "both")
ROOMY_BYTES = 1 << 20  # every queue of the incast's fabric: > the 3 x 256 kB the senders send at once, no drop
SLOW_PORT = "spine1:leaf1"  # spine1's egress toward the incast root's leaf


def cells(transports: list[str], levels: list, round_no: int) -> list[tuple]:
    """The round's (transport, level) cells (level: (condition, loss percent, or 0 healthy / 1 faulted)), rotated
    by the round number: each cell takes each place in turn."""
    all_cells = [(t, x) for x in levels for t in transports]
    k = round_no % len(all_cells)
    return all_cells[k:] + all_cells[:k]


def levels_of(args: argparse.Namespace) -> list[tuple[str, float]]:
    """The session's (condition, level) cells of a transport; ``both``: one healthy incast for the two faults."""
    if args.condition == "loss":
        return [("loss", float(x)) for x in args.losses.split(",")]
    if args.condition == "both":
        return [("incast", 0.0), ("incast", 1.0), ("slow-spine", 1.0)]
    return [(args.condition, 0.0), (args.condition, 1.0)]


def level_label(condition: str, level: float, args: argparse.Namespace | None = None) -> str:
    """A cell's name in the table: 'loss 1%', 'port 16 kB', 'slow spine'."""
    if condition == "loss":
        return f"loss {level:g}%"
    if condition == "incast":
        return f"port {(args.incast_buffer if args else 0) / 1000:g} kB" if level else "healthy"
    return "slow spine" if level else "healthy"


def metrics(transport: str, s: dict, condition: str = "loss") -> dict:
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
    m.update(capture_drops=s.get("wire_capture_kernel_drops"), switch_drops=s.get("switch_drops"),
             trimmed=s.get("uet_trimmed_packets"), drops_by_port=s.get("switch_drops_by_port"))
    return m


def spine1_share(run_dir: Path) -> float | None:
    """Of the bytes the spines sent down to leaf1 (the incast root's leaf) during the run, spine1's share: how much
    of leaf2's senders' data crossed the port the slow-spine fault slows (queues.csv, sent_bytes of spine1:leaf1 and
    spine2:leaf1, last sample minus first). None without samples."""
    import csv

    first: dict[str, int] = {}
    last: dict[str, int] = {}
    try:
        with (Path(run_dir) / "queues.csv").open() as f:
            for r in csv.DictReader(f):
                if r["port"] == "leaf1" and r["node"] in ("spine1", "spine2"):
                    first.setdefault(r["node"], int(r["sent_bytes"]))
                    last[r["node"]] = int(r["sent_bytes"])
    except (OSError, KeyError, ValueError):
        return None
    sent = {n: last[n] - first[n] for n in last}
    total = sum(sent.values())
    return round(sent.get("spine1", 0) / total, 3) if total > 0 else None


def incast_topology(args: argparse.Namespace, level: float, seed: int) -> Path:
    """The small-port incast's fabric as a topology file in OUT: the healthy fabric (2x2x2 leaf-spine at
    --rate-mbps, 1 MiB drop-tail queues), leaf1:h1 (the root's port) at --incast-buffer bytes; seeded as the
    scenario seeds its own."""
    from topologies import PortOverride, QueueSpec, dumps_toml, uniform_leaf_spine

    roomy = QueueSpec("droptail", buffer_bytes=ROOMY_BYTES)
    ports = (PortOverride("leaf1:h1", queue=QueueSpec("droptail", buffer_bytes=args.incast_buffer)),)
    spec = uniform_leaf_spine(2, 2, 2, args.rate_mbps, args.rate_mbps, host_queue=roomy, switch_queue=roomy,
                              seed=seed % 256, ports=ports)
    path = Path(args.out).resolve() / f"incast-port{args.incast_buffer}-seed{seed}.toml"
    path.write_text(dumps_toml(spec))
    return path


def params(args: argparse.Namespace, transport: str, cell: tuple[str, float], seed: int = 1) -> dict:
    """The collective scenario's parameters of one cell: the loss benchmark's all-reduce, or the incast on its
    healthy fabric (the small port's: a topology file; the slow spine's: the healthy one plus :func:`faults`)."""
    from testbed.scenario import get

    condition, level = cell
    sc = get("collective")
    p = {x.name: x.default for x in sc.params}
    p.update(transport=transport, collective=args.collective, size=args.size, iterations=args.iterations, ranks=4,
             capture=f"{args.loss_host}:eth0")
    if condition == "incast" and level:
        p.update(topology_file=str(incast_topology(args, level, seed)))
    else:
        p.update(spines=2, leaves=2, hosts_per_leaf=2, host_rate_mbps=args.rate_mbps,
                 fabric_rate_mbps=args.rate_mbps)
    if condition == "loss":
        p.update(loss_percent=level, loss_host=args.loss_host)
    else:
        p.update(collective="incast", capture="h1:eth0")
        if not p["topology_file"]:
            p.update(buffer_bytes=ROOMY_BYTES)
    sc.validate(p)
    return p


def faults(args: argparse.Namespace, p: dict, cell: tuple[str, float], seed: int) -> list:
    """The slow spine's fault (none for the other cells), checked on the fabric."""
    if cell != ("slow-spine", 1.0):
        return []
    from testbed.commands.runner import parse_faults
    from testbed.scenario import get

    return parse_faults(get("collective"), p, seed, [f"slow-port {SLOW_PORT} at_s=0 fraction={args.slow_fraction:g}"],
                        None)


def run_round(args: argparse.Namespace, round_no: int, rows_file: Path) -> None:
    from testbed.commands.runner import run_scenario
    from testbed.scenario import get

    seed = args.seed + round_no
    for transport, cell in cells(args.transports.split(","), levels_of(args), round_no):
        condition, level = cell
        tag = f"loss{level:g}" if condition == "loss" else f"{condition}{int(level)}"
        d = Path(args.out) / f"{transport}-{tag}-seed{seed}-{time.strftime('%H%M%S')}"
        row = {"transport": transport, "condition": condition, "level": level, "seed": seed}
        if condition == "loss":
            row["loss"] = level
        if cell == ("slow-spine", 1.0):
            row["slow_fraction"] = args.slow_fraction
        t0 = time.monotonic()
        try:
            p = params(args, transport, cell, seed)
            s = run_scenario(get("collective"), p, seed, d, quiet=True, faults=faults(args, p, cell, seed))
            row.update(metrics(transport, s, condition), spine1_share=spine1_share(d))
        except Exception as e:  # noqa: BLE001 - a failed run is reported, the others still run
            row["error"] = f"{type(e).__name__}: {e}"[:300]
        row.update(wall_s=round(time.monotonic() - t0, 1), dir=str(d))
        print(json.dumps(row), flush=True)
        with rows_file.open("a") as f:
            f.write(json.dumps(row) + "\n")


def _level(r: dict) -> float:
    return r["level"] if "level" in r else r["loss"]


def _vals(rows: list[dict], transport: str, level: float, key: str) -> list[float]:
    return [r[key] for r in rows if r["transport"] == transport and _level(r) == level and r.get(key) is not None]


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


def _belongs(r: dict, condition: str, fraction: float | None) -> bool:
    """Whether a row is one of ``condition``'s cells: its own (a slow spine's of ``fraction``, when given; rows
    that recorded none ran at 0.25), or the healthy incast that incast and slow-spine share."""
    c = r.get("condition", "loss")
    if _level(r) == 0:
        return c == condition or {c, condition} <= {"incast", "slow-spine"}
    return c == condition and (c != "slow-spine" or fraction is None or r.get("slow_fraction", 0.25) == fraction)


def table(rows: list[dict], levels: list[float], condition: str = "loss", args: argparse.Namespace | None = None
          ) -> str:
    """The markdown table of one condition's rows (rows without ``condition`` are loss rows; incast and slow-spine
    share their healthy cell, level 0): per transport, medians [interval] over runs, the faulted/healthy slowdowns
    and the faulted cell's contrasts against TCP."""
    rows = [r for r in rows if _belongs(r, condition, args.slow_fraction if args else None)]
    ok = [r for r in rows if "error" not in r and r.get("verified") is not False]
    ts = [t for t in TRANSPORTS if any(r["transport"] == t for r in ok)]
    lo, hi = min(levels), max(levels)
    a, b = level_label(condition, lo, args), level_label(condition, hi, args)
    short = (f"{hi:g}%/{lo:g}%", f"at {hi:g}%") if condition == "loss" else (f"{b} / {a}", f"{b},")
    head = "| | " + " | ".join(NAMES[t] for t in ts) + " |\n|---|" + "---|" * len(ts)
    lines = [head]

    def line(label: str, f) -> None:
        lines.append(f"| {label} | " + " | ".join(f(t) for t in ts) + " |")

    line(f"runs ({a} / {b[5:] if condition == 'loss' else b})",
         lambda t: f"{len(_vals(ok, t, lo, 'cct_p50_ms'))} / {len(_vals(ok, t, hi, 'cct_p50_ms'))}")
    for q in ("p50", "p99"):
        for x in (lo, hi):
            line(f"CCT {q} ms, {level_label(condition, x, args)}",
                 lambda t, q=q, x=x: _est(_vals(ok, t, x, f"cct_{q}_ms")))
    for q in ("p50", "p99"):
        line(f"slowdown {q} {short[0]}", lambda t, q=q: _ratio(_vals(ok, t, hi, f"cct_{q}_ms"),
                                                              _vals(ok, t, lo, f"cct_{q}_ms")))
    for q in ("p50", "p99"):
        line(f"CCT {q} {short[1]} / TCP's", lambda t, q=q: "-" if t == "tcp" else
             _ratio(_vals(ok, t, hi, f"cct_{q}_ms"), _vals(ok, "tcp", hi, f"cct_{q}_ms")))
    for key, label in (("retrans_pkts", "retransmitted packets"), ("retrans_bytes", "retransmitted bytes"),
                       ("recovery_rounds", "go-back-N rounds"), ("timer_expiries", "timer expiries"),
                       ("switch_drops", "switch drops"), ("spine1_share", "spine1's share toward leaf1")):
        for x in (lo, hi):
            fmt = "{:.2f}" if key == "spine1_share" else "{:.0f}"
            line(f"{label}, {level_label(condition, x, args)}",
                 lambda t, key=key, x=x, fmt=fmt: _est(_vals(ok, t, x, key), fmt))
    bad = [r for r in rows if r not in ok]
    if bad:
        lines.append(f"\nleft out: {len(bad)} runs: " + "; ".join(
            f"{r['transport']} {level_label(condition, _level(r), args)} seed {r['seed']}: "
            f"{r.get('error', 'data not verified')}" for r in bad))
    return "\n".join(lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, every check made before anything is created (a bad value: one line, exit status 2)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--condition", choices=CONDITIONS, default="loss",
                    help="loss (--losses), incast (1 MiB vs --incast-buffer root port), slow-spine, or both (incast "
                    "and slow-spine sharing the healthy cell) (default loss)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds this session, each every cell once (default 2)")
    ap.add_argument("--transports", default="tcp,rdma,uet", help="comma list of tcp, rdma, uet")
    ap.add_argument("--losses", default="0,1", help="loss: loss percents at --loss-host's NIC (default 0,1)")
    ap.add_argument("--loss-host", default="h1", help="loss: the host whose NIC drops arriving packets (default h1)")
    ap.add_argument("--incast-buffer", type=int, default=16_000,
                    help="incast: the root's leaf port's drop-tail buffer in bytes when faulted (default 16000)")
    ap.add_argument("--slow-fraction", type=float, default=0.1,
                    help=f"slow-spine: {SLOW_PORT}'s rate as a fraction of its own (default 0.1)")
    ap.add_argument("--collective", default="allreduce", help="loss: the collective (default allreduce, ring)")
    ap.add_argument("--size", default="256K", help="per-rank message size (default 256K)")
    ap.add_argument("--iterations", type=int, default=8, help="measured iterations a run (default 8)")
    ap.add_argument("--rate-mbps", type=float, default=10.0, help="every link's rate (default 10)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the first round (default 1); round r: seed + r")
    ap.add_argument("--first-round", type=int, default=0, help="round number to start at (rotation, seed)")
    ap.add_argument("--out", default="results/xport-loss", help="run directories and rows.jsonl")
    ap.add_argument("--table-only", action="store_true", help="only print the table from OUT/rows.jsonl")
    args = ap.parse_args(argv)
    bad = [t for t in args.transports.split(",") if t not in TRANSPORTS]
    if bad or args.rounds < 1:
        ap.error(f"unknown transport {bad[0]!r}" if bad else "--rounds must be >= 1")
    if not 3000 <= args.incast_buffer < ROOMY_BYTES:
        ap.error(f"--incast-buffer: bytes in 3000..{ROOMY_BYTES} (got {args.incast_buffer})")
    if not 0 < args.slow_fraction < 1:
        ap.error(f"--slow-fraction: in (0, 1) (got {args.slow_fraction:g})")
    try:
        losses = [float(x) for x in args.losses.split(",")]
    except ValueError:
        ap.error(f"--losses: comma-separated percents, e.g. 0,1 (got {args.losses!r})")
    if len(losses) < 2 or not all(0 <= x < 100 for x in losses):
        ap.error(f"--losses: at least two percents in 0..100 (got {args.losses!r})")
    from testbed.errors import UsageError

    # the scenario's own checks (--size, --iterations, ...) on the session's healthy cell, no file written
    cell = ("loss", 0.0) if args.condition == "loss" else ("slow-spine", 0.0)
    for t in [] if args.table_only else args.transports.split(","):
        try:
            params(args, t, cell)
        except (UsageError, ValueError) as e:
            ap.error(str(e))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    out = Path(args.out)
    rows_file = out / "rows.jsonl"
    if not args.table_only:
        from testbed.errors import require_root

        require_root("the transports-under-loss benchmark")
        out.mkdir(parents=True, exist_ok=True)
        for r in range(args.first_round, args.first_round + args.rounds):
            run_round(args, r, rows_file)
    rows = [json.loads(x) for x in rows_file.read_text().splitlines() if x.strip()] if rows_file.exists() else []
    for r in rows:  # rows from before spine1_share was recorded: from their run directories
        if "spine1_share" not in r and r.get("condition", "loss") != "loss" and Path(r.get("dir", "")).is_dir():
            r["spine1_share"] = spine1_share(Path(r["dir"]))
    where = {"loss": f"loss at {args.loss_host}'s NIC", "incast": f"incast into h1, 1 MiB drop-tail queues; "
             f"faulted: h1's leaf port {args.incast_buffer} B", "slow-spine": f"incast into h1, 1 MiB drop-tail "
             f"queues; faulted: {SLOW_PORT} at {args.slow_fraction:g} of its rate"}
    where["both"] = where["incast"] + f", or {SLOW_PORT} at {args.slow_fraction:g} of its rate"
    what = args.collective if args.condition == "loss" else "incast (direct gather)"
    print(f"\n{what} {args.size} x {args.iterations} iterations, 4 ranks, 2x2 leaf-spine, "
          f"{args.rate_mbps:g} Mbit/s, {where[args.condition]}; medians [interval] over runs\n")
    for condition in ("incast", "slow-spine") if args.condition == "both" else (args.condition,):
        print(f"\n{condition}:\n" if args.condition == "both" else "", end="")
        print(table(rows, [0.0, 1.0] if condition != "loss" else [x for _, x in levels_of(args)], condition, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
