"""The fabric of a bottleneck experiment (incast, dctcp): N senders to one receiver, on a leaf-spine (receiver h1
on leaf1, senders on leaf2, leaf3, ...) or a dumbbell (h1..hN -> s1 -> s2 -> r1). The receiver's downlink port
(leaf1 -> h1, s2 -> r1) is the bottleneck and gets the queue under study (``discipline`` droptail, RED with
min = k_bytes and max = min(3K, buffer), or DCTCP step marking at K); every other port keeps the default queue.
Built from the scenarios' parameters (senders, host/fabric rates, buffer_bytes, discipline, k_bytes, ecn, cc,
rto_min_ms, seed, topology, spines, hosts_per_leaf, load_balancing) and, when given, ``delay_ms``: the one-way
propagation delay of the dumbbell's s1 - s2 link in each direction (netem, not under the shaper, so it is "wire",
not queue), which sets the base RTT (2 x delay_ms) and so the bandwidth-delay product the bottleneck queue is
compared with."""

from __future__ import annotations

import math

from testbed.errors import UsageError
from topologies import DumbbellSpec, HostTcpSpec, LinkSpec, QueueSpec, SpecError, uniform_leaf_spine


def bottleneck_queue(p: dict):
    d = p["discipline"]
    if d == "droptail":
        return QueueSpec("droptail", buffer_bytes=p["buffer_bytes"])
    if d == "red":
        k = p["k_bytes"]
        return QueueSpec("red", buffer_bytes=p["buffer_bytes"], min_bytes=k, max_bytes=min(3 * k, p["buffer_bytes"]),
                         probability=0.1, ecn=p["ecn"])
    return QueueSpec("step", buffer_bytes=p["buffer_bytes"], k_bytes=p["k_bytes"])


def check_marking(p: dict) -> None:
    """UsageError when K cannot work with the buffer: step marking needs K + one packet within it, RED K below it."""
    if p["discipline"] == "step" and p["k_bytes"] + 1500 > p["buffer_bytes"]:
        raise UsageError(f"k_bytes ({p['k_bytes']}) + one packet (1500) must be <= buffer_bytes "
                         f"({p['buffer_bytes']}) for step marking")
    if p["discipline"] == "red" and p["k_bytes"] >= p["buffer_bytes"]:
        raise UsageError(f"k_bytes ({p['k_bytes']}) must be < buffer_bytes ({p['buffer_bytes']}) for RED")


def build_spec(p: dict, seed: int = 0):
    """The topology of a parameter set, plus (receiver, senders, bottleneck (node, port)). UsageError when the
    parameters cannot make a valid fabric."""
    n = p["senders"]
    check_marking(p)
    if p["ecn"] and p["discipline"] == "droptail":
        pass  # legal: ECN-capable hosts behind a queue that never marks (the spec lists it as a warning)
    seed = p["seed"] or seed
    try:
        tcp = HostTcpSpec(congestion_control=p["cc"], ecn=p["ecn"], rto_min_ms=p["rto_min_ms"])
        q = bottleneck_queue(p)
        host = LinkSpec(p["host_rate_mbps"])
        delay_ms = float(p.get("delay_ms") or 0.0)
        fabric = LinkSpec(p["fabric_rate_mbps"], delay_ms=delay_ms)
        if p["topology"] == "dumbbell":
            topo = DumbbellSpec(senders=n, sender_link=host, bottleneck_link=fabric, receiver_link=host,
                                switch_queue=q, tcp=tcp, seed=seed % 2**32)
            return topo, "r1", list(topo.sender_names), ("s2", "r1")
        if delay_ms:
            raise UsageError("delay_ms applies to the dumbbell's s1 - s2 link only (topology=dumbbell)")
        hpl = p["hosts_per_leaf"]
        leaves = 1 + math.ceil(n / hpl)
        topo = uniform_leaf_spine(p["spines"], leaves, hpl, p["host_rate_mbps"], p["fabric_rate_mbps"],
                                  leaf_down_queue=q, tcp=tcp, seed=seed % 2**32, load_balancing=p["load_balancing"])
        senders = [h for leaf in range(2, leaves + 1) for h in topo.hosts_of(f"leaf{leaf}")][:n]
        return topo, "h1", senders, ("leaf1", "h1")
    except SpecError as e:
        raise UsageError(str(e)) from None


def bottleneck_needs(p: dict) -> tuple[str, ...]:
    """What this run needs beyond HTB and bfifo: RED (red, step), ECN, the congestion control if it is not built
    into every kernel (dctcp, bbr), and for load_balancing=spray qdisc:clsact, cls:basic+meta, act:skbedit and
    act:mirred (the per-packet sprayer on the leaves' uplinks). A drop-tail incast with cubic or reno therefore
    runs on a host kernel that has only HTB (`--vm auto` does not boot the lab VM for it)."""
    need: list[str] = []
    if p.get("discipline") in ("red", "step"):
        need.append("qdisc:red+ecn")
    if p.get("ecn"):
        need.append("sysctl:ecn")
    if p.get("cc") in ("dctcp", "bbr"):
        need.append(f"tcp:{p['cc']}")
    if p.get("load_balancing") == "spray":
        need += ["qdisc:clsact", "cls:basic+meta", "act:skbedit", "act:mirred"]
    if p.get("load_balancing") in ("flowlet", "adaptive"):
        need += ["qdisc:clsact", "bpf:flowlet"]
    return tuple(need)
