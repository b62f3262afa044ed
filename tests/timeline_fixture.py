"""A hand-made collective run directory for the timeline and trace tests: 4 ranks on 2 hosts (ranks 0, 1 on h1;
2, 3 on h2), 3 iterations of one all-reduce. Rank 3 is a straggler: it arrives at every op LATE_S after the others
(who arrive 1 ms apart). The agent's ``wait_s`` is deliberately large on every rank (as a real agent blocked on a
ring's bytes reports it), so a split built on it would paint transfer as waiting."""

from __future__ import annotations

import json
from pathlib import Path

T0 = 500.0                 # the run's start (manifest t0_monotonic)
COMPUTE_S = 0.050          # everyone's compute per iteration
LATE_S = 0.080             # rank 3 arrives this much after the last of the others
TRANSFER_S = 0.040         # from the last arrival to the op's end (every rank ends within 1 ms of the others)
HOST = {0: "h1", 1: "h1", 2: "h2", 3: "h2"}


def op_rows(straggler: bool = True) -> list[dict]:
    """ops.csv rows: iteration i starts at T0 + 1 + i * 0.5 s."""
    rows = []
    for it in range(3):
        base = T0 + 1.0 + it * 0.5
        arrive = {r: base + COMPUTE_S + 0.001 * r for r in range(3)}
        arrive[3] = base + COMPUTE_S + 0.002 + (LATE_S if straggler else 0.001)
        last = max(arrive.values())
        for r in range(4):
            end = last + TRANSFER_S + 0.0002 * r
            rows.append({"iteration": it, "op": "allreduce", "op_index": 0, "collective": "allreduce", "rank": r,
                         "host": HOST[r], "start_s": arrive[r], "end_s": end, "bytes_sent": 300000,
                         "bytes_recv": 300000, "wait_s": 0.9 * (end - arrive[r]), "iter_start_s": base,
                         "size_bytes": 400000})
    return rows


def write_run(path: Path, straggler: bool = True) -> Path:
    """The run directory: manifest, ops.csv, queues.csv (two ports, one with drops), pfc.csv, events.csv."""
    path.mkdir(parents=True, exist_ok=True)
    manifest = {"scenario": "collective", "params": {"ranks": 4}, "seed": 1, "topology": {"kind": "leafspine"},
                "started_wall": 1.7e9, "ended_wall": 1.7e9 + 3.0, "t0_monotonic": T0, "complete": True}
    (path / "manifest.json").write_text(json.dumps(manifest))
    (path / "summary.json").write_text("{}")
    rows = op_rows(straggler)
    cols = list(rows[0])
    (path / "ops.csv").write_text("\n".join([",".join(cols)] + [",".join(str(r[c]) for c in cols) for r in rows])
                                  + "\n")
    q = ["t_s,node,port,class,backlog_bytes,backlog_packets,drops,marks,sent_bytes,sent_packets,overlimits"]
    for i in range(30):
        t = T0 + 1.0 + i * 0.05
        q.append(f"{t},leaf1,spine1,1:10,{(i % 5) * 3000},{(i % 5) * 2},{i // 10},0,{i * 1000},{i},0")
        q.append(f"{t},leaf2,h3,1:10,{(i % 3) * 1000},{i % 3},0,0,{i * 1000},{i},0")
    (path / "queues.csv").write_text("\n".join(q) + "\n")
    (path / "pfc.csv").write_text("t_s,node,port,prio,event,backlog_bytes\n"
                                  f"{T0 + 1.2},leaf1,spine1,3,xoff,9000\n{T0 + 1.25},leaf1,spine1,3,xon,3000\n")
    (path / "events.csv").write_text("t_s,kind,target,detail\n"
                                     f"{T0 + 1.5},cpu_throttled,h2,quota 30%\n{T0 + 2.5},cpu_restored,h2,\n")
    return path
