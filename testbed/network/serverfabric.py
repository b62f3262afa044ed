"""A fabric over servers that are machines: the placement made here, each server's share built there by its agent
(docs/servers.md, issue 29).

    links = [AgentLink.start(s) for s in serversfile.load(FILE)]     # one agent per server (ssh, or local)
    with ServerFabric(topology, run_id, links) as fab:                # every share built, in parallel
        fab.ns("h3"), fab.server_of("h3"), fab.counters()
    # leaving the block: every server tears its share down (and an agent whose ssh session ends does so itself)

What it stands for: Mininet's cluster edition (``MininetCluster``) places the network over its servers and starts
each server's part over ssh; MaxiNet's frontend hands each worker its partition. Here each server's agent receives
the description of its share (testbed.network.share) in one request and builds it with the same Fabric code a
one-machine run uses; crossing links are VXLAN between the servers' own addresses (the servers file's
``address=``, its MTU ``mtu=``), each checked first through that server's agent: the address must be on one of its
interfaces and that interface's MTU must carry the crossing links' VXLAN (:meth:`ServerFabric.check_nics`); whether
the NIC merges what it receives (GRO) is recorded as a caveat. The namespaces on every server are named
``tb-<run>-<node>``, so a node's name and the server it is on are all it takes to reach it.
"""

from __future__ import annotations

import contextlib
import functools
import json
from pathlib import Path

from testbed.network.serverlink import JOIN_GRACE_S, AgentError, AgentLink, call_each, clock_pass
from testbed.errors import UsageError
from testbed.kernel import PREFIX
from testbed.kernel.tunnel import VXLAN_OVERHEAD_BYTES
from testbed.network import servernic
from testbed.network import share as shares

#: the clock echo's UDP port on each server's address (the servers check uses 9319)
CLOCK_PORT = 9320


class ServerFabric:
    """One run's fabric over the servers behind ``links`` (the first is the reference). ``underlay_ns``: per
    server name, the namespace its agent should treat as its NIC's (default: the agent's own namespace): for tests
    that stand servers in for namespaces. The clock passes run in the agents' own namespaces, so with
    ``underlay_ns`` they measure another path than the tunnels'."""

    def __init__(self, topology, run_id: str, links: list[AgentLink], underlay_ns: dict[str, str] | None = None):
        self.topology = topology
        self.run_id = run_id
        self.links = {lk.server.name: lk for lk in links}
        for lk in links:
            if not lk.server.address:
                raise UsageError(f"server {lk.server.name}: the servers file gives no address= for its tunnels")
        self.underlay = {lk.server.name: lk.server.address for lk in links}
        self.placement = shares.plan(topology, [(lk.server.name, lk.server.address, lk.server.mtu) for lk in links])
        self.vni_base = shares.vni_base(run_id)
        self.underlay_ns = dict(underlay_ns or {})
        self.built: dict[str, dict] = {}   # server -> what its agent reported (build_s, kernel, namespaces, ...)
        self.request_s: dict[str, dict[str, float]] = {}   # op -> server -> its on_each request's wall time
        self.clocks: list[dict[str, dict]] = []   # each pass: server -> offset against the reference, its bound
        self.nics: dict[str, dict] = {}   # server -> its agent's nic reply (interface, MTU, GRO), by check_nics
        self.needed_mtu: dict[str, tuple[int, str]] = {}  # server -> (MTU its NIC needs, the link needing it)

    def ns(self, node: str) -> str:
        """The node's namespace on its server."""
        return f"{PREFIX}-{self.run_id}-{node}"

    def server_of(self, node: str) -> str:
        return self.placement.server_of[node]

    def check_nics(self) -> dict[str, dict]:
        """Ask every server's agent (its ``nic`` operation) for the interface holding its ``address=`` in its
        namespace (or its ``underlay_ns``), that interface's MTU and GRO; UsageError, one line naming the server,
        what was found and what is needed, when the address is on none of them or the MTU cannot carry the largest
        link crossing to that server plus VXLAN's 50 bytes (testbed.network.servernic, the servers check's rule).
        Nothing is built on any server before every one has passed. The replies are kept (:attr:`nics`)."""
        self.needed_mtu = need = servernic.needed_mtu(self.topology, self.placement)
        bad = []
        for name, lk in self.links.items():
            ns = self.underlay_ns.get(name)
            self.nics[name] = found = lk.call("nic", address=self.underlay[name], ns=ns)
            mtu, link = need.get(name, (None, ""))
            why = f"the crossing link {link} (MTU {mtu - VXLAN_OVERHEAD_BYTES} + VXLAN's 50)" if mtu else ""
            bad.append(servernic.problem(name, self.underlay[name], found, mtu, why, ns))
        bad = [b for b in bad if b]
        if bad:
            raise UsageError("; ".join(bad))
        return self.nics

    def caveats(self) -> list[str]:
        """Fidelity caveats of this split (from :meth:`check_nics`' replies): servers whose NIC merges the crossing
        frames it receives (GRO)."""
        return [c for n, found in self.nics.items() if (c := servernic.gro_caveat(n, found, n in self.needed_mtu))]

    def _nic(self, name: str) -> dict | None:
        found = self.nics.get(name)
        if found is None:
            return None
        return {"ifname": found["ifname"], "mtu": found["mtu"], "gro": found.get("gro"),
                "gro_on": servernic.gro_on(found)}

    def on_each(self, op: str, servers=None, timeout_s: float = 60.0, **kw) -> dict[str, dict]:
        """One request ``op`` (with ``kw``) to every server's agent at once, a thread each (serverlink.call_each):
        server -> its reply. ``servers``: the servers asked (default: all); a dict gives each its own arguments too
        (server -> kw added to ``kw``). Each request's wall time is kept in :attr:`request_s` (op -> server -> s).
        AgentError, one message naming every server that failed or did not answer within ``timeout_s`` (and
        serverlink.JOIN_GRACE_S)."""
        own = servers if isinstance(servers, dict) else {n: {} for n in (self.links if servers is None else servers)}
        calls = {n: functools.partial(self.links[n].call, op, timeout_s=timeout_s, **{**kw, **own[n]}) for n in own}
        self.request_s[op] = wall = {}
        return call_each(calls, op, timeout_s + JOIN_GRACE_S, wall)

    @property
    def build_wall_s(self) -> dict[str, float]:
        """Server -> the wall time of its ``build_share`` request."""
        return self.request_s.get("build_share", {})

    def build(self, timeout_s: float = 600.0) -> "ServerFabric":
        """Every server's NIC checked (:meth:`check_nics`: UsageError before anything is built), then every server
        builds its share at once (:meth:`on_each`); if one fails, every share built is torn down and AgentError
        names the server."""
        self.check_nics()
        own = {n: {"share": shares.describe(self.topology, self.run_id, self.placement, n, self.underlay,
                                            self.vni_base), "underlay_ns": self.underlay_ns.get(n)} for n in self.links}
        try:
            self.built.update(self.on_each("build_share", own, timeout_s=timeout_s))
        except AgentError:
            self.teardown()
            raise
        return self

    def clock(self, exchanges: int = 100) -> dict[str, dict]:
        """One clock pass: each server's CLOCK_MONOTONIC offset against the reference's (the first server), with
        its bound, measured by the agents over the servers' addresses (the server's agent runs the echo, the
        reference's probes it: serverlink.clock_pass), as `testbed servers check` does. Kept in :attr:`clocks` (a
        run takes one at its start and one at its end) and returned."""
        names = list(self.links)
        ref = self.links[names[0]]
        out = {names[0]: {"offset_s": 0.0, "uncertainty_s": 0.0, "reference": True}}
        for name in names[1:]:
            out[name] = clock_pass(ref, self.links[name], self.underlay[name], CLOCK_PORT, exchanges)
        self.clocks.append(out)
        return out

    def counters(self) -> dict[str, dict]:
        """Per server: its NIC namespace's UDP counters and its crossing ports' packet counters."""
        return {name: lk.call("share_counters") for name, lk in self.links.items() if name in self.built}

    def teardown(self) -> dict[str, list[str]]:
        """Every server removes its share (a server whose agent is gone has removed it already: its agent tears
        down at the end of its input)."""
        removed = {}
        for name, lk in self.links.items():
            with contextlib.suppress(AgentError):
                removed[name] = lk.call("teardown_share", timeout_s=120)["removed"]
        self.built.clear()
        return removed

    def describe(self) -> dict:
        """For the run's manifest: per server its kernel, set-up time (the agent's build and the request's wall
        time) and NIC (interface, MTU, GRO features, ``gro_on``), the placement, the tunnels and the caveats."""
        return {"placement": {s: self.placement.nodes_on(s) for s in self.placement.servers},
                "underlay": dict(self.underlay), "vni_base": self.vni_base, "caveats": self.caveats(),
                "servers": {n: {"kernel": self.built.get(n, {}).get("kernel"),
                                "build_s": self.built.get(n, {}).get("build_s"), "request_s": self.build_wall_s.get(n),
                                "nic": self._nic(n)} for n in self.links if n in self.built or n in self.nics}}

    def record(self, path: str | Path) -> dict:
        """Write servers.json for the run directory: per server its address, kernel, nodes, set-up time, clock
        passes (offset against the reference and bound), NIC (with its GRO) and what its tunnels carried so far;
        the split's fidelity caveats."""
        counters = self.counters()
        d = {"reference": next(iter(self.links)), "run_id": self.run_id, "vni_base": self.vni_base,
             "caveats": self.caveats(),
             "servers": {n: {"address": self.underlay[n], "kernel": self.built.get(n, {}).get("kernel"),
                             "nodes": self.placement.nodes_on(n), "build_s": self.built.get(n, {}).get("build_s"),
                             "request_s": self.build_wall_s.get(n), "clock": [c[n] for c in self.clocks],
                             "nic": self._nic(n),
                             "tunnels": counters.get(n)} for n in self.links}}
        Path(path).write_text(json.dumps(d, indent=1) + "\n")
        return d

    def __enter__(self) -> "ServerFabric":
        return self.build()

    def __exit__(self, *exc) -> None:
        self.teardown()
