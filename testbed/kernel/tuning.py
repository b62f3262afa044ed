"""Transport tuning changed live on a running fabric, and read back from the kernel: what an operator's change to a
switch port's queue (buffer, discipline, marking threshold) or to a host's TCP (RTOmin per route, ECN) does, and
what proves it took effect (the qdisc the kernel reports, the route metric it holds).

* :func:`replace_leaf_queue` — the leaf queue under one HTB class of a port built by testbed.kernel.qdisc
  (``tc qdisc replace ... parent 1:10 handle 10: bfifo limit N``; a new kind is deleted and added): packets
  queued in a deleted queue are dropped with it, as on a switch whose buffer profile is re-applied.
* :func:`leaf_queue_limit` — that queue's kind and ``limit`` as the kernel reports them.
* :func:`route_rto_min_ms` — the ``rto_min`` metric of every route of a namespace (``ip route`` shows
  ``rto_min lock 5ms``). Routes are changed with testbed.kernel.linkfail.apply_routes.
"""

from __future__ import annotations

from testbed.kernel import qdisc

RTAX_RTO_MIN = "RTAX_RTO_MIN"


def replace_leaf_queue(ipr, idx: int, minor: int, queue: qdisc.LeafQueue, rate_mbps: float) -> None:
    """Replace the leaf queue of class 1:<minor> on interface ``idx`` (an open IPRoute of its namespace). The kernel
    changes a qdisc in place only to one of the same kind (else EINVAL): a new kind (bfifo -> red) deletes the old
    queue and adds the new one, the class holding the kernel's default pfifo in between."""
    kind, args = queue.tc_args(int(rate_mbps * 1_000_000 / 8))
    old_kind, _ = leaf_queue_limit(ipr, idx, minor)
    if old_kind and old_kind != kind:
        ipr.tc("del", index=idx, handle=f"{minor:x}:", parent=f"1:{minor:x}")
        ipr.tc("add", kind, index=idx, handle=f"{minor:x}:", parent=f"1:{minor:x}", **args)
        return
    ipr.tc("replace", kind, index=idx, handle=f"{minor:x}:", parent=f"1:{minor:x}", **args)


def leaf_queue_limit(ipr, idx: int, minor: int) -> tuple[str, int | None]:
    """(kind, limit) of the qdisc under class 1:<minor> of interface ``idx``; limit None when not decoded."""
    parent = (1 << 16) | minor
    for q in ipr.get_qdiscs(index=idx):
        if q["parent"] != parent:
            continue
        kind = q.get_attr("TCA_KIND")
        opts = q.get_attr("TCA_OPTIONS")
        limit = None
        if opts is not None:
            try:
                limit = int(opts["limit"])
            except (KeyError, TypeError, ValueError):
                qopt = opts.get_attr("TCA_RED_PARMS") if hasattr(opts, "get_attr") else None
                limit = int(qopt["limit"]) if qopt is not None else None
        return str(kind), limit
    return "", None


def route_rto_min_ms(ipr) -> dict[str, int | None]:
    """destination ("10.0.1.0/24", "default") -> the route's rto_min in ms (None: the kernel default, 200 ms)."""
    out: dict[str, int | None] = {}
    for r in ipr.get_routes(table=254):
        dst = r.get_attr("RTA_DST")
        name = f"{dst}/{r['dst_len']}" if dst else "default"
        metrics = r.get_attr("RTA_METRICS")
        value = metrics.get_attr(RTAX_RTO_MIN) if metrics is not None else None
        out[name] = int(value) if value is not None else None
    return out


__all__ = ["leaf_queue_limit", "replace_leaf_queue", "route_rto_min_ms"]
