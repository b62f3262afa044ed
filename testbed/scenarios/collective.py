"""Collective: replay a training job's collectives with real data over kernel TCP on a leaf-spine fabric.

One agent process per rank (traffic.agent) runs inside its host's namespace; the controller (traffic.controller)
talks to the agents over a Unix socket in the run directory. Every iteration: compute phase (optional jitter and
straggler ranks), then the collectives (a size sweep, or gradient buckets), walked as per-rank DAGs
(traffic.collectives.make_schedule or a schedule JSON file) with real numpy buffers; every rank's result is checked
against expected_outputs. Optional background bulk flows between chosen hosts (checkpoint traffic).

Writes ops.csv, tcp_info.csv (per connection TCP_INFO at op boundaries), sweep.csv (one nccl-tests row per
size), tcp.csv, queues.csv, cpu.csv and summary.json; prints an nccl-tests-style table. With ``capture`` set, a
pcap of one port (testbed.capture) whose decoding (analysis.capture) adds the ``wire_*`` numbers to summary.json.
"""

from __future__ import annotations

import math
import os
import sys

from testbed.errors import RunFailed, UsageError
from testbed.params import Param
from testbed.scenario import RunContext, Scenario

PARAMS = [
    Param("collective", str, "allreduce", "", "allreduce|allgather|reducescatter|alltoall|broadcast|reduce|gather|"
          "pipeline (aliases all_reduce, incast, ...)"),
    Param("algorithm", str, "", "", "schedule algorithm (empty: the collective's default, e.g. ring)"),
    Param("size", str, "1M", "bytes", "per-rank message size, or a comma list (1K,64K,1M) for a sweep in one run"),
    Param("buckets", str, "", "bytes", "gradient buckets: comma list of sizes, one collective each per iteration "
          "(replaces size)"),
    Param("ranks", int, 4, "", "ranks (one per host)", min=2, max=1024),
    Param("iterations", int, 5, "", "measured iterations (per size of a sweep)", min=1, max=100_000),
    Param("warmup", int, 1, "", "unreported warm-up iterations before the measured ones", min=0, max=1000),
    Param("chunks", int, 1, "", "pieces per transfer (pipelining)", min=1, max=4096),
    Param("dtype", str, "float32", "", "element type", choices=("float32", "float16", "float64", "int32", "int64")),
    Param("placement", str, "packed", "", "rank -> host placement", choices=("packed", "spread", "random")),
    Param("schedule_file", str, "", "", "a testbed-schedule JSON file to run instead of a generated schedule"),
    Param("host_rate_mbps", float, 20.0, "Mbit/s", "host link rate", min=0.1, max=100_000),
    Param("fabric_rate_mbps", float, 20.0, "Mbit/s", "leaf-spine link rate", min=0.1, max=100_000),
    Param("delay_ms", float, 0.0, "ms", "one-way delay of every link", min=0, max=1000),
    Param("spines", int, 2, "", "spines", min=1, max=16),
    Param("leaves", int, 2, "", "leaves", min=1, max=32),
    Param("hosts_per_leaf", int, 2, "", "hosts per leaf", min=1, max=64),
    Param("buffer_bytes", int, 256 * 1024, "bytes", "droptail buffer of every switch and NIC queue", min=3000,
          max=1 << 30),
    Param("compute_ms", float, 0.0, "ms", "compute phase per iteration", min=0, max=600_000),
    Param("jitter", float, 0.0, "", "compute time uniform in [1-jitter, 1+jitter] x compute_ms", min=0, max=0.99),
    Param("stragglers", str, "", "", "straggler ranks, comma list (e.g. 1,3)"),
    Param("straggler_factor", float, 1.0, "", "a straggler's compute time multiplier", min=1, max=1000),
    Param("straggler_prob", float, 1.0, "", "probability a straggler straggles in an iteration", min=0, max=1),
    Param("background", str, "", "", "background bulk flows SRC>DST host pairs, e.g. h1>h3,h2>h4"),
    Param("bg_dscp", int, 0, "", "DSCP of background flows", min=0, max=63),
    Param("bg_rate_mbps", float, 0.0, "Mbit/s", "pace each background flow (0: unpaced bulk)", min=0, max=100_000),
    Param("dscp", int, 0, "", "DSCP of the collective's traffic (pfc=on with 0: 26, the lossless class)", min=0,
          max=63),
    Param("pfc", str, "off", "", "off, or on: the collective's DSCP is a lossless class (802.1p priority 3) that "
          "PFC pauses hop by hop (testbed.pfc, with 802.1Qbb frames on the wire); background flows stay lossy",
          choices=("off", "on")),
    Param("pfc_xoff_bytes", int, 32_000, "bytes", "PFC XOFF threshold of the lossless class (pfc=on)", min=1,
          max=1 << 30),
    Param("pfc_xon_bytes", int, 16_000, "bytes", "PFC XON threshold (pfc=on)", min=0, max=1 << 30),
    Param("pfc_headroom_bytes", int, 0, "bytes", "buffer above XOFF for what arrives during the controller's "
          "reaction (0: all of buffer_bytes above XOFF)", min=0, max=1 << 30),
    Param("cc", str, "cubic", "", "congestion control (set per socket)", choices=("cubic", "reno", "dctcp", "bbr")),
    Param("rto_min_ms", int, 0, "ms", "per-route TCP rto_min on the hosts (0: kernel default 200)", min=0,
          max=120_000),
    Param("seed", int, 0, "", "inputs, placement, jitter and stragglers (0: the run's --seed)", min=0,
          max=2**31 - 1),
    Param("sample_interval_ms", float, 10.0, "ms", "queue sampling interval (0: no queues.csv)", min=0, max=1000),
    Param("verify", bool, True, "", "check every rank's result against expected_outputs"),
    Param("timeout_s", float, 600.0, "s", "agent start-up, and then the whole job, must each finish within this", min=1,
          max=86_400),
    Param("transport", str, "tcp", "", "data plane of the agents: kernel TCP, or RDMA (RC verbs over an rxe "
          "SoftRoCE device per host; needs rxe:netns)", choices=("tcp", "rdma")),
    Param("rdma_mtu", int, 0, "bytes", "RDMA path MTU (256|512|1024|2048|4096; 0: the rxe port's active MTU, "
          "set by the link MTU)", min=0, max=4096),
    Param("rdma_timeout", int, 16, "", "RC local ACK timeout exponent: 4.096 us x 2^value", min=1, max=31),
    Param("rdma_retry_cnt", int, 7, "", "RC transport retries before the QP fails", min=0, max=7),
    Param("rdma_rnr_retry", int, 7, "", "RC receiver-not-ready retries (7: forever)", min=0, max=7),
    Param("rdma_min_rnr_timer", int, 12, "", "RC minimum RNR NAK timer, IB encoding (12: 0.64 ms; rdma_cm's "
          "default 0 means 655 ms)", min=0, max=31),
    Param("loss_percent", float, 0.0, "%", "random loss on packets arriving at loss_host's NIC (netem on an IFB at "
          "its ingress)", min=0, max=100),
    Param("loss_host", str, "h1", "", "the host whose link gets loss_percent"),
    Param("capture", str, "", "", "packet capture at one port, NODE:IFNAME (e.g. h1:eth0; empty: none): tcpdump "
          "-s 128 into capture-NODE-IFNAME.pcap, decoded into the wire_* summary numbers"),
]

OPS_COLUMNS = ["iteration", "op", "op_index", "collective", "rank", "host", "start_s", "end_s", "bytes_sent",
               "bytes_recv", "wait_s"]
#: ops.csv's optional columns (docs/rundir.md): when the rank began the iteration, the op's nccl-tests size
OPS_EXTRA = ["iter_start_s", "size_bytes"]


# ---- plan (pure; also what validate() runs) ---------------------------------------------------------------------


#: 802.1p priority and default DSCP of the collective's lossless class with pfc=on (26: AF31, common for RoCEv2)
PFC_PCP = 3
PFC_DSCP = 26


def collective_dscp(p: dict) -> int:
    """The DSCP the agents put on the collective's packets: ``dscp``, or with pfc=on and dscp 0 the lossless
    class's default (DSCP 0 is the lossy default class)."""
    return p["dscp"] or (PFC_DSCP if p.get("pfc") == "on" else 0)


def build_spec(p: dict, seed: int = 0):
    """The leaf-spine; with pfc=on two classes of equal weight on every port (weighted round robin, as ETS shares
    a port): ``bulk`` (lossy, default: background flows, anything unmarked) and ``collective`` (the collective's
    DSCP, lossless)."""
    from topologies import ClassSpec, HostTcpSpec, LeafSpineSpec, LinkSpec, QueueSpec, SpecError

    try:
        q = QueueSpec("droptail", buffer_bytes=p["buffer_bytes"])
        tcp = HostTcpSpec(congestion_control=p["cc"], rto_min_ms=p["rto_min_ms"] or None)
        classes = None
        if p.get("pfc") == "on":
            d = collective_dscp(p)
            if d == p["bg_dscp"] and p["background"].strip():
                raise UsageError(f"pfc=on: the background flows' bg_dscp ({p['bg_dscp']}) must differ from the "
                                 f"collective's lossless DSCP ({d})")
            head = p["pfc_headroom_bytes"] or max(0, p["buffer_bytes"] - p["pfc_xoff_bytes"])
            classes = (ClassSpec("bulk", dscp=[0], weight=1, default=True),
                       ClassSpec("collective", dscp=[d], weight=1, lossless=True, pcp=PFC_PCP,
                                 xoff_bytes=p["pfc_xoff_bytes"],
                                 xon_bytes=p["pfc_xon_bytes"], headroom_bytes=head))
        return LeafSpineSpec(spines=p["spines"], leaves=p["leaves"], hosts_per_leaf=p["hosts_per_leaf"],
                             host_link=LinkSpec(p["host_rate_mbps"], delay_ms=p["delay_ms"]),
                             fabric_link=LinkSpec(p["fabric_rate_mbps"], delay_ms=p["delay_ms"]),
                             host_queue=q, leaf_down_queue=q, leaf_up_queue=q, spine_queue=q, tcp=tcp,
                             seed=seed % 256, **({"classes": classes} if classes else {}))
    except SpecError as e:
        raise UsageError(str(e)) from None


def plan(p: dict, run_seed: int = 1) -> dict:
    """Everything decided before the fabric exists: topology, schedules, job, placement. UsageError on bad input."""
    from traffic import job as jobm
    from traffic import schedule_json
    from traffic.collectives import canonical_collective, make_schedule
    from traffic.placement import PlacementError, place
    from traffic.schedule import ScheduleError

    seed = p["seed"] or run_seed
    topo = build_spec(p, seed)
    hosts = [h.name for h in topo.hosts]
    try:
        schedules = {}
        if p["schedule_file"]:
            try:
                s = schedule_json.load(p["schedule_file"])
            except OSError as e:
                raise UsageError(f"schedule_file: {e.strerror}: {p['schedule_file']}") from None
            except ScheduleError as e:
                raise UsageError(f"schedule_file: {e}") from None
            if s.ranks > len(hosts):
                raise UsageError(f"schedule_file: {s.ranks} ranks but the fabric has only {len(hosts)} hosts")
            schedules["file"] = s
            ops = [(s.collective if s.collective != "custom" else "custom", "file")]
            segments = [jobm.Segment(tuple(ops), p["iterations"])]
            sizes = {ops[0][0]: s.message_bytes}
            ranks = s.ranks
        else:
            coll = canonical_collective(p["collective"])
            ranks = p["ranks"]
            if ranks > len(hosts):
                raise UsageError(f"ranks: {ranks} ranks but the fabric has only {len(hosts)} hosts "
                                 f"({p['leaves']} leaves x {p['hosts_per_leaf']} hosts)")
            opts = {"dtype": p["dtype"]}
            if p["algorithm"]:
                opts["algorithm"] = p["algorithm"]
            bucket_sizes = jobm.parse_sizes(p["buckets"]) if p["buckets"].strip() else []
            sweep = jobm.parse_sizes(p["size"])
            sizes = {}

            def sched(m: int) -> str:
                key = f"{coll}-{m}"
                if key not in schedules:
                    schedules[key] = make_schedule(coll, ranks, m, chunks=p["chunks"], seed=seed, **opts)
                return key

            if bucket_sizes:
                ops = []
                for i, m in enumerate(bucket_sizes):
                    ops.append((f"bucket{i}", sched(m)))
                    sizes[f"bucket{i}"] = m
                segments = [jobm.Segment(tuple(ops), p["iterations"])]
            else:
                segments = []
                for m in sweep:
                    name = coll if len(sweep) == 1 else f"{coll}-{m}"
                    segments.append(jobm.Segment(((name, sched(m)),), p["iterations"]))
                    sizes[name] = m
        stragglers = tuple(jobm.parse_int_list(p["stragglers"], "stragglers"))
        flows = tuple(jobm.parse_flows(p["background"], p["bg_dscp"], p["bg_rate_mbps"]))
        for f in flows:
            for h in (f.src, f.dst):
                if h not in hosts:
                    raise UsageError(f"background: unknown host {h!r} (hosts: {', '.join(hosts)})")
        job = jobm.JobSpec(ranks=ranks, segments=tuple(segments), compute_ms=p["compute_ms"], jitter=p["jitter"],
                           stragglers=stragglers, straggler_factor=p["straggler_factor"],
                           straggler_prob=p["straggler_prob"], warmup=p["warmup"], seed=seed, background=flows)
        placement = place(ranks, [(h, topo.leaf_of(h)) for h in hosts], p["placement"], seed)
    except (ScheduleError, PlacementError, jobm.JobError) as e:
        raise UsageError(str(e)) from None
    return {"topology": topo, "schedules": schedules, "job": job, "placement": placement, "sizes": sizes,
            "seed": seed, "ranks": ranks}


def _validate(p: dict) -> None:
    from testbed import capture

    pl = plan(p)
    _check_rdma(p, pl["topology"])
    if p["loss_percent"] > 0 and p["loss_host"] not in [h.name for h in pl["topology"].hosts]:
        raise UsageError(f"loss_host: unknown host {p['loss_host']!r}")
    capture.parse_spec(p["capture"], pl["topology"].addresses)


def _needs(p: dict) -> tuple[str, ...]:
    """transport=rdma adds rxe:netns and pyverbs (SoftRoCE across namespaces, the RDMA agents); loss_percent > 0
    adds qdisc:netem, cls:u32 and act:mirred (netem on an IFB fed from the lossy port's ingress); pfc=on adds
    qdisc:plug (the pause) and the classifier of the DSCP classes."""
    extra: tuple[str, ...] = ()
    if p.get("pfc") == "on":
        extra += ("qdisc:plug", "cls:u32")
    if p.get("transport") == "rdma":
        extra += ("rxe:netns", "pyverbs")
    if (p.get("loss_percent") or 0) > 0:
        extra += ("qdisc:netem", "cls:u32", "act:mirred")
    return extra


def _check_rdma(p: dict, topo) -> None:
    """rdma_mtu must be an IB MTU the rxe port on the host link can take (rxe: link MTU - 80 header bytes)."""
    from traffic.rdma import IB_MTU_ENUM, rxe_mtu_for_netdev

    m = p["rdma_mtu"]
    if m and m not in IB_MTU_ENUM:
        raise UsageError(f"rdma_mtu: must be 0 or one of {', '.join(map(str, sorted(IB_MTU_ENUM)))} (got {m})")
    link_mtu = topo.host_link.mtu
    if p["transport"] == "rdma" and m and m > rxe_mtu_for_netdev(link_mtu):
        raise UsageError(f"rdma_mtu: {m} does not fit the host links' MTU {link_mtu} (rxe's largest MTU there is "
                         f"{rxe_mtu_for_netdev(link_mtu)})")


def payload_efficiency(transport: str, link_mtu: int, rdma_mtu: int = 0) -> float:
    """Payload bytes per byte the link's shaper carries, for full-size packets: what the alpha-beta bound's beta
    (seconds per payload byte) must use. HTB counts the Ethernet frame without preamble/FCS.
    TCP: MSS = MTU - 20 (IP) - 20 (TCP) - 12 (timestamps option), frame = MTU + 14 -> 1448/1514 = 0.956 at 1500.
    RoCEv2: payload = the path MTU, frame = payload + 14 (Eth) + 20 (IP) + 8 (UDP) + 12 (BTH) + 4 (ICRC)
    -> 1024/1082 = 0.946 (rxe's MTU on a 1500-byte link is 1024)."""
    if transport == "rdma":
        from traffic.rdma import rxe_mtu_for_netdev

        pm = rdma_mtu or rxe_mtu_for_netdev(link_mtu)
        return pm / (pm + 58)
    return (link_mtu - 52) / (link_mtu + 14)


# ---- run ---------------------------------------------------------------------------------------------------------


def _run(p: dict, ctx: RunContext) -> dict:
    from testbed import capture as capm
    from testbed.fabric import Fabric
    from testbed.kernel import counters, netns
    from testbed.kernel.counters import rdma_counters
    from testbed.telemetry import QueueSampler, port_totals
    from traffic import job as jobm
    from traffic.background import BackgroundFlows
    from traffic.controller import ControlError, Controller, Member
    from traffic.forkserver import ForkServer
    from analysis import metrics as am
    from traffic.rdma import RECOVERY_COUNTERS
    from traffic.schedule import ScheduleError, alpha_beta_bound_s, nccl_size_bytes
    from traffic.tcp import INFO_KEYS

    pl = plan(p, ctx.seed)
    topo, schedules, job, placement, sizes = pl["topology"], pl["schedules"], pl["job"], pl["placement"], pl["sizes"]
    n = pl["ranks"]
    rdma = p["transport"] == "rdma"
    if rdma:
        from testbed import doctor
        from testbed.errors import CapabilityMissing

        _check_rdma(p, topo)
        if doctor.missing(["rxe:netns"]):
            raise CapabilityMissing("rxe:netns", "transport=rdma needs SoftRoCE across namespaces: run it in the "
                                    "lab VM (testbed vm -- ...)")
    # Agents are forks of one interpreter that imported numpy and the agent code while the fabric is built
    # (traffic.forkserver: a fresh interpreter per agent cost ~6 s of CPU each in the emulated lab VM).
    # TESTBED_AGENT_SPAWN=exec starts each agent as its own interpreter instead (nsenter + python -m traffic.agent).
    forks = None if os.environ.get("TESTBED_AGENT_SPAWN") == "exec" else ForkServer(netns.NETNS_DIR, netns.popen)
    if forks:
        forks.start()
        ctx.on_teardown(forks.close)
        ctx.state.add("pids", forks.pid)
    fabric = Fabric(topo, ctx.run_id, rxe=rdma)
    ctx.rundir.manifest["topology"] = fabric.describe()
    ctx.rundir.manifest["placement"] = placement.as_dict()
    ctx.rundir.write_manifest()
    ctx.progress(f"building leaf-spine {p['spines']}x{p['leaves']}x{p['hosts_per_leaf']}: {len(topo.nodes)} "
                 f"namespaces, hosts {p['host_rate_mbps']:g} Mbit/s, fabric {p['fabric_rate_mbps']:g} Mbit/s")
    fabric.build(ctx.state, ctx.on_teardown)
    if p["loss_percent"] > 0:
        lh = p["loss_host"]
        nic = next(ifn for (node, ifn) in topo.addresses if node == lh)
        fabric.add_loss(lh, nic, p["loss_percent"])
        ctx.progress(f"{p['loss_percent']:g}% random loss on packets arriving at {lh}:{nic}")
    ctx.rundir.manifest["topology"] = fabric.describe()
    ctx.rundir.write_manifest()
    cap = None
    where = capm.parse_spec(p["capture"], topo.addresses)
    if where:
        cap = capm.PortCapture(fabric.ns(where[0]), where[0], where[1],
                               ctx.rundir.path / capm.file_name(*where), netns.popen)
        ctx.on_teardown(cap.stop)
        cap.start()
        ctx.progress(f"capturing {where[0]}:{where[1]} into {cap.path.name} (tcpdump -s {cap.snaplen})")

    pfc = None
    if p["pfc"] == "on":
        from testbed.pfc import PfcController

        pfc = PfcController(fabric, interval_s=0.001, frames=True)
        ctx.on_teardown(pfc.close)
        pfc.install()
        pfc_drops_before = pfc.class_drops()
        pfc.start()  # forked now, before the agents and the sampler add threads
        ctx.on_teardown(pfc.stop)
        ctx.progress(f"PFC on DSCP {collective_dscp(p)} (802.1p {PFC_PCP}): XOFF {p['pfc_xoff_bytes']} B, "
                     f"XON {p['pfc_xon_bytes']} B, {len(pfc.queues)} lossless queues")

    members = [Member(r, placement.host_of(r), fabric.ns(placement.host_of(r)),
                      fabric.host_ip(placement.host_of(r))) for r in range(n)]
    host_of = {m.rank: m.host for m in members}
    job_doc = {"ranks": n, "seed": pl["seed"], "verify": p["verify"], "timeout_s": p["timeout_s"],
               "transport": {"kind": p["transport"], "cc": p["cc"], "dscp": collective_dscp(p),
                             **({"rdma": {"devices": {str(m.rank): fabric.rxe[m.host][0] for m in members},
                                          "mtu": p["rdma_mtu"], "timeout": p["rdma_timeout"],
                                          "retry_cnt": p["rdma_retry_cnt"], "rnr_retry": p["rdma_rnr_retry"],
                                          "min_rnr_timer": p["rdma_min_rnr_timer"]}} if rdma else {})},
               "plan": jobm.iteration_plan(job)}
    ctl = Controller(ctx.rundir.path, job_doc, schedules, members, forks.popen if forks else netns.popen,
                     progress=ctx.progress)
    ctx.on_teardown(ctl.stop)
    hosts = sorted({m.host for m in members} | {h for f in job.background for h in (f.src, f.dst)})
    bg = None
    if job.background:
        bg = BackgroundFlows(job.background, {h: (fabric.ns(h), fabric.host_ip(h)) for h in hosts}, netns.entered,
                             cc=p["cc"])
        ctx.on_teardown(bg.stop)
    sampler = None
    if p["sample_interval_ms"] > 0:
        sampler = QueueSampler(fabric, interval_s=p["sample_interval_ms"] / 1000.0)
    ctx.progress(f"{n} ranks on {', '.join(host_of[r] for r in range(n))} ({p['placement']}); "
                 f"{job.iterations} iterations (+{job.warmup} warm-up) of "
                 f"{', '.join(f'{k}={v}' for k, v in sizes.items())} B")
    ctl.start()
    before: dict = {}
    rdma_before: dict = {}
    bg_stats: list[dict] = []
    started = []

    port_before: dict = {}

    def before_go() -> None:  # agents connected and ready: counters, sampler and background traffic from here
        before.update({h: counters.tcp_counters(fabric.ns(h)) for h in hosts})
        port_before.update(port_totals(fabric.ports()))
        if rdma:
            rdma_before.update({h: rdma_counters(fabric.ns(h), fabric.rxe[h][0]) for h in hosts if h in fabric.rxe})
        if sampler:
            sampler.start()
            started.append(sampler)
        if bg:
            bg.start()
            started.append(bg)
            ctx.progress(f"{len(job.background)} background flow(s) running")

    try:
        try:
            res = ctl.run(setup_timeout_s=p["timeout_s"], run_timeout_s=p["timeout_s"], before_go=before_go)
        except ControlError as e:
            raise RunFailed(f"collective: run failed: {e} (agent logs: {ctx.rundir.path}/agent-*.log)") from None
    finally:
        if bg and bg in started:
            bg_stats = bg.stop()
        if sampler and sampler in started:
            sampler.stop()
        cap_stats = cap.stop() if cap else {}
        if pfc:
            pfc.stop()
    after = {h: counters.tcp_counters(fabric.ns(h)) for h in hosts}
    port_after = port_totals(fabric.ports())
    rdma_after = ({h: rdma_counters(fabric.ns(h), fabric.rxe[h][0]) for h in hosts if h in fabric.rxe}
                  if rdma else {})
    ctl.stop()

    # ---- files ----
    rows = [dict(zip(["iteration", "op", "op_index", "collective", "rank", "start_s", "end_s", "bytes_sent",
                      "bytes_recv", "wait_s"], r)) for r in res.ops]
    starts = jobm.iteration_starts(rows, res.t_measure_by_rank)  # step-time origins: compute phases count
    nsize = {}
    for r in rows:
        if r["op"] not in nsize:
            try:
                nsize[r["op"]] = nccl_size_bytes(r["collective"], n, sizes[r["op"]])
            except ScheduleError:  # a custom schedule: no nccl-tests size convention, report the message size
                nsize[r["op"]] = sizes[r["op"]]
        r["host"] = host_of[r["rank"]]
        r["iter_start_s"] = round(starts[(r["rank"], r["iteration"])], 6)
        r["size_bytes"] = nsize[r["op"]]
    ctx.rundir.write_csv("ops.csv", OPS_COLUMNS + OPS_EXTRA, ([r[c] for c in OPS_COLUMNS + OPS_EXTRA] for r in rows))
    ctx.rundir.write_csv("tcp_info.csv", ["iteration", "op_index", "rank", "peer", "phase", *INFO_KEYS],
                         ([it, k, rk, peer, ph, *[info.get(x, 0) for x in INFO_KEYS]]
                          for it, k, rk, peer, ph, info in res.tcp_info))
    ctx.rundir.write_csv("tcp.csv", ["host", "phase", "counter", "value"],
                         [(h, ph, k, d[h].get(k, 0)) for ph, d in (("before", before), ("after", after))
                          for h in hosts for k in counters.KEY_COUNTERS])
    if rdma:
        ctx.rundir.write_csv("rdma.csv", ["host", "device", "phase", "counter", "value"],
                             [(h, fabric.rxe[h][0], ph, k, v) for ph, d in (("before", rdma_before),
                                                                            ("after", rdma_after))
                              for h in sorted(d) for k, v in sorted(d[h].items())])
    if sampler:
        sampler.write(ctx.rundir)
    if pfc:
        pfc.write(ctx.rundir, queues=not sampler)  # the sampler's queues.csv covers every port when it ran

    # ---- metrics: computed by analysis from the files just written (what `testbed report` / `compare` show) ----
    from analysis import summary as asum

    run = asum.load_quietly(ctx.rundir.path)
    cm = asum.collective_metrics(run.ops)
    nrows = asum.nccl_table(run.ops).to_dict("records")
    itemsize = next(iter(schedules.values())).itemsize
    dtype = next(iter(schedules.values())).dtype
    # beta is per PAYLOAD byte: the shaper also carries every packet's headers
    efficiency = payload_efficiency(p["transport"], topo.host_link.mtu, p["rdma_mtu"])
    for r in nrows:
        r["message_bytes"] = sizes[r["op"]]
        r["bound_us"] = alpha_beta_bound_s(r["collective"], n, r["message_bytes"],
                                           p["host_rate_mbps"] * 1e6 / 8 * efficiency, p["delay_ms"] * 1e-3 * 4) * 1e6
        r["time_vs_bound"] = r["time_us"] / r["bound_us"] if r["bound_us"] > 0 else math.nan
    ctx.rundir.write_csv("sweep.csv", ["op", "collective", "message_bytes", "size", "count", "time_us", "algbw_gbps",
                                       "busbw_gbps", "cct_us_p50", "cct_us_p99", "bound_us", "time_vs_bound", "n"],
                         ([r["op"], r["collective"], r["message_bytes"], int(r["size"]), int(r["size"]) // itemsize,
                           round(r["time_us"], 3), r["algbw_gbps"], r["busbw_gbps"], round(r["cct_us_p50"], 3),
                           round(r["cct_us_p99"], 3), round(r["bound_us"], 3), r["time_vs_bound"], r["n"]]
                          for r in nrows))
    print(f"# collective {nrows[0]['collective']} ({next(iter(schedules.values())).algorithm}): {n} ranks, {p['cc']}, hosts {p['host_rate_mbps']:g} Mbit/s, "
          f"{job.iterations} iterations", file=sys.stdout)
    print(jobm.format_nccl_table(nrows, dtype, itemsize), file=sys.stdout, flush=True)

    # the headline ops (analysis.summary.headline_ops): a sweep reports its largest size, buckets every op
    head = asum.headline_ops(run.ops)
    head_ops = list(dict.fromkeys(head["op"]))
    bound_of = {r["op"]: r["bound_us"] / 1e6 for r in nrows}
    ht = am.op_table(head)
    ratios = [c / bound_of[o] for o, c in zip(ht["op"], ht["cct_s"]) if bound_of[o] > 0]
    bound = sum(bound_of[o] for o in ht["op"]) / len(ht) * 1e3  # ms, per op (buckets: mean over them)
    coll = str(ht["collective"].iloc[0])
    msg = sum(sizes[o] for o in head_ops)
    ti = _tcpinfo_deltas(res.tcp_info)
    tm = asum.tcp_metrics(run.tcp)

    def pdelta(key: str, want_switch: bool) -> dict[str, int]:
        return {f"{n}:{i}": v[key] - port_before.get((n, i), {}).get(key, 0) for (n, i), v in port_after.items()
                if (topo.node(n).role != "host") == want_switch}

    switch_drops, nic_drops = pdelta("drops", True), pdelta("drops", False)
    reasons = []
    q = sampler.stats() if sampler else {}
    if q.get("cpu_busy_fraction", 0) > 0.9:
        reasons.append(f"CPU {q['cpu_busy_fraction']:.0%} busy: agents and software switching may lag the links")
    mism = [m for r in res.per_rank.values() for m in r.get("mismatches", [])]
    summary = {
        "collective": coll,
        "algorithm": next(iter(schedules.values())).algorithm,
        "ranks": n,
        "message_bytes": msg,
        "sizes": ",".join(str(r["message_bytes"]) for r in nrows),
        "ops_per_iteration": len(job.segments[0].ops),
        "iterations": job.iterations,
        "warmup": job.warmup,
        "chunks": p["chunks"],
        "placement": p["placement"],
        "hosts": ",".join(host_of[r] for r in range(n)),
        "cc": p["cc"],
        # cct_ms_*, cct_samples, ops_n, step_ms_*, step_n, step_cv, comm_wait_fraction, nccl_size_bytes, algbw_gbps,
        # busbw_gbps: analysis.summary.collective_metrics over ops.csv
        **cm,
        "bound_ms": bound,
        "bound_payload_efficiency": efficiency,
        "cct_vs_bound": sum(ratios) / len(ratios) if ratios else None,
        "data_verified": bool(res.verified),
        "mismatches": "; ".join(mism[:5]),
        "job_s": res.t_end - res.t_start,
        "agent_cpu_s_max": max((r.get("cpu_s") or 0.0 for r in res.per_rank.values()), default=0.0),
        "tcp_retrans_segs": tm.get("tcp_retrans_segs", 0),
        "tcp_timeouts": tm.get("tcp_timeouts", 0),
        # every class of every port, collective and background alike (drop-tail overflow, RED drops)
        "switch_drops": sum(switch_drops.values()),
        "switch_drops_by_port": "; ".join(f"{k}={v}" for k, v in switch_drops.items() if v),
        "host_nic_drops": sum(nic_drops.values()),
        "ecn_marks": sum(pdelta("marks", True).values()),
        "tcpinfo_total_retrans": ti["total_retrans"],
        "tcpinfo_rtt_ms_max": ti["rtt_us_max"] / 1e3,
        "tcpinfo_rto_ms_max": ti["rto_us_max"] / 1e3,
        "background_flows": len(bg_stats),
        "bg_goodput_mbps": sum(b["goodput_mbps"] for b in bg_stats),
        "compute_ms": p["compute_ms"],
        "stragglers": p["stragglers"],
        "straggler_factor": p["straggler_factor"],
        "queue_sample_interval_ms": (q["queue_sample_interval_s"] * 1e3
                                     if q and q["queue_sample_interval_s"] == q["queue_sample_interval_s"] else None),
        "cpu_busy_fraction": q.get("cpu_busy_fraction"),
        "fidelity_ok": not reasons,
        "fidelity_reasons": "; ".join(reasons),
        "transport": p["transport"],
        "loss_percent": p["loss_percent"],
    }
    if rdma:
        def rdelta(key: str) -> int:
            return sum(rdma_after[h].get(key, 0) - rdma_before.get(h, {}).get(key, 0) for h in rdma_after)

        names = sorted({k for d in rdma_after.values() for k in d})
        summary.update({f"rdma_{k}": rdelta(k) for k in names})
        # completer_retry_err: rxe's requester starting a go-back-N retransmission from the oldest unacknowledged
        # PSN (after a NAK-sequence-error or a local ACK timeout) -- retransmission rounds, not packets
        summary["rdma_retransmit_events"] = rdelta("completer_retry_err")
        summary["rdma_recovery_counters"] = sum(rdelta(k) for k in RECOVERY_COUNTERS)
        # the two causes apart: a PSN gap a responder saw (a packet lost or reordered on the way: NAK-sequence-error
        # and go-back-N) versus a requester's ACK timer firing with nothing lost (a stalled host: rxe replays the
        # unacknowledged packets, the responder counts them as duplicate_request)
        summary["rdma_sequence_gaps"] = rdelta("out_of_seq_request")
        summary["rdma_timeout_retries"] = max(0, rdelta("completer_retry_err") - rdelta("rcvd_seq_err"))
        summary["rdma_path_mtu"] = next((r.get("transport", {}).get("path_mtu") for r in res.per_rank.values()
                                         if isinstance(r.get("transport"), dict)), None)
    if pfc:
        drops = pfc.class_drops()
        summary["pfc"] = "on"
        summary["lossless_drops"] = sum(v - pfc_drops_before.get(k, 0) for k, v in drops.items())
        summary.update(pfc.summary())
    if cap:
        from testbed.capture import wire_summary

        summary.update(wire_summary(cap, cap_stats, ctx.progress, "collective"))
    if not res.verified:
        ctx.rundir.finish(summary)  # keep the evidence, then fail the run (exit status 1, teardown still runs)
        raise RunFailed(f"collective: data verification failed: {summary['mismatches']}")
    return summary


def _tcpinfo_deltas(rows) -> dict:
    """Sum over connections of total_retrans growth across the recorded ops; max RTT and RTO seen."""
    first: dict[tuple[int, int], int] = {}
    last: dict[tuple[int, int], int] = {}
    rtt = rto = 0
    for it, k, rank, peer, phase, info in rows:
        key = (rank, peer)
        first.setdefault(key, info.get("total_retrans", 0))
        last[key] = info.get("total_retrans", 0)
        rtt = max(rtt, info.get("rtt_us", 0))
        rto = max(rto, info.get("rto_us", 0))
    return {"total_retrans": sum(last[k] - first[k] for k in last), "rtt_us_max": rtt, "rto_us_max": rto}


SCENARIO = Scenario(
    name="collective",
    summary="collectives (all-reduce, all-gather, all-to-all, ...) with real data over kernel TCP, one agent per "
            "host, on a leaf-spine fabric: CCT tails, step times, algbw/busbw",
    params=PARAMS,
    needs=("qdisc:htb", "qdisc:bfifo"),
    needs_for=_needs,
    run=_run,
    validate=_validate,
    table=(("collective", "collective"), ("ranks", "ranks"), ("message_bytes", "message (bytes)"),
           ("iterations", "iterations"), ("cct_ms_p50", "CCT p50 (ms)"), ("cct_ms_p99", "CCT p99 (ms)"),
           ("cct_ms_max", "CCT max (ms)"), ("bound_ms", "alpha-beta bound (ms)"), ("cct_vs_bound", "mean CCT / bound"),
           ("step_ms_p50", "step p50 (ms)"), ("step_ms_p99", "step p99 (ms)"), ("step_cv", "step CV"),
           ("comm_wait_fraction", "comm wait fraction"), ("algbw_gbps", "algbw (Gbit/s)"),
           ("busbw_gbps", "busbw (Gbit/s)"), ("switch_drops", "switch queue drops"),
           ("tcp_retrans_segs", "TCP retransmitted segments"),
           ("bg_goodput_mbps", "background goodput (Mbit/s)"), ("data_verified", "data verified"),
           ("fidelity_ok", "fidelity ok")),
)
