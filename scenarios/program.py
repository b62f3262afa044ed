#!/usr/bin/env python3
"""Program: your own distributed program (PyTorch over gloo, an MPI program, anything) on a leaf-spine fabric.

    sudo testbed run program --set cmd='python3 examples/programs/ddp_train.py --steps 20' [--set ranks=4]
    sudo testbed run program --set launcher=mpi --set cmd='python3 examples/programs/mpi_allreduce.py'
        [--set buffer_bytes=30000 --set background=h1>h3,h2>h4]

One process per rank in its host's namespace, started as torchrun starts it (launcher=torch: RANK, WORLD_SIZE,
MASTER_ADDR, GLOO_SOCKET_IFNAME, ...) or by a real Open MPI mpirun (launcher=mpi). A program that reports its steps
and ops through the event protocol (traffic.progevents; docs/programs.md) gets the collective analysis unchanged:
step-time tails, comm wait, the slowest steps joined with queue and drop activity. Without events the run still has
the fabric's telemetry and the program's wall time. A rank that fails, or a program past timeout_s, ends the run
(exit status 1, the rank named, complete: false) with nothing left behind. Same as
`sudo .venv/bin/python scenarios/program.py --set ...`.

Which Python the ranks get: a command that starts with `python`/`python3` (or is a `.py` file) runs under the
interpreter testbed itself runs on (its virtualenv, which sees Debian's python3-torch and python3-mpi4py), as
torchrun starts its ranks, whatever `python3` PATH finds first (pyenv, conda, a virtualenv). Name an interpreter by
its path (`cmd='/opt/conda/bin/python train.py'`) to use another one.
"""

import sys

from testbed.errors import UsageError
from testbed.params import Param
from testbed.scenario import PROJECT_ROOT, Scenario
from topologies import HostTcpSpec, LeafSpineSpec, QueueSpec, SpecError, uniform_leaf_spine
from topologies.mininet_topo import SpecTopo

P, MBPS, B = Param, "Mbit/s", "bytes"
#: the default program: the data-parallel example (under testbed's own interpreter, which sees python3-torch)
DEFAULT_CMD = f"python3 {PROJECT_ROOT}/examples/programs/ddp_train.py --steps 10"
PARAMS = [
    P("cmd", str, DEFAULT_CMD, "", "the program, a shell command line run in every rank's host from this directory "
      "(e.g. 'python3 train.py'; default: the DDP example). A leading python/python3 or a .py file runs under "
      f"testbed's own interpreter ({sys.executable}), as torchrun starts ranks; name another by its path"),
    P("launcher", str, "torch", "", "torch: the environment torchrun gives, one process per rank; mpi: Open MPI's "
      "mpirun with a hostfile of the fabric's hosts", choices=("torch", "mpi")),
    P("ranks", int, 4, "", "ranks", min=1, max=1024),
    P("ranks_per_host", int, 1, "", "ranks per host (packed: ranks 0..k-1 on the first host)", min=1, max=64),
    P("timeout_s", float, 300.0, "s", "the program must end within this (else its ranks are killed, the run fails)",
      min=1, max=86_400),
    P("start_timeout_s", float, 60.0, "s", "launcher=mpi: mpirun must start a rank within this (else the run fails "
      "naming the hosts whose daemons came up)", min=1, max=86_400),
    P("warmup_steps", int, 1, "", "each rank's first steps left out of ops.csv (connection set-up, first buckets)",
      min=0, max=1000),
    P("master_port", int, 29500, "", "MASTER_PORT (rank 0's rendezvous port)", min=1024, max=65535),
    P("background", str, "", "", "background bulk TCP flows SRC>DST host pairs for the whole program, e.g. h1>h3"),
    P("bg_rate_mbps", float, 0.0, MBPS, "pace each background flow (0: unpaced bulk)", min=0, max=100_000),
    P("host_rate_mbps", float, 20.0, MBPS, "host link rate", min=0.1, max=100_000),
    P("fabric_rate_mbps", float, 20.0, MBPS, "leaf-spine link rate", min=0.1, max=100_000),
    P("delay_ms", float, 0.0, "ms", "one-way delay of every link", min=0, max=1000),
    P("spines", int, 2, "", "spines", min=1, max=16),
    P("leaves", int, 2, "", "leaves", min=1, max=32),
    P("hosts_per_leaf", int, 2, "", "hosts per leaf", min=1, max=64),
    P("buffer_bytes", int, 256 * 1024, B, "buffer of every switch port's queue", min=3000, max=1 << 30),
    P("nic_buffer_bytes", int, 1_500_000, B, "buffer of every host NIC's queue (default: a Linux interface's 1000 "
      "packets; a host's TCP fills its own NIC queue far beyond a switch buffer)", min=3000, max=1 << 30),
    P("discipline", str, "droptail", "", "every switch port's queue: droptail, RED or DCTCP step marking",
      choices=("droptail", "red", "step")),
    P("k_bytes", int, 30_000, B, "marking threshold K (step; RED's min threshold)", min=1500, max=1 << 30),
    P("ecn", bool, False, "", "hosts negotiate ECN"),
    P("cc", str, "cubic", "", "the hosts' default congestion control (the program's sockets use it)",
      choices=("cubic", "reno", "dctcp", "bbr")),
    P("load_balancing", str, "ecmp", "", "leaves' uplinks: ecmp, spray, flowlet or adaptive",
      choices=("ecmp", "spray", "flowlet", "adaptive")),
    P("sample_interval_ms", float, 10.0, "ms", "queue sampling interval (0: no queues.csv)", min=0, max=1000),
]


def leaf_spine(p: dict, seed: int) -> LeafSpineSpec:
    from testbed.workloads.bottleneck import bottleneck_queue, check_marking

    if p["cc"] == "dctcp" and not p["ecn"]:
        raise UsageError("cc=dctcp needs ecn=true")
    check_marking(p)
    try:
        q = bottleneck_queue(p)
        return uniform_leaf_spine(p["spines"], p["leaves"], p["hosts_per_leaf"], p["host_rate_mbps"],
                                  p["fabric_rate_mbps"], delay_ms=p["delay_ms"],
                                  host_queue=QueueSpec("droptail", buffer_bytes=p["nic_buffer_bytes"]),
                                  switch_queue=q, seed=seed % 256, load_balancing=p["load_balancing"],
                                  tcp=HostTcpSpec(congestion_control=p["cc"], ecn=p["ecn"]))
    except SpecError as e:
        raise UsageError(str(e)) from None


def background(p: dict, hosts: list[str]) -> list[tuple[str, str]]:
    from traffic.job import JobError, parse_flows

    try:
        flows = parse_flows(p["background"])
    except JobError as e:
        raise UsageError(str(e)) from None
    for f in flows:
        for h in (f.src, f.dst):
            if h not in hosts:
                raise UsageError(f"background: unknown host {h!r} (hosts: {', '.join(hosts)})")
    return [(f.src, f.dst) for f in flows]


def validate(p: dict) -> None:
    from testbed.workloads.program import placement

    if not p["cmd"].strip():
        raise UsageError("cmd: set the program to run, e.g. --set cmd='python3 examples/programs/ddp_train.py'")
    spec = leaf_spine(p, 1)
    hosts = [h.name for h in spec.hosts]
    placement(hosts, p["ranks"], p["ranks_per_host"])
    background(p, hosts)


def experiment(p: dict, lab) -> dict:
    from analysis import fidelity
    from analysis import summary as asum

    hosts = [h.name for h in lab.net.spec.hosts]
    sampler = lab.sample_queues(every_ms=p["sample_interval_ms"]) if p["sample_interval_ms"] else None
    tcp, ports = lab.tcp_counters(), lab.port_deltas()
    bg = lab.flows(background(p, hosts), cc=p["cc"], rate_mbps=p["bg_rate_mbps"]) if p["background"].strip() else None
    prog = lab.launch(p["cmd"], hosts=hosts, ranks=p["ranks"], ranks_per_host=p["ranks_per_host"],
                      launcher=p["launcher"], timeout_s=p["timeout_s"], warmup_steps=p["warmup_steps"],
                      master_port=p["master_port"], start_timeout_s=p["start_timeout_s"])
    res = prog.wait()  # RunFailed (the rank named) when a rank fails or the timeout passes
    bg_stats = bg.stop() if bg else []
    delta = ports.stop()
    tcp.stop(lab.rundir)
    q = {}
    if sampler is not None:
        sampler.stop(lab.rundir)
        q = sampler.stats()
    run = asum.load_quietly(lab.rundir.path)
    spec = lab.net.spec

    def total(key: str, switch: bool) -> int:
        return sum(v[key] for (n, _), v in delta.items() if (spec.node(n).role != "host") == switch)

    reasons = fidelity.reasons(fidelity.cpu_busy(q.get("cpu_busy_fraction")))
    out = {"launcher": p["launcher"], "ranks": p["ranks"], "ranks_per_host": p["ranks_per_host"],
           "program_s": res.wall_s, "hosts": ",".join(prog.hosts), "events": bool(res.ops_rows),
           "events_malformed": res.events_malformed, "steps_reported": len({o["iteration"] for o in res.ops_rows}),
           **asum.collective_metrics(run.ops), **asum.tcp_metrics(run.tcp),
           "switch_drops": total("drops", True), "host_nic_drops": total("drops", False),
           "ecn_marks": total("marks", True), "background_flows": len(bg_stats),
           "bg_goodput_mbps": sum(b["goodput_mbps"] for b in bg_stats), "discipline": p["discipline"],
           "buffer_bytes": p["buffer_bytes"], "cpu_busy_fraction": q.get("cpu_busy_fraction"),
           "fidelity_ok": not reasons, "fidelity_reasons": "; ".join(reasons)}
    return out


SCENARIO = Scenario(
    name="program",
    summary="your own distributed program (PyTorch/gloo, MPI, ...) one process per rank on a leaf-spine fabric; "
            "its steps and ops from the event protocol",
    params=PARAMS,
    needs=("qdisc:htb", "qdisc:bfifo"),
    topology=lambda p, seed: SpecTopo(leaf_spine(p, seed)),
    run=experiment,
    validate=validate,
    table=(("launcher", "launcher"), ("ranks", "ranks"), ("program_s", "program wall time (s)"),
           ("steps_reported", "steps reported"), ("step_ms_p50", "step p50 (ms)"), ("step_ms_p99", "step p99 (ms)"),
           ("step_cv", "step CV"), ("cct_ms_p50", "op p50 (ms)"), ("cct_ms_p99", "op p99 (ms)"),
           ("comm_wait_fraction", "comm wait fraction"), ("switch_drops", "switch queue drops"),
           ("tcp_retrans_segs", "TCP retransmitted segments"), ("bg_goodput_mbps", "background goodput (Mbit/s)"),
           ("fidelity_ok", "fidelity ok")),
)

if __name__ == "__main__":
    from testbed.cli import main

    sys.exit(main(["run", SCENARIO.name, *sys.argv[1:]]))
