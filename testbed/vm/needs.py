"""What a fabric needs from the kernel, in doctor's capability names, derived from its spec: so a command can decide
before building anything whether this kernel will do or the lab VM is needed (``--vm auto``)."""

from __future__ import annotations


def _queue_needs(q) -> list[str]:
    if q.discipline in ("red", "step"):
        return ["qdisc:red+ecn"]
    return ["qdisc:bfifo" if q.buffer_bytes is not None else "qdisc:pfifo"]


def fabric_needs(topology) -> list[str]:
    """HTB on every port; each leaf queue's discipline (bfifo, pfifo, RED/step); u32 for DSCP classes; netem, u32
    and mirred for link delay/jitter/loss (netem on an IFB at the receiving end); the sprayer's clsact, basic+meta,
    skbedit and mirred; the flowlet balancer's clsact and eBPF; the hosts' congestion control where it is not in
    every kernel (dctcp, bbr) and ECN."""
    need = ["qdisc:htb"]
    for ep in topology.egress_ports():
        queues = [ep.port.queue] + [c.queue for c in ep.port.classes if c.queue is not None]
        for q in queues:
            need += _queue_needs(q)
        if any(c.dscp for c in ep.port.classes):
            need.append("cls:u32")
        if ep.link.delay_ms > 0 or ep.link.loss_percent > 0:
            need += ["qdisc:netem", "cls:u32", "act:mirred"]
    if getattr(topology, "load_balancing", "ecmp") == "spray":
        need += ["qdisc:clsact", "cls:basic+meta", "act:skbedit", "act:mirred"]
    if getattr(topology, "load_balancing", "ecmp") in ("flowlet", "adaptive"):
        need += ["qdisc:clsact", "bpf:flowlet"]
    cc = topology.tcp.congestion_control
    if cc in ("dctcp", "bbr"):
        need.append(f"tcp:{cc}")
    if topology.tcp.effective_ecn:
        need.append("sysctl:ecn")
    return list(dict.fromkeys(need))
