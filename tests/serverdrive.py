"""What the fabric-over-servers tests do on a built fabric (testbed.network.serverfabric): a TCP transfer between
two hosts whose data is checked end to end (the receiver's SHA-256 of what arrived against the sender's of what it
sent), each end run by its server's agent (`run` in the host's namespace), so the receiver may sit in another
kernel."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Callable

PORT = 5301

RECEIVER = """
import hashlib, socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1); s.settimeout(float(sys.argv[3]))
c, _ = s.accept(); c.settimeout(float(sys.argv[3])); h = hashlib.sha256(); n = 0
while True:
    b = c.recv(1 << 16)
    if not b:
        break
    h.update(b); n += len(b)
print(n, h.hexdigest())
"""

SENDER = """
import hashlib, socket, sys, time
dst, port, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
block = hashlib.sha512(b"testbed").digest() * 1024            # 64 KiB, the same on every run
data = (block * (size // len(block) + 1))[:size]
deadline = time.monotonic() + 60
while True:                                                   # the receiver may still be starting (another kernel)
    try:
        c = socket.create_connection((dst, port), timeout=5); break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.2)
t0 = time.monotonic(); c.sendall(data); c.shutdown(socket.SHUT_WR); c.recv(1); c.close()
print(len(data), hashlib.sha256(data).hexdigest(), time.monotonic() - t0)
"""


def transfer(fab, src: str, dst: str, size_bytes: int, timeout_s: float = 120.0) -> dict:
    """``size_bytes`` over kernel TCP from host ``src`` to host ``dst`` of ``fab``, each end started by its own
    server's agent; both ends' byte counts and digests, and the sender's seconds."""
    # each agent answers one request at a time: a receiver's `run` would hold the agent the sender needs
    assert fab.server_of(src) != fab.server_of(dst), f"{src} and {dst} are on one server: use a local transfer"
    dst_ip = fab.topology.host_ip(dst)
    out: dict = {}

    def receive() -> None:
        try:
            out["rx"] = fab.links[fab.server_of(dst)].call(
                "run", timeout_s=timeout_s + 30, ns=fab.ns(dst), args={"timeout_s": timeout_s},
                argv=[sys.executable, "-c", RECEIVER, dst_ip, str(PORT), str(timeout_s)])
        except Exception as e:  # noqa: BLE001 - the test reads it
            out["rx_error"] = str(e)
    t = threading.Thread(target=receive, daemon=True)
    t.start()
    out["tx"] = fab.links[fab.server_of(src)].call(
        "run", timeout_s=timeout_s + 30, ns=fab.ns(src), args={"timeout_s": timeout_s},
        argv=[sys.executable, "-c", SENDER, dst_ip, str(PORT), str(size_bytes)])
    t.join(timeout_s + 60)
    return out


def assert_delivered(out: dict, size_bytes: int) -> float:
    """Both ends ran clean and the receiver got exactly what was sent; the sender's seconds."""
    assert "rx" in out, out
    rx, tx = out["rx"], out["tx"]
    assert rx["rc"] == 0 and tx["rc"] == 0, out
    n_rx, digest_rx = rx["stdout"].split()
    n_tx, digest_tx, seconds = tx["stdout"].split()
    assert int(n_rx) == int(n_tx) == size_bytes and digest_rx == digest_tx, out
    return float(seconds)


# ---- a collective across servers (testbed.workloads.serverjobs) -------------------------------------------------

def causal_slack_s(res, rate_mbps: float, burst_bytes: int) -> list[float]:
    """For a 2-rank job, per (iteration, op, receiving rank): the receiver's op end minus the sender's op start
    (both on the reference clock) minus the least time the receiver's bytes can take through a ``rate_mbps`` port
    that lets ``burst_bytes`` pass at once (its HTB burst). In a 2-rank ring every byte a rank receives in an op
    is sent by its peer in the same op, after the peer's op began, and crosses the peer's and its own shaped ports:
    so each value is >= 0 in true time whatever the path, and a value below -(clock bound) means the two ranks'
    clocks were not put on one clock within that bound."""
    rows = {(r[0], r[2], r[4]): r for r in res.ops}
    assert {k[2] for k in rows} == {0, 1}, sorted(rows)
    out = []
    for (it, k, rank), row in sorted(rows.items()):
        peer = rows[(it, k, 1 - rank)]
        least_s = max(0, row[8] - burst_bytes) * 8 / (rate_mbps * 1e6)
        out.append(row[6] - peer[5] - least_s)
    return out


def job_processes_left(folders_glob: str = "/tmp/tb-*-job-*") -> list[str]:
    """Ranks a server's agent started on this machine (traffic.agent with an inherited control connection: other
    runs' agents have a path) and job folders it made (serverprocs), still there."""
    import glob
    from pathlib import Path

    found = glob.glob(folders_glob)
    for p in Path("/proc").iterdir():
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "-m traffic.agent" in cmd and "--control fd:" in cmd:
            found.append(f"{p.name}: {cmd[:120]}")
    return found


def allreduce_across(fab, workdir, listen: tuple[str, int], listen_in, iterations: int, message_bytes: int = 256_000,
                     rate_mbps: float = 20, max_bound_s: float = 2e-3, **kw):
    """A 2-rank ring all-reduce over h1 and h2 of ``fab`` (on different servers) through the Controller on TCP
    ``listen`` (testbed.workloads.serverjobs.run_collective; ``kw`` to it), asserting: every rank verified its data;
    every op row is there; the far rank's clock bound is in (0, ``max_bound_s``); and two causal checks on the
    reference clock, each true in real time whatever the path and each failed by a clock error larger than its
    slack:

    * each rank's op ends no earlier than its peer's op began plus the time its received bytes take through the
      ``rate_mbps`` ports (:func:`causal_slack_s`): the slack is the op's time beyond the line rate, so an offset
      error beyond it in either direction fails one of the two ranks' checks;
    * every op of both ranks lies between the controller's go (t_ready: an op starts after its rank received the
      go) and its receipt of the last result (t_end: a result is sent after its ops ended).

    Rejected: comparing the two ranks' first op starts (the go goes out with the same offset the results come back
    with, so an offset error cancels) and "ends agree within one step's time" (a timing assumption, not causality).
    Returns the results and the slacks."""
    from testbed.workloads.serverjobs import ring_job, run_collective
    from traffic.controller import Member

    job, schedules = ring_job(2, message_bytes, iterations)
    members = [Member(r, h, fab.ns(h), fab.topology.host_ip(h)) for r, h in enumerate(("h1", "h2"))]
    res = run_collective(fab, workdir, job, schedules, members, listen=listen, listen_in=listen_in, **kw)
    assert res.verified and all(v["verified"] for v in res.per_rank.values()), res.per_rank
    assert len(res.ops) == 2 * iterations and res.per_rank[0]["clock"]["reference"], res.ops
    bound_s = res.clock_uncertainty_s
    assert 0 < bound_s < max_bound_s and res.per_rank[1]["clock"]["uncertainty_s"] == bound_s, res.per_rank[1]
    slack = causal_slack_s(res, rate_mbps, 3 * 1500)
    assert min(slack) >= -bound_s, (slack, bound_s)
    for row in res.ops:
        assert res.t_ready - bound_s <= row[5] <= row[6] <= res.t_end + bound_s, (row, res.t_ready, res.t_end)
    return res, slack


# ---- a servers-file run (testbed.workloads.serverlab) ------------------------------------------------------

#: `testbed run collective --set servers=FILE` over the two kernels: h1 (host) and h2 (VM), 20 Mbit/s, MTU 1450
RUN_SETTINGS = {"ranks": 2, "spines": 2, "leaves": 2, "hosts_per_leaf": 1, "host_rate_mbps": 20, "fabric_rate_mbps": 20,
                "mtu": 1450, "collective": "allreduce", "size": 256_000, "iterations": 3, "warmup": 0,
                "sample_interval_ms": 5}


def queue_rows_on_one_clock(out: Path, window_s: tuple[float, float], bound_s: float, rec: dict) -> None:
    """A servers run's queues.csv (testbed.measure.serversamples): rows from the ports of both servers' nodes,
    and every port that carried the all-reduce's data did so only between the controller's go and its last result
    on the reference clock (within the far clock's bound, two of the slowest server's achieved sampling rounds and
50 ms): the far server's samples line
    up with the reference's. The ring's data goes h1 -> h2 and h2 -> h1, so h1's port (server-1) and h2's
    (server-2) both carry it; the ranks' connections are opened before the go, so only rounds that moved more than
    a few frames count as data."""
    import json

    from analysis.load import load_csv

    q = load_csv(out / "queues.csv", "queues")
    nodes = {s: set(v["nodes"]) for s, v in rec.items()}
    assert nodes["server-1"] & set(q["node"]) and nodes["server-2"] & set(q["node"]), (set(q["node"]), nodes)
    sampling = json.loads((out / "manifest.json").read_text())["servers_sampling"]   # each server's achieved rounds
    slack = bound_s + 2 * max(st["queue_sample_interval_s"] for st in sampling.values()) + 0.05
    for host in ("h1", "h2"):
        rows = q[q["node"] == host].groupby("t_s")["sent_bytes"].sum().sort_index()
        moved = rows[rows.diff() > 4000].index   # data (a round of 5 ms moves up to 12.5 kB), not the handshakes
        assert rows.iloc[-1] - rows.iloc[0] >= RUN_SETTINGS["size"], (host, rows.iloc[0], rows.iloc[-1])
        assert window_s[0] - slack <= moved.min() and moved.max() <= window_s[1] + slack, (host, moved.min(),
                                                                                          moved.max(), window_s)


def servers_file_run(vm, tmp_path: Path, wire_host: str, wire_guest: str, agents_left: Callable[[], list]) -> None:
    """`testbed run collective --set servers=FILE` (``vm``: tests/host/test_two_kernels_host.py's SshdVm: ``cli``
    runs testbed in its wire namespace, ``servers`` its servers file, ``keys.client`` its ssh key) naming this
    machine (``wire_host``) and the VM (``wire_guest``): the Lab over a ServerFabric (testbed.workloads.serverlab).
    From the run directory: exit 0, data verified, ops.csv with both ranks' rows, servers.json with two kernels and
    their clock passes, a fidelity verdict per server (each unfaithful one named in the run's reasons), clocks.csv's
    bound (the summary's clock_uncertainty_us_max) in (0, 2 ms), and both causal checks of :func:`allreduce_across`
    on the ops as written to ops.csv (on the reference clock; the controller's go and last result from the
    manifest's control_window_s); nothing left on this kernel (``agents_left``: this machine's agents and ssh
    clients the run started; the guest's leftovers: the caller's next look into it). Then
    a bad servers file (a crossing link's MTU the VM's NIC cannot carry): status 2, one line, no namespace made."""
    import json
    import os
    import time
    import types

    from analysis.load import load_csv
    from testbed.kernel import netns

    before = set(netns.list_ours())
    sets = [x for k, v in {**RUN_SETTINGS, "servers": vm.servers}.items() for x in ("--set", f"{k}={v}")]
    out = tmp_path / "run"
    t0 = time.monotonic()
    r = vm.cli("run", "collective", *sets, "--out", str(out), "--quiet", timeout=300)
    run_s = time.monotonic() - t0
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["data_verified"] is True and summary["cct_ms_p50"] > 0, summary
    ops = load_csv(out / "ops.csv", "ops")
    assert sorted(ops["rank"].value_counts().items()) == [(0, 3), (1, 3)], ops
    rec = json.loads((out / "servers.json").read_text())["servers"]
    assert rec["server-1"]["kernel"] == os.uname().release != rec["server-2"]["kernel"], rec
    assert rec["server-2"]["nodes"] == ["h2", "leaf2", "spine2"] and len(rec["server-2"]["clock"]) >= 2, rec
    clocks = load_csv(out / "clocks.csv", "clocks").set_index("rank")
    bound_s = float(clocks.loc[1, "uncertainty_s"])
    assert clocks.loc[1, "server"] == "server-2" and 0 < bound_s < 2e-3, clocks
    assert summary["clock_uncertainty_us_max"] == bound_s * 1e6, summary
    rows = [[o.iteration, o.op, o.op_index, o.collective, o.rank, o.start_s, o.end_s, o.bytes_sent, o.bytes_recv]
            for o in ops.itertuples()]
    slack = causal_slack_s(types.SimpleNamespace(ops=rows), RUN_SETTINGS["host_rate_mbps"], 3 * 1500)
    assert min(slack) >= -bound_s, (slack, bound_s)
    go_s, last_s = json.loads((out / "manifest.json").read_text())["control_window_s"]
    for row in rows:   # the second causal check of allreduce_across: between the go and the last result
        assert go_s - bound_s <= row[5] <= row[6] <= last_s + bound_s, (row, go_s, last_s)
    queue_rows_on_one_clock(out, (go_s, last_s), bound_s, rec)
    # the ports' drops and marks from both servers' samples; TCP's counters are not read over servers
    assert isinstance(summary["switch_drops"], int) and isinstance(summary["ecn_marks"], int), summary
    assert summary["tcp_retrans_segs"] is None, summary
    by_server = summary["fidelity_by_server"]   # each server judged on its own ports, sampler and CPU
    assert set(by_server) == {"server-1", "server-2"}, by_server
    named = [s for s, v in by_server.items() if not v["ok"]]
    assert summary["servers_unfaithful"] == len(named) and (not named or summary["fidelity_ok"] is False), summary
    assert all(f"{s}: " in str(summary["fidelity_reasons"]) for s in named), summary
    print(json.dumps({"servers_file_run_s": run_s, "fabric_build_s": json.loads((out / "manifest.json").read_text())[
        "fabric_build_s"], "bound_s": bound_s, "slack_s": slack,
                      "cct_ms_p50": summary["cct_ms_p50"], "clock_passes": rec["server-2"]["clock"],
                      "fidelity_by_server": by_server}))
    assert set(netns.list_ours()) <= before and not job_processes_left(), netns.list_ours()
    assert not agents_left(), agents_left()
    # (a bad line of the file is refused by the same load, unit-tested in tests/unit/test_servers_file.py)
    for name, line, says in (("mtu", f"server-2 root@{wire_guest} key={vm.keys.client} mtu=1400", "crosses servers"),):
        bad = vm.servers.with_name(f"bad-{name}.txt")
        bad.write_text(f"server-1 localhost address={wire_host}\n{line}\n")
        sets = [x for k, v in {**RUN_SETTINGS, "servers": bad}.items() for x in ("--set", f"{k}={v}")]
        r = vm.cli("run", "collective", *sets, "--out", str(tmp_path / f"bad-{name}"), timeout=120)
        assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert set(netns.list_ours()) <= before and not agents_left()
    print(f"servers-file run step {time.monotonic() - t0:.1f} s")
