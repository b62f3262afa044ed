"""Real distributed programs on the emulated fabric (host kernel): a 4-rank PyTorch DDP job over gloo reports its
steps through the event protocol, and a small drop-tail buffer under background traffic gives it a higher step-time
p99 and more retransmissions than a clean fabric, with the report joining its slowest step with the drops; an MPI
all-reduce program runs across 4 hosts under a real mpirun; the README's two program commands pass as written with a
PATH whose first python3 lacks torch and mpi4py (ranks get testbed's own interpreter, as torchrun's do); each host
runs under its own hostname; a rank that fails, hangs or never connects ends the run with the rank named, and a
launch that starts no rank ends with the hosts its daemons reached, complete: false, and nothing left behind."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from analysis import stats
from analysis.load import load_run
from analysis.metrics import step_times
from testbed.kernel import netns
from testbed.commands.runner import run_scenario
from testbed.scenario import get
from tests.labdrive import host_lab, run_once

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="builds namespaces: run as root")
ROOT = Path(__file__).resolve().parents[2]
# a leading python3 runs under testbed's own interpreter (sys.executable: it sees python3-torch and python3-mpi4py)
DDP = f"python3 {ROOT}/examples/programs/ddp_train.py --steps 10"
MPI = f"python3 {ROOT}/examples/programs/mpi_allreduce.py --iterations 10"
# inside sh -c a python3 is PATH's: these name the interpreter by its path
DDP_SH = f"{sys.executable} {ROOT}/examples/programs/ddp_train.py --steps 10"
MPI_SH = f"{sys.executable} {ROOT}/examples/programs/mpi_allreduce.py --iterations 10"


def program(tmp_path, name, **kw):
    sc = get("program")
    p = {x.name: x.default for x in sc.params}
    p.update(kw)
    sc.validate(p)
    return run_scenario(sc, p, 1, tmp_path / name, quiet=True)


def cli(tmp_path, name, *sets, env=None):
    argv = [sys.executable, "-m", "testbed.cli", "run", "program", "--quiet", "--out", str(tmp_path / name)]
    for s in sets:
        argv += ["--set", s]
    t0 = time.monotonic()
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    return r, time.monotonic() - t0


def nothing_left(before_ns):
    """No namespace of the run, and no process of the program still running (an exited daemon that its new parent
    has not reaped yet, a zombie, is not running)."""
    assert netns.list_ours() == before_ns
    ps = subprocess.run(["ps", "-eo", "stat=,args="], capture_output=True, text=True).stdout.splitlines()
    left = [x for x in ps if not x.lstrip().startswith("Z")
            and any(w in x for w in ("ddp_train", "mpi_allreduce", "orted", "mpirun"))]
    assert left == [], left


def test_ddp_step_tail_grows_with_a_small_buffer_under_background_traffic(tmp_path, monkeypatch):
    """The 9 measured steps a side compared by analysis.stats.compare (rank test and the ratio of medians' bootstrap
    interval), not one run's step p99 (the max of 9 steps) against the other's; the drops and retransmissions are
    the kernel's counters of the mechanism. Measured (host kernel, 2-CPU machine shared with other developers' runs,
    3 passes): busy steps 675-1336, 677-909 and 760-1320 ms (medians 1093, 815, 1202), clean 540-644 ms (medians
    583-597); ratio 1.83 [1.22, 2.18], 1.40 [1.25, 1.50] and 2.03 [1.71, 2.18], p 0.0004 each time (every busy step
    above every clean one). The verdict needs p < 0.05, i.e. up to 17 of the 81 busy/clean pairs may be out of
    order, and the ratio's interval above 1; the busy steps that miss the drops come closest (675 ms, 30 ms above
    the slowest clean step). A false failure needs 4-5 of the 9 busy steps inside the clean range in one run; none
    was in 27: rarer than 1 in 100 on this evidence, though 3 passes are thin for the claim.

    The two runs are lab 11's (its lab.toml: 3 hosts per leaf, ranks on h1..h4; the congested run adds two bulk
    flows from the idle hosts into rank hosts through 50 KB buffers; seed 1), made once by the lab driver (`lab run
    11 --repeat 1`) and checked as CI checks a lab run once (tests/labdrive.py) as well as here: one pair of runs
    serves both. Its ranks run the lab's command, under /usr/bin/python3 (Debian's interpreter); a bare `python3`,
    which becomes testbed's own, runs the same DDP job in the README test below. Measured so (2026-12-06, 2 passes):
    busy 805-1206 and 662-983 ms, clean 552-675 and 567-632 ms, ratio 1.87 [1.58, 2.00] and 1.43 [1.18, 1.61], p
    0.0004 each; 33 and 27 s (the lab's once-run check included), where this test and lab 11's once-run in
    test_labs_host.py took 31 + 30 s apart."""
    before = netns.list_ours()
    monkeypatch.chdir(ROOT)  # the lab's command names its program relative to the checkout, as students run it
    lab = host_lab("11")
    assert [r.name for r in lab.runs] == ["clean", "congested"], lab.runs
    run_once(lab, tmp_path / "lab")
    run = {d: tmp_path / "lab" / r / "seed-1" for d, r in (("clean", "clean"), ("busy", "congested"))}
    clean, busy = (json.loads((run[d] / "summary.json").read_text()) for d in ("clean", "busy"))
    keys = ("steps_reported", "step_ms_p50", "step_ms_p99", "cct_ms_p99", "tcp_retrans_segs", "switch_drops",
            "comm_wait_fraction", "bg_goodput_mbps", "program_s")
    print({k: (clean.get(k), busy.get(k)) for k in keys})
    for s, d in ((clean, "clean"), (busy, "busy")):
        assert s["events"] is True and s["steps_reported"] == 9 and s["events_malformed"] == 0, s  # 10 - 1 warm-up
        out = [(run[d] / "program" / f"rank-{r}.stdout").read_text() for r in range(4)]
        assert all("replicas identical: True" in o for o in out), out
        prog = pd.read_csv(run[d] / "program.csv")
        assert prog["exit_status"].tolist() == [0, 0, 0, 0] and prog["host"].tolist() == ["h1", "h2", "h3", "h4"]
    man = json.loads((run["busy"] / "manifest.json").read_text())
    assert man["complete"] is True and man["program"]["versions"]["torch"], man["program"]
    # the 9 measured steps a side, compared by analysis.stats (rank test and the ratio of medians' interval)
    steps = {d: step_times(load_run(run[d]).ops)["step_s"] * 1e3 for d in ("busy", "clean")}
    d = stats.compare(steps["busy"], steps["clean"])
    print(f"DDP step busy vs clean: {d.a.text()} vs {d.b.text()}; ratio {d.ratio:.2f} "
          f"[{d.ratio_low:.2f}, {d.ratio_high:.2f}], p {d.p_value:.2g}: {d.verdict}; "
          f"busy {sorted(round(x) for x in steps['busy'])}, clean {sorted(round(x) for x in steps['clean'])}")
    assert d.verdict == "A > B", d
    assert busy["tcp_retrans_segs"] > 10 * (clean["tcp_retrans_segs"] + 5), (clean, busy)
    assert busy["switch_drops"] > 50 and clean["switch_drops"] < busy["switch_drops"] / 10, (clean, busy)
    rep = subprocess.run([sys.executable, "-m", "testbed.cli", "report", str(run["busy"])],
                         capture_output=True, text=True, timeout=300)
    assert rep.returncode == 0, rep.stderr
    md = (run["busy"] / "report.md").read_text()
    line = next(x for x in md.splitlines() if x.startswith("The slowest step:"))
    assert "drops on" in line, line
    nothing_left(before)


def test_an_mpi_allreduce_runs_across_four_hosts_under_mpirun(tmp_path):
    """One launch, no retry: a launch that starts no rank fails here (the hang it once hid was Open MPI's session
    directories colliding under one hostname; docs/programs.md)."""
    before = netns.list_ours()
    s = program(tmp_path, "mpi", cmd=MPI, launcher="mpi", timeout_s=60.0)
    print(s)
    run = tmp_path / "mpi"
    out = (run / "program" / "mpi" / "1" / "rank.0" / "stdout").read_text()
    assert "data verified: True" in out and "Open MPI" in out, out
    assert (run / "program" / "hostfile").read_text().count("slots=1") == 4
    ops = pd.read_csv(run / "ops.csv")
    assert sorted(ops["rank"].unique()) == [0, 1, 2, 3] and ops["host"].nunique() == 4
    assert s["steps_reported"] == 9 and s["cct_samples"] == 9, s
    # every rank host's NIC carried the ring's traffic (262144 B x 10 iterations, 2(n-1)/n of it sent by each)
    q = pd.read_csv(run / "queues.csv")
    sent = q[q["port"] == "eth0"].groupby("node")["sent_bytes"].max()
    assert all(sent[h] > 10 * 262_144 for h in ("h1", "h2", "h3", "h4")), sent
    man = json.loads((run / "manifest.json").read_text())
    assert "Open MPI" in man["program"]["versions"]["mpirun"] and man["program"]["versions"]["mpi4py"]
    nothing_left(before)


FAILING = {
    # a rank that exits non-zero while the others wait for it
    "exits": (['cmd=sh -c \'[ "$RANK" = 2 ] && exit 7; sleep 60\'', "timeout_s=60"],
              "program: rank 2 (h3) exited with status 7"),
    # a program that hangs past its timeout
    "hangs": (["cmd=sleep 60", "timeout_s=3"], "still running after timeout_s=3; killed"),
    # rank 0 never starts its rendezvous: the others' gloo connect times out and they fail, named
    "never connects": ([f'cmd=sh -c \'[ "$RANK" = 0 ] && sleep 60; exec {DDP_SH} --timeout-s 4\'', "timeout_s=60"],
                       "exited with status 1"),
    # under mpirun: a rank that fails ends mpirun, which is named
    "mpi rank fails": ([f'cmd=sh -c \'[ "$OMPI_COMM_WORLD_RANK" = 1 ] && exit 5; exec {MPI_SH}\'', "launcher=mpi",
                        "timeout_s=60"], "program: mpirun exited with status 5"),
}


@pytest.mark.parametrize("case", sorted(FAILING))
def test_a_failing_program_ends_the_run_cleanly(tmp_path, case):
    sets, says = FAILING[case]
    before = netns.list_ours()
    r, took = cli(tmp_path, "run", *sets)
    print(case, r.returncode, took, r.stderr)
    assert r.returncode == 1, (r.stdout, r.stderr)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert says in lines[-1] and "\n" not in lines[-1], lines
    if case != "hangs" and not case.startswith("mpi"):
        assert "rank " in lines[-1]
    assert took < 50, took  # the failure ended the run, not the 60 s sleeps
    man = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert man["complete"] is False
    nothing_left(before)


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_program_run_stopped_by_a_signal_leaves_nothing(tmp_path, sig):
    """SIGTERM (a job scheduler, `kill`) and SIGINT (Ctrl-C) in the middle of a program: its ranks, under the torch
    launcher, are ended with the fabric; the manifest says complete: false."""
    import signal

    before = netns.list_ours()
    out = tmp_path / "run"
    # SIGINT as at a terminal: a suite started with `&` from a script inherits SIGINT ignored (POSIX: background
    # jobs of a non-interactive shell), the run would not see the Ctrl-C and the test would wait out `sleep 60`
    p = subprocess.Popen([sys.executable, "-m", "testbed.cli", "run", "program", "--quiet", "--out", str(out),
                          "--set", "cmd=sleep 60"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while not (out / "program" / "rank-3.stdout").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    assert subprocess.run(["pgrep", "-f", "^sleep 60$"], capture_output=True).returncode == 0  # the ranks run
    p.send_signal(getattr(signal, sig))
    _, err = p.communicate(timeout=60)
    assert p.returncode != 0, err
    assert json.loads((out / "manifest.json").read_text())["complete"] is False
    assert subprocess.run(["pgrep", "-f", "^sleep 60$"], capture_output=True).returncode == 1
    nothing_left(before)


def readme_program_commands() -> list[str]:
    """The README's program commands, as a reader copies them."""
    block = (ROOT / "README.md").read_text().split("Your own program, one process per rank", 1)[1].split("```")[1]
    return [x.strip() for x in block.splitlines() if x.strip().startswith("sudo testbed run program")]


def test_the_readme_program_commands_pass_with_a_python3_on_path_that_lacks_torch_and_mpi4py(tmp_path):
    """As in a root shell whose python3 is pyenv's or conda's: the first python3 on PATH here is Debian's without its
    site packages (no torch, no mpi4py). The README's commands pass as written: their python3 is testbed's own
    interpreter. Measured (host kernel, shared machine): DDP 20 steps ~25 s, MPI ~4 s."""
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "python3").write_text('#!/bin/sh\nexec /usr/bin/python3 -S "$@"\n')
    (shim / "python3").chmod(0o755)
    env = {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}"}
    for mod in ("torch", "mpi4py"):  # the precondition: PATH's python3 cannot run the examples
        r = subprocess.run(["python3", "-c", f"import {mod}"], env=env, capture_output=True, text=True)
        assert r.returncode != 0 and "ModuleNotFoundError" in r.stderr, (mod, r)
    lines = readme_program_commands()
    assert len(lines) == 2 and any("launcher=mpi" in x for x in lines), lines
    before = netns.list_ours()
    for i, line in enumerate(lines):
        argv = shlex.split(line)
        sets = [argv[k + 1] for k, a in enumerate(argv) if a == "--set"]
        r, took = cli(tmp_path, f"readme{i}", *sets, env=env)
        print(line, r.returncode, f"{took:.1f} s", r.stderr[-500:])
        assert r.returncode == 0, (line, r.stderr)
        man = json.loads((tmp_path / f"readme{i}" / "manifest.json").read_text())
        assert man["complete"] is True and man["program"]["python"] == sys.executable, man["program"]
        assert man["program"]["cmd_run"].startswith(f"{sys.executable} examples/programs/"), man["program"]
        summary = json.loads((tmp_path / f"readme{i}" / "summary.json").read_text())
        assert summary["steps_reported"] > 0, summary
    nothing_left(before)


def test_each_host_runs_under_its_own_hostname(tmp_path):
    """Every process of a program answers gethostname() with its host's name, under both launchers (mpirun and its
    daemons included: Open MPI keys its session directory /tmp/ompi.<hostname>.<uid> by it), and so do a Mininet
    host's shell and popen."""
    before = netns.list_ours()
    for launcher, rank in (("torch", "$RANK"), ("mpi", "$OMPI_COMM_WORLD_RANK")):
        r, _ = cli(tmp_path, launcher, f"launcher={launcher}", "timeout_s=60",
                   f'cmd=sh -c \'echo $(hostname) ${{OMPI_FILE_LOCATION:-none}} > "$TESTBED_RUN_DIR/name-{rank}"\'')
        assert r.returncode == 0, r.stderr
        said = [(tmp_path / launcher / f"name-{k}").read_text().split() for k in range(4)]
        assert [x[0] for x in said] == ["h1", "h2", "h3", "h4"], (launcher, said)
        if launcher == "mpi":  # each daemon's session directory is its own host's (Open MPI names it by hostname)
            assert all(x[1].startswith(f"/tmp/ompi.{x[0]}.") for x in said), said
    assert subprocess.run(["hostname"], capture_output=True, text=True).stdout.strip() not in ("h1", "h2")
    # Mininet's API on the same hosts: the shell and popen say the host's name; a switch keeps the machine's
    from testbed.lab import Lab
    from topologies.mininet_topo import LeafSpineTopo

    with Lab(LeafSpineTopo(spines=1, leaves=2, hosts_per_leaf=1), out=tmp_path / "mn", quiet=True) as lab:
        assert lab.net["h2"].cmd("hostname").strip() == "h2"
        assert lab.net["h1"].popen(["hostname"], text=True).communicate()[0].strip() == "h1"
        assert "1 received" in lab.net["h1"].cmd("ping -c1 -W2", lab.net["h2"].IP())
    nothing_left(before)


def test_a_launch_that_starts_no_rank_ends_naming_where_the_daemons_got_to(tmp_path):
    """Open MPI's own fault injection (orte_daemon_fail=2: the daemon of vpid 2, on h3, exits right after its
    init, before it calls back) leaves mpirun waiting for a daemon that is gone, as in the hang this bound was made
    for: the run ends at start_timeout_s with one line naming the hosts whose daemons came up, not at timeout_s."""
    before = netns.list_ours()
    sessions = set(Path("/tmp").glob("ompi.h*.*/pid.*"))
    env = {**os.environ, "OMPI_MCA_orte_daemon_fail": "2"}
    r, took = cli(tmp_path, "run", "launcher=mpi", f"cmd={MPI}", "start_timeout_s=8", "timeout_s=120", env=env)
    print(r.returncode, took, r.stderr)
    assert r.returncode == 1, r.stderr
    last = [x for x in r.stderr.splitlines() if x.strip()][-1]
    assert re.search(r"program: mpirun started no rank within 8 s: its daemons \(orted\) came up on h2, h4, "
                     r"not on h3; .*killed", last), last
    assert took < 60, took
    assert json.loads((tmp_path / "run" / "manifest.json").read_text())["complete"] is False
    assert set(Path("/tmp").glob("ompi.h*.*/pid.*")) == sessions  # the killed mpirun's session directory is gone
    nothing_left(before)


def test_ten_mpi_launches_in_a_row_all_start(tmp_path):
    """The documented check (benchmarks/mpi_launch_check.py), shortened: 10 consecutive 4-rank MPI launches, each
    on a fresh fabric, all start and finish. Under one shared hostname 1 launch in 30-43 hung (docs/programs.md);
    measured after: 40 of 40, ~2 s each (host kernel, shared machine): this took 18.7 s."""
    before = netns.list_ours()
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "mpi_launch_check.py"), "--launches", "10",
                        "--stop-after", "1", "--start-timeout-s", "20"], capture_output=True, text=True, timeout=600,
                       cwd=ROOT)
    print(r.stdout[-1500:], r.stderr[-1500:])
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "10 of 10 launches of 4 ranks started and finished" in r.stdout, r.stdout
    nothing_left(before)
