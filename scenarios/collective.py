#!/usr/bin/env python3
"""Collective: a training job's collectives with real data on a leaf-spine fabric, one agent process per rank.

    sudo testbed run collective [--set collective=allreduce] [--set size=1K,64K,1M] [--set transport=rdma]
        [--set stragglers=1 --set straggler_factor=3 --set compute_ms=50] [--set background=h1>h3] [--set pfc=on]
        [--set topology_file=fabric.toml]

Every iteration each rank computes (compute_ms; jitter, straggler ranks), then runs the iteration's collectives (a
size sweep, or gradient buckets) as per-rank DAGs with real buffers over kernel TCP or RDMA (RC verbs on SoftRoCE);
every result is checked. The fabric comes from the parameters or from a topology file (topology_file, per-port
overrides included: docs/topologies.md). Optional: background bulk flows, the collective in a lossless class that
PFC pauses hop by hop, random loss at one host's NIC, a packet capture. Prints an nccl-tests table; the summary is
analysis' over the files the run wrote (testbed.workloads.collective lists them). The job is ``lab.collective``'s
(testbed.workloads.settings), its fabric testbed.workloads.jobfabric's. Same as
`sudo .venv/bin/python scenarios/collective.py --set ...`.
"""

import sys

from testbed.errors import RunFailed, UsageError
from testbed.params import Param
from testbed.scenario import Scenario
from testbed.workloads.dcqcn import DCQCN_PARAMS, DcqcnSettings, check_fabric as check_dcqcn, dcqcn_needs
from testbed.workloads.jobfabric import FILE_REPLACES, PFC_PCP, collective_dscp, fabric_summary, leaf_spine
from testbed.workloads.serverlab import check as check_servers_run, servers_value
from testbed.workloads.settings import JOB_PARAMS, CollectiveSettings
from testbed.workloads.trimming import TRIM_PARAMS, check_run as check_trim, trim_needs, trim_wanted
from topologies.mininet_topo import SpecTopo

P, MBPS, B = Param, "Mbit/s", "bytes"
PARAMS = [*JOB_PARAMS,  # the job: collective, size, ranks, iterations, compute, stragglers, background, transport
    P("host_rate_mbps", float, 20.0, MBPS, "host link rate", min=0.1, max=100_000),
    P("fabric_rate_mbps", float, 20.0, MBPS, "leaf-spine link rate", min=0.1, max=100_000),
    P("delay_ms", float, 0.0, "ms", "one-way delay of every link", min=0, max=1000),
    P("mtu", int, 1500, B, "MTU of every link (AI fabrics often run jumbo frames, 4096-9000: fewer packets per byte, "
      "which also costs this machine less CPU per byte; docs/scale.md)", min=576, max=9000),
    P("scaleup_rate_mbps", float, 200.0, MBPS, "gpus_per_host > 1: the scale-up domain's rate (NVLink-class: the "
      "host's loopback, shaped; one rate for the server's whole intra-server traffic)", min=0.1, max=1_000_000),
    P("spines", int, 2, "", "spines", min=1, max=16),
    P("leaves", int, 2, "", "leaves", min=1, max=32),
    P("hosts_per_leaf", int, 2, "", "hosts per leaf", min=1, max=64),
    P("buffer_bytes", int, 256 * 1024, B, "buffer of every switch and NIC queue", min=3000, max=1 << 30),
    P("discipline", str, "droptail", "", "every switch port's queue: droptail, RED (min = k_bytes, max = min(3K, "
      "buffer)) or DCTCP step marking at K (host NICs stay drop-tail)", choices=("droptail", "red", "step")),
    P("k_bytes", int, 30_000, B, "marking threshold K (step; RED's min threshold)", min=1500, max=1 << 30),
    P("ecn", bool, False, "", "hosts negotiate ECN (cc=dctcp needs it; red marks instead of dropping with it)"),
    P("load_balancing", str, "ecmp", "", "leaves' uplinks: ecmp (per-flow hash), spray (per packet), flowlet "
      "(LetFlow: a random uplink per flowlet) or adaptive (CONGA-style: the least congested path per flowlet)",
      choices=("ecmp", "spray", "flowlet", "adaptive")),
    P("flowlet_gap_ms", float, 10.0, "ms", "flowlet and adaptive: the idle gap after which a flow may change uplink",
      min=0.01, max=10_000),
    P("dscp", int, 0, "", "DSCP of the collective's traffic (pfc=on with 0: 26, the lossless class)", min=0, max=63),
    P("pfc", str, "off", "", "off, or on: the collective's DSCP is a lossless class (802.1p priority 3) that PFC "
      "pauses hop by hop (testbed.pfc.controller, with 802.1Qbb frames on the wire); background flows stay lossy",
      choices=("off", "on")),
    P("pfc_xoff_bytes", int, 32_000, B, "PFC XOFF threshold of the lossless class (pfc=on)", min=1, max=1 << 30),
    P("pfc_xon_bytes", int, 16_000, B, "PFC XON threshold (pfc=on)", min=0, max=1 << 30),
    P("pfc_watchdog_ms", float, 0.0, "ms", "PFC watchdog (pfc=on): release a port paused longer than this, as switch "
      "watchdogs do against pause storms (0: off)", min=0, max=60_000),
    P("pfc_watchdog_restore_ms", float, 200.0, "ms", "after a watchdog release, ignore pauses this long", min=0,
      max=60_000),
    P("pfc_pause_hosts", bool, True, "", "pfc=on: pause the host NICs too (false: switch ports only; needed with "
      "dcqcn=on, whose pacing queue sits in the host NIC's lossless class)"),
    P("pfc_headroom_bytes", int, 0, B, "buffer above XOFF for what arrives during the controller's reaction (0: all "
      "of buffer_bytes above XOFF)", min=0, max=1 << 30),
    P("isolation", str, "none", "", "background flows (bg_dscp, not the collective's DSCP) in their own class on "
      "every port: strict (priority below the collective), weighted (4:1 for the collective), or none (one FIFO)",
      choices=("none", "strict", "weighted")),
    P("cc", str, "cubic", "", "congestion control (set per socket)", choices=("cubic", "reno", "dctcp", "bbr")),
    P("rto_min_ms", int, 0, "ms", "per-route TCP rto_min on the hosts (0: kernel default 200)", min=0, max=120_000),
    P("sample_interval_ms", float, 10.0, "ms", "queue sampling interval (0: no queues.csv)", min=0, max=1000),
    P("loss_percent", float, 0.0, "%", "random loss on packets arriving at loss_host's NIC (netem on an IFB at its "
      "ingress)", min=0, max=100),
    P("loss_host", str, "h1", "", "the host whose link gets loss_percent"),
    P("capture", str, "", "", "packet capture at one port, NODE:IFNAME (e.g. h1:eth0; empty: none): tcpdump -s 128 "
      "into capture-NODE-IFNAME.pcap, decoded into the wire_* summary numbers"),
    P("servers", str, "1", "", "split the fabric over this many servers (1-16: namespaces on this machine joined by "
      "VXLAN tunnels; a leaf with its hosts per server, spines spread: testbed.network.cluster, docs/scale.md), or "
      "over the machines a servers file names (its path: one agent per server over ssh, TCP only, each "
      "server sampling its own queues; docs/servers.md)"),
    P("max_clock_uncertainty_ms", float, 0.0, "ms", "servers=FILE: the largest clock bound accepted (0: 5% of the "
      "job's smallest op's alpha-beta bound; testbed.workloads.serverlab)", min=0, max=10_000),
    P("topology_file", str, "", "", "a leaf-spine topology file (.toml/.yaml, docs/topologies.md; per-port "
      "overrides included) built instead of the fabric the parameters describe: it replaces "
      f"{', '.join(FILE_REPLACES)} (those must stay unset; its [tcp] congestion_control is the agents' cc; with "
      "pfc=on it must have a lossless class with the collective's DSCP). Empty: built from the parameters"),
    *DCQCN_PARAMS,  # dcqcn=on and its knobs (testbed.workloads.dcqcn)
    *TRIM_PARAMS,  # trim=auto|on|off and its threshold (testbed.workloads.trimming)
]


def fabric(p: dict, seed: int):
    """The leaf-spine of these parameters, or of topology_file (testbed.workloads.jobfabric)."""
    return leaf_spine(p, seed, PARAMS)


def job_settings(p: dict) -> CollectiveSettings:
    """The job of these parameters, as lab.collective takes it: the collective's DSCP (pfc=on: its lossless class),
    the sampler's interval, the scale-up domain's rate and buffer."""
    return CollectiveSettings.from_params(p, dscp=collective_dscp(p), sample_interval_ms=p["sample_interval_ms"],
                                          scaleup_rate_mbps=p["scaleup_rate_mbps"],
                                          scaleup_buffer_bytes=p["buffer_bytes"])


def validate(p: dict) -> None:
    from testbed.measure.capture import parse_spec

    servers = servers_value(p["servers"])
    if isinstance(servers, int) and not 1 <= servers <= 16:
        raise UsageError(f"servers: 1 to 16, or a servers file (got {servers})")
    if not isinstance(servers, int):  # what a run over servers that are machines cannot do yet: one line
        check_servers_run(p)
    spec = fabric(p, p["seed"] or 1)
    job_settings(p).check(spec, p["seed"] or 1)
    if p["loss_percent"] > 0 and p["loss_host"] not in [h.name for h in spec.hosts]:
        raise UsageError(f"loss_host: unknown host {p['loss_host']!r}")
    parse_spec(p["capture"], spec.addresses)
    check_dcqcn(p, spec)  # at the host NICs' rate, per-port overrides included, and their queues
    check_trim(p, spec)  # trim=on with UET on lossy ECMP ports, a threshold within every switch port's buffer


def needs_for(p: dict) -> tuple:
    """transport=rdma adds rxe:netns and pyverbs (SoftRoCE across namespaces, the RDMA agents); loss_percent > 0
    adds qdisc:netem, cls:u32 and act:mirred (netem on an IFB fed from the lossy port's ingress); pfc=on adds
    qdisc:plug (the pause) and the classifier of the DSCP classes; dcqcn=on adds qdisc:fq and qdisc:clsact (the
    pacing and the programs' hook); trimming adds qdisc:clsact."""
    return ((("qdisc:plug", "cls:u32") if p.get("pfc") == "on" else ())
            + (("rxe:netns", "pyverbs") if p.get("transport") == "rdma" else ())
            + (("qdisc:netem", "cls:u32", "act:mirred") if (p.get("loss_percent") or 0) > 0 else ())
            + dcqcn_needs(p) + trim_needs(p))


def experiment(p: dict, lab) -> dict:
    from testbed.measure.capture import start_capture, wire_summary
    from testbed.pfc.run import start_pfc

    spec = lab.net.spec  # the parameters' fabric or topology_file's: its [tcp] congestion control is the agents'
    job = lab.collective(job_settings(p), run=False)  # planned; its agents' fork server starts now
    if p["loss_percent"] > 0:
        nic = lab.net[p["loss_host"]].defaultIntf().name
        lab.net.fabric.add_loss(p["loss_host"], nic, p["loss_percent"])
        lab.progress(f"{p['loss_percent']:g}% random loss on packets arriving at {p['loss_host']}:{nic}")
    cap = start_capture(p["capture"], lab.net.fabric, lab.rundir.path, lab.on_teardown, lab.progress)
    pfc = None
    if p["pfc"] == "on":  # the controller forks now, before the agents and the sampler add threads
        pfc = start_pfc(lab.net.fabric, lab.rundir, lab.on_teardown, interval_ms=1, frames=True,
                        watchdog_ms=p["pfc_watchdog_ms"], watchdog_restore_ms=p["pfc_watchdog_restore_ms"],
                        write_queues=not p["sample_interval_ms"],  # the sampler's queues.csv covers every port
                        pause_hosts=p["pfc_pause_hosts"])
        lab.progress(f"PFC on DSCP {collective_dscp(p)} (802.1p {PFC_PCP}): XOFF {p['pfc_xoff_bytes']} B, "
                     f"XON {p['pfc_xon_bytes']} B, {len(pfc.queues)} lossless queues")
    dcqcn = (lab.dcqcn(DcqcnSettings.from_params(p), react=p["dcqcn"] == "on") if p["dcqcn"] != "off"
             else None)  # a thread: after PFC's fork
    trimming = lab.trim(p["trim_threshold_bytes"]) if trim_wanted(p) else None
    job.run()
    dcqcn_numbers = dcqcn.finish() if dcqcn else {}
    cap_stats = cap.stop() if cap else {}
    summary = {**job.summary(), "loss_percent": p["loss_percent"], **fabric_summary(p, spec)}
    if pfc:
        summary.update(pfc="on", **pfc.finish())
    if cap:
        summary.update(wire_summary(cap, cap_stats, lab.progress, "collective"))
    summary.update(dcqcn_numbers)
    summary.update(trimming.finish() if trimming else {"uet_trim": "off"} if p["transport"] == "uet" else {})
    if not summary["data_verified"]:
        lab.rundir.finish(summary)  # keep the evidence, then fail the run (exit status 1; teardown still runs)
        raise RunFailed(f"collective: data verification failed: {summary['mismatches']}")
    return summary


SCENARIO = Scenario(
    name="collective",
    summary="collectives (all-reduce, all-gather, all-to-all, ...) with real data over kernel TCP, one agent per "
            "host, on a leaf-spine fabric: CCT tails, step times, algbw/busbw",
    params=PARAMS,
    needs=("qdisc:htb", "qdisc:bfifo"),
    needs_for=needs_for,
    topology=lambda p, seed: SpecTopo(fabric(p, p["seed"] or seed)),
    run=experiment,
    validate=validate,
    agents=True,
    rxe_for=lambda p: p["transport"] == "rdma",
    table=(("collective", "collective"), ("ranks", "ranks"), ("message_bytes", "message (bytes)"),
           ("iterations", "iterations"), ("cct_ms_p50", "CCT p50 (ms)"), ("cct_ms_p99", "CCT p99 (ms)"),
           ("cct_ms_max", "CCT max (ms)"), ("bound_ms", "alpha-beta bound (ms)"), ("cct_vs_bound", "mean CCT / bound"),
           ("transfer_vs_bound", "mean transfer / bound (late arrival left out)"),
           ("step_ms_p50", "step p50 (ms)"), ("step_ms_p99", "step p99 (ms)"), ("step_cv", "step CV"),
           ("comm_wait_fraction", "comm wait fraction"), ("algbw_gbps", "algbw (Gbit/s)"), ("busbw_gbps",
           "busbw (Gbit/s)"), ("switch_drops", "switch queue drops"), ("ecn_marks", "ECN marks"),
           ("tcp_retrans_segs", "TCP retransmitted segments"), ("bg_goodput_mbps", "background goodput (Mbit/s)"),
           ("clock_uncertainty_us_max", "clock bound, ranks on servers (us)"),
           ("data_verified", "data verified"), ("fidelity_ok", "fidelity ok")),
)

if __name__ == "__main__":
    from testbed.cli import main

    sys.exit(main(["run", SCENARIO.name, *sys.argv[1:]]))
