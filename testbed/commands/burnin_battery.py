"""The measurements of ``testbed burnin`` on a live :class:`~testbed.lab.Lab` (testbed.commands.burnin drives them;
analysis.burnin judges them). Each stands for what an operator's burn-in does to a new server or cable:

* **a host's NIC**: one bulk TCP flow to a peer under the same leaf (a ring within each leaf, so every host sends
  once and receives once and no flow crosses a spine; run in rounds where no host both sends and receives),
  paced at 90% of the path's configured rate so a healthy path keeps no queue and loses nothing: its goodput
  (``tx_mbps``), the sender's retransmitted share of its segments (``retrans_pct``, the namespace's kernel TCP
  counters) and the congestion control its sockets report (``ss -ti`` in its namespace);
* **latency**: ICMP echo to the same peer on the idle fabric, median and p99 of ``PINGS`` echoes;
* **CPU speed**: a fixed compute task (a Python loop) timed by a worker process in the host's namespace, started
  before the fault timeline so a slow-host fault's cgroup (CFS bandwidth control) holds it as it holds the host's
  other processes; the median of ``CPU_REPEATS`` runs back to back after a first one that is dropped (a group idle
  before it starts with a whole period's quota and can finish unthrottled, measured 51 ms against 200 ms for the
  next ones at 20% of a CPU). Not the fastest run: with a quota of one task or more per period (40% of a CPU at
  100 ms, 20% at 200 ms) leftover quota lets some back-to-back runs finish unthrottled, and a model of CFS
  bandwidth control hid such a throttle from the fastest in 26-100% of timings, from the median in none;
* **configuration**: the MTU of the host's interface, ``net.ipv4.tcp_ecn``, read in its namespace;
* **fabric links, by pinned paths**: for every ordered leaf pair and every spine, the source leaf's route to the
  destination leaf's subnet is replaced by one through that spine only (as an operator pins a path with a static
  route or policy routing), every host of the source leaf sends to one of the destination leaf's, and the path's
  goodput, the senders' retransmissions and each fabric port's qdisc drop counter are read. Paths that share no
  port run at once (one round per spine and leaf offset);
* **collectives**: a ring all-reduce per leaf and one across the fabric (the project's agents, real data), each
  one's CCT against its alpha-beta bound.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from statistics import median

from analysis.burnin import median_or_nan, p99_or_nan
from testbed.kernel import linkfail, netns
from testbed.measure.tcprecord import TcpCounters

#: flows are paced at this fraction of their path's configured rate (a healthy path then builds no queue)
PACE = 0.9
#: seconds a round's flows run before their goodput is measured (connection set-up, pacing settles)
WARMUP_S = 0.4
PINGS, PING_INTERVAL_S = 40, 0.005
BACKLOG_EVERY_S = 0.05
#: the compute task: iterations of a Python loop (~35 ms on one idle core of this machine), run CPU_REPEATS times
CPU_LOOP, CPU_REPEATS = 600_000, 5
#: the task's time the loop count is calibrated to (:meth:`CpuWorkers.calibrated_loops`; the host's CPU_LOOP takes
#: 35-45 ms, so there the cap decides): a run needs several times the quota of a host throttled to 20% of a CPU at
#: CFS's 100 ms period, and a model of CFS bandwidth control hid such a throttle from the median of 5 runs only for
#: tasks of 12 ms or less. A throttle whose quota per period covers the whole task (e.g. 20% at a 300 ms period) is
#: not seen by this check
CPU_TASK_MS = 50.0
WORKER = ("import sys, time\nprint('ready', flush=True)\n"
          "for line in sys.stdin:\n    n = int(line)\n    t = time.perf_counter()\n    x = 0\n"
          "    for i in range(n):\n        x += i * i\n"
          "    print(f'{(time.perf_counter() - t) * 1e3:.3f}', flush=True)\n")


@dataclass
class Shape:
    """The leaf-spine as the battery walks it: leaves, spines, each leaf's hosts, the fabric ports and links."""

    leaves: list[str]
    spines: list[str]
    hosts_of: dict[str, list[str]]
    port: dict[tuple[str, str], str] = field(default_factory=dict)  # (node, peer) -> node's ifname towards peer
    link: dict[tuple[str, str], str] = field(default_factory=dict)  # (node, peer) -> the link's name a-b
    rate: dict[tuple[str, str], float] = field(default_factory=dict)  # (node, ifname) -> configured Mbit/s

    @property
    def hosts(self) -> list[str]:
        return [h for lf in self.leaves for h in self.hosts_of[lf]]

    @property
    def links(self) -> list[str]:
        return sorted(set(self.link.values()))


def shape_of(topology, port_rates: dict[tuple[str, str], float]) -> Shape:
    """The battery's view of a leaf-spine topology (``port_rates``: (node, ifname) -> Mbit/s, every egress port)."""
    role = {n.name: n.role for n in topology.nodes}
    plan = topology.address_plan
    leaves = [lf for lf in plan.edge_hosts if role.get(lf) == "leaf"]
    s = Shape(leaves, [n.name for n in topology.nodes if n.role == "spine"],
              {lf: list(plan.edge_hosts[lf]) for lf in leaves}, rate=dict(port_rates))
    for l in topology.links:
        if role[l.a] == "host" or role[l.b] == "host":
            continue
        s.port.setdefault((l.a, l.b), l.a_port)
        s.port.setdefault((l.b, l.a), l.b_port)
        s.link.setdefault((l.a, l.b), f"{l.a}-{l.b}")
        s.link.setdefault((l.b, l.a), f"{l.a}-{l.b}")
    return s


def host_pairs(shape: Shape) -> list[tuple[str, str]]:
    """(sender, receiver): a ring inside each leaf; hosts alone under their leaf form a ring of their own (one such
    host joins the first leaf's ring)."""
    rings = [list(shape.hosts_of[lf]) for lf in shape.leaves if len(shape.hosts_of[lf]) > 1]
    lonely = [shape.hosts_of[lf][0] for lf in shape.leaves if len(shape.hosts_of[lf]) == 1]
    if len(lonely) > 1:
        rings.append(lonely)
    elif lonely and rings:
        rings[0].append(lonely[0])
    return [(r[i], r[(i + 1) % len(r)]) for r in rings for i in range(len(r))]


def host_rounds(pairs: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """The host pairs packed into rounds in which no host takes part twice: no NIC carries its own data beside the
    ACKs of a flow it receives (measured: a peer on reno, whose NIC queue delayed a BBR sender's ACKs, cut that
    sender to 69% of its rate when both directions ran at once)."""
    rounds: list[list[tuple[str, str]]] = []
    for a, b in pairs:
        for rnd in rounds:
            if not {a, b} & {h for pr in rnd for h in pr}:
                rnd.append((a, b))
                break
        else:
            rounds.append([(a, b)])
    return rounds


@dataclass(frozen=True)
class Path:
    """A pinned path src_leaf -> spine -> dst_leaf and the host flows that load it."""

    src_leaf: str
    spine: str
    dst_leaf: str
    pairs: tuple[tuple[str, str], ...]

    @property
    def name(self) -> str:
        return f"{self.src_leaf}>{self.spine}>{self.dst_leaf}"


def path_rounds(shape: Shape) -> list[list[Path]]:
    """Every ordered leaf pair over every spine, packed into rounds in which no leaf takes part twice (so no port
    carries one path's data beside another's ACKs, and no host sends or receives twice). In the k-th (leaf offset,
    spine) combination host j of the source leaf sends to host (j + k) of the destination's, so a receiver hears
    different senders over different spines."""
    n, paths = len(shape.leaves), []
    for d in range(1, n):
        for k, spine in enumerate(shape.spines):
            r = (d - 1) * len(shape.spines) + k
            for i, src in enumerate(shape.leaves):
                dst = shape.leaves[(i + d) % n]
                dh = shape.hosts_of[dst]
                paths.append(Path(src, spine, dst, tuple((h, dh[(j + r) % len(dh)])
                                                         for j, h in enumerate(shape.hosts_of[src]))))
    rounds: list[list[Path]] = []
    for p in paths:
        for rnd in rounds:
            if not any({p.src_leaf, p.dst_leaf} & {q.src_leaf, q.dst_leaf} for q in rnd):
                rnd.append(p)
                break
        else:
            rounds.append([p])
    return rounds


def path_ports(shape: Shape, p: Path) -> list[tuple[str, str]]:
    """The two fabric egress ports (node, ifname) a pinned path crosses."""
    return [(p.src_leaf, shape.port[(p.src_leaf, p.spine)]), (p.spine, shape.port[(p.spine, p.dst_leaf)])]


def path_rate(shape: Shape, topology, p: Path) -> float:
    """The configured rate of a path's load: its fabric ports' and its hosts' links' (Mbit/s)."""
    plan = topology.address_plan
    nic = sum(shape.rate[(h, plan.attachments[h][1])] for h, _ in p.pairs)
    down = sum(shape.rate[(plan.attachments[d][0], plan.attachments[d][2])] for d in {d for _, d in p.pairs})
    return min(nic, down, *(shape.rate[pt] for pt in path_ports(shape, p)))


class PinnedRoutes:
    """Routes of source leaves replaced by single-spine ones while a round runs; the built routes put back after."""

    def __init__(self, lab):
        self.lab, self.topology = lab, lab.net.fabric.topology
        self._changed: dict[tuple[str, str], object] = {}
        lab.on_teardown(self.restore)

    def _apply(self, node: str, route) -> None:
        with netns.ipr_in(self.lab.net.ns(node)) as ipr:
            idx = {nh.ifname: ipr.link_lookup(ifname=nh.ifname)[0] for nh in route.nexthops}
            linkfail.apply_routes(ipr, idx, [route], [])

    def pin(self, shape: Shape, leaf: str, spine: str, dst_leaf: str) -> None:
        """``leaf``'s route to ``dst_leaf``'s hosts through ``spine`` only."""
        subnet = self.topology.address_plan.subnets[dst_leaf]
        built = next(r for r in self.topology.routes if r.node == leaf and r.dst == subnet)
        port = shape.port[(leaf, spine)]
        self._changed.setdefault((leaf, subnet), built)
        self._apply(leaf, replace(built, nexthops=tuple(nh for nh in built.nexthops if nh.ifname == port)))

    def pin_path(self, shape: Shape, p: Path) -> None:
        """The path's data and its ACKs both through its spine."""
        self.pin(shape, p.src_leaf, p.spine, p.dst_leaf)
        self.pin(shape, p.dst_leaf, p.spine, p.src_leaf)

    def restore(self) -> None:
        for (node, _), route in list(self._changed.items()):
            self._apply(node, route)
        self._changed.clear()


@dataclass
class RoundResult:
    goodput_mbps: list[float]
    tcp: dict[str, dict[str, int]]  # sender host -> counter increases
    port_deltas: dict[tuple[str, str], dict[str, int]]
    cc: dict[str, str]
    backlog_bytes: dict[tuple[str, str], float] = field(default_factory=dict)  # mean over the window


class BacklogSampler:
    """The mean backlog of some egress ports over a window, read every ``BACKLOG_EVERY_S`` from one qdisc dump per
    namespace: the port that holds a standing queue is the one that cannot keep up (with a delay-based congestion
    control such as BBR a slow port drops nothing, but it still queues)."""

    def __init__(self, lab, ports: list[tuple[str, str]]):
        import socket

        from testbed.kernel.qdiscdump import RawQdiscDump

        self.ports, self.dumps, self.index = list(ports), {}, {}
        for node in {n for n, _ in self.ports}:
            ns = lab.net.ns(node)
            with netns.entered(ns):
                self.index[node] = {name: i for i, name in socket.if_nameindex()}
            self.dumps[node] = RawQdiscDump(ns)
        self.sums = {p: 0.0 for p in self.ports}
        self.n = 0

    def run_for(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            stats = {node: d.leaf_stats() for node, d in self.dumps.items()}
            for node, ifname in self.ports:
                qs = stats[node].get(self.index[node].get(ifname, -1), ())
                self.sums[(node, ifname)] += sum(q.backlog_bytes for q in qs)
            self.n += 1
            time.sleep(max(0.0, min(BACKLOG_EVERY_S, end - time.monotonic())))

    def means(self) -> dict[tuple[str, str], float]:
        for d in self.dumps.values():
            d.close()
        return {p: v / max(1, self.n) for p, v in self.sums.items()}


def retrans_pct(d: dict[str, int]) -> float:
    """Retransmitted share of the segments sent (%)."""
    return 100.0 * d.get("TcpRetransSegs", 0) / max(1, d.get("TcpOutSegs", 0))


def _socket_cc(ns: str) -> str:
    """The congestion control the namespace's established TCP sockets report (``ss -ti``), or ''."""
    try:
        out = netns.run(ns, ["ss", "-tinH", "state", "established"], timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    names = re.findall(r"^\s+([a-z][a-z0-9_]*)\s+wscale:", out, flags=re.M)
    return max(set(names), key=names.count) if names else ""


def measure_flows(lab, pairs: list[tuple[str, str]], pace_mbps: float, duration_s: float,
                  ports: list[tuple[str, str]], read_cc: bool = False) -> RoundResult:
    """Bulk TCP flows for ``duration_s`` after a warm-up: per-flow goodput, the senders' TCP counters and the
    ``ports``' qdisc counters over the measured window."""
    senders = sorted({a for a, _ in pairs})
    flows = lab.flows(pairs, rate_mbps=pace_mbps)
    try:
        time.sleep(WARMUP_S)
        tcp = TcpCounters({h: lab.net.ns(h) for h in senders})
        pc = lab.port_deltas(ports)
        backlog = BacklogSampler(lab, ports)
        s0 = flows.snapshot()
        backlog.run_for(duration_s / 2)
        cc = {h: _socket_cc(lab.net.ns(h)) for h in senders} if read_cc else {}
        backlog.run_for(duration_s / 2)
        s1 = flows.snapshot()
        deltas, counters = pc.stop(), tcp.stop()
    finally:
        flows.stop()
    return RoundResult(flows.goodput_mbps(s0, s1), counters, deltas, cc, backlog.means())


def ping_rtts(lab, pairs: list[tuple[str, str]]) -> dict[str, list[float]]:
    """ICMP echo RTTs (ms) of each sender to its peer, all at once on the idle fabric."""
    procs = {a: netns.popen(lab.net.ns(a), ["ping", "-n", "-c", str(PINGS), "-i", str(PING_INTERVAL_S), "-W", "1",
                                            lab.net.fabric.host_ip(b)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True) for a, b in pairs}
    out = {}
    for a, p in procs.items():
        try:
            text, _ = p.communicate(timeout=PINGS * PING_INTERVAL_S + 10)
        except subprocess.TimeoutExpired:
            p.kill()
            text, _ = p.communicate()
        out[a] = [float(x) for x in re.findall(r"time=([0-9.]+) ms", text)]
    return out


class CpuWorkers:
    """One worker process per host, in the host's namespace, that times the compute task on request. Started
    before the fault timeline, so a slow-host fault moves it into the host's CPU-limited cgroup."""

    def __init__(self, lab, hosts: list[str]):
        self.procs: dict[str, subprocess.Popen] = {}
        lab.on_teardown(self.close)
        for h in hosts:
            p = netns.popen(lab.net.ns(h), [sys.executable, "-c", WORKER], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
            lab.state.add("pids", p.pid)
            self.procs[h] = p
        # each worker says it is ready once Python runs, so after nsenter has entered the host's namespace: a
        # slow-host step at t = 0 finds it there (a CI run's throttle moved 0 processes when it came first)
        for h, p in self.procs.items():
            line = p.stdout.readline().strip()
            if line != "ready":
                raise RuntimeError(f"burn-in: the CPU worker on {h} did not start ({line or 'no output'})")
        self.loops = self.calibrated_loops()

    def calibrated_loops(self) -> int:
        """The task's size for this machine: loops that take about CPU_TASK_MS at the machine's best speed (the
        fastest of three quarter-size runs on every worker, before any fault holds one), at most CPU_LOOP. The
        software-emulated lab VM runs the loop about 10x slower than the host: without this its CPU check alone took
        ~20 s of a 4-host battery. Calibrating on the fastest run only ever lengthens the task against a burst (a
        task shortened by one would let a throttle's quota cover more of it)."""
        quarter = CPU_LOOP // 4
        got = []
        for p in self.procs.values():
            for _ in range(3):
                p.stdin.write(f"{quarter}\n")
                p.stdin.flush()
                got.append(float(p.stdout.readline()))
        return max(CPU_LOOP // 20, min(CPU_LOOP, int(quarter * CPU_TASK_MS / max(min(got), 1e-3))))

    def time_ms(self, host: str, loops: int | None = None, repeats: int = CPU_REPEATS) -> float:
        """The median of ``repeats`` timed runs of the task (``loops``, default :meth:`calibrated_loops`') on
        ``host``, back to back after one that is dropped (it may spend a throttled group's idle quota)."""
        loops = self.loops if loops is None else loops
        p, got = self.procs[host], []
        for _ in range(repeats + 1):
            p.stdin.write(f"{loops}\n")
            p.stdin.flush()
            got.append(float(p.stdout.readline()))
        return float(median(got[1:]))

    def times_ms(self, hosts: list[str]) -> tuple[dict[str, float], dict[str, list[float]]]:
        """Every host's task time (:meth:`time_ms`); a host whose time analysis.burnin would flag against its peers
        is timed again (up to ``burnin_retry.TIMINGS`` timings, ``PAUSE_S`` apart) and keeps its lowest, as an operator
        re-runs a failed CPU check before pulling a server: another job's bursts on a shared machine slow some
        timings, a throttled CPU (a slow-host fault's cgroup) slows every one. Returns (times, each re-timed host's
        timings in order)."""
        from testbed.commands.burnin_retry import retimed

        return retimed(self.time_ms, hosts)

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
            p.wait()
        self.procs.clear()


def host_config(lab, host: str) -> dict[str, str]:
    """The host's interface MTU and ECN setting, read in its namespace."""
    ifname = lab.net.fabric.topology.address_plan.attachments[host][1]
    ns = lab.net.ns(host)
    with netns.ipr_in(ns) as ipr:
        mtu = ipr.get_links(ipr.link_lookup(ifname=ifname)[0])[0].get_attr("IFLA_MTU")
    return {"mtu_bytes": str(mtu), "tcp_ecn": netns.sysctl_read(ns, "net.ipv4.tcp_ecn"),
            "default_cc": netns.sysctl_read(ns, "net.ipv4.tcp_congestion_control")}


def allreduce(lab, hosts: list[str], leaves: list[str], size: str, iterations: int) -> dict:
    """A ring all-reduce on exactly ``hosts`` (the project's agents over kernel TCP, data verified): CCT p50 and
    its ratio to the alpha-beta bound."""
    from testbed.workloads.collective import CollectiveJob
    from testbed.workloads.settings import CollectiveSettings
    from traffic.placement import Placement

    s = CollectiveSettings("allreduce", algorithm="ring", size=size, ranks=len(hosts), iterations=iterations,
                           warmup=1, sample_interval_ms=0.0)
    plan = s.plan(lab.net.spec, lab.seed)
    plan = replace(plan, placement=Placement(tuple(hosts), tuple(leaves), "packed"))
    job = CollectiveJob(lab, plan, cc=lab.net.spec.tcp.congestion_control, sample_interval_ms=0.0).run()
    summ = job.summary()
    return {"cct_ms_p50": summ.get("cct_ms_p50"), "bound_ms": summ.get("bound_ms"),
            "cct_vs_bound": summ.get("cct_vs_bound"), "verified": bool(job.res.verified)}


__all__ = [
    "BacklogSampler", "CpuWorkers", "Path", "PinnedRoutes", "RoundResult", "Shape", "allreduce", "host_config",
    "host_pairs", "measure_flows", "median_or_nan", "p99_or_nan", "path_ports", "path_rate", "path_rounds",
    "ping_rtts", "retrans_pct", "shape_of"
]
