"""What the fabric builder made of a topology, for manifest.json: the spec's own description plus every
construction the builder chose (namespaces, servers and tunnels, offloads, shaper, ECMP, spraying, flowlets,
impairments, classification, SoftRoCE devices, congestion control), so a run folder says how its fabric was built."""

from __future__ import annotations

from typing import Any

from testbed.kernel.qdisc import SHAPER_SLACK_MS


def describe(fabric, rps_mask: str) -> dict[str, Any]:
    """For manifest.json: the spec's own description plus what the builder did with it (``rps_mask``: the
    receive-packet-steering mask every namespace got)."""
    d = dict(fabric.topology.describe())
    d["builder"] = {
        "namespaces": dict(fabric._ns),
        "servers": ({"placer": "mininet.examples.cluster.SwitchBinPlacer (leaves with spines interleaved)",
                     "nodes": {s: fabric.placement.nodes_on(s) for s in fabric.placement.servers},
                     "namespaces": dict(fabric.server_ns), "datacentre_network": fabric.dcnet_ns,
                     "tunnels": [f"{fabric.topology.links[i].a}:{fabric.topology.links[i].a_port} <-> "
                                 f"{fabric.topology.links[i].b}:{fabric.topology.links[i].b_port} (VNI {i + 1})"
                                 for i in fabric.placement.crossing],
                     "how": "VXLAN over UDP 4789 between the servers' namespaces, underlay MTU 9000"}
                    if fabric.server_ns else _share(fabric) if fabric.share is not None else "one"),
        "offloads": "off on every fabric interface (TSO/GSO/GRO and every other segmentation or receive "
                    "aggregation feature the veth offers), so queues hold wire-sized packets",
        "ipv6": "disabled in every namespace",
        "rp_filter": 0,
        "rps": f"net.core.rps_default_mask={rps_mask} in every namespace: one flow's packets stay in order "
               "across veth hops (see testbed.kernel.sysctls.rps_mask)",
        "shaper": "HTB at the link rate on every egress (host NICs included), leaf queue per class; burst = one "
                  f"frame + {SHAPER_SLACK_MS} ms of line rate",
        "ecmp": "kernel multipath routes, net.ipv4.fib_multipath_hash_policy=1",
        "spray": ({g.node: {"ports": list(g.ports), "how": "clsact egress: meta(random) cascade, skbedit mark + "
                            "mirred redirect; far ends share a MAC"} for g in fabric.spray}
                  if fabric.spray else "off"),
        "flowlet": ({"mode": "adaptive (least congested path, CONGA-style)" if b.adaptive else
                     "flowlet (random uplink per flowlet, LetFlow)", "gap_ms": b.gap_ms,
                     **({"poll_ms": b.poll_ms} if b.adaptive else {}),
                     "routers": {p.node: list(p.ports) for p in b.plans},
                     "how": "cls_bpf direct-action on the uplinks' clsact egress (flowlet.bpf.c): flowlet table, "
                            "bpf_redirect to the chosen uplink; far ends share a MAC"}
                    if (b := fabric.balancing) is not None else "off"),
        "shared_macs": {f"{n}:{p}": m for (n, p), m in sorted(fabric.macs.items())} or "none",
        "impairments": ("netem on an IFB at the receiving end's ingress (not under the shaper)"
                        if fabric.impaired else "none"),
        "classification": ("u32 on the DSCP bits per class" if any(len(p.classes) > 1 for p in fabric.port_plans)
                            else "single class per port"),
        "ports": len(fabric.port_plans),
        "rxe": {h: {"device": d, "netdev": n} for h, (d, n) in fabric.rxe.items()} or "none",
        "congestion_control": (f"{fabric.topology.tcp.congestion_control} as namespace default" +
                               (f" except {', '.join(fabric.cc_default_failed)} (not in the kernel's "
                                "tcp_allowed_congestion_control: set per socket by the agents)"
                                if fabric.cc_default_failed else "")),
    }
    return d


def _share(fabric) -> dict[str, Any]:
    """A share of a fabric over servers that are machines (testbed.network.share): this server's nodes and its
    ends of the crossing links."""
    sh, links, on = fabric.share, fabric.topology.links, fabric.placement.server_of
    return {"placer": "mininet.examples.cluster.SwitchBinPlacer (leaves with spines interleaved)",
            "this_server": sh.server, "nodes": {s: fabric.placement.nodes_on(s) for s in fabric.placement.servers},
            "underlay": dict(sh.underlay),
            "tunnels": [f"{links[i].a}:{links[i].a_port} <-> {links[i].b}:{links[i].b_port} (VNI {sh.vni_base + i + 1})"
                        for i in fabric.placement.crossing
                        if sh.server in (on[links[i].a], on[links[i].b])],
            "how": "VXLAN over UDP 4789 from this server's NIC to the far server's address"}
