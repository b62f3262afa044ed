"""Admission control: may a job start on the fabric now, later, or never (issue 27, item 3)?

    d = admit(Needs(ranks=6, max_spine_crossings=2), FabricView.of(hosts, 20.0, links), health, busy={"h1"})
    d.action    # "place" | "hold" | "refuse"
    d.reason    # one line: "refused: 6 ranks need 6 healthy hosts; 4 are healthy (h3: ..., h5: ...)"
    d.placement # the traffic.placement.Placement when placed (or, held, the one it gets when the busy hosts free)

This is the scheduler's gate in front of a production pool: a job states what it needs (its ranks, whether its
traffic may cross a link burn-in flagged, the worst oversubscription its ring may see), and is **placed** (on the
hosts its placement policy chooses, none of them flagged or busy), **held** (it would fit once the busy hosts are
free: another job holds them), or **refused** (it cannot be had on this fabric as burn-in left it, whatever frees).
Pure: decides from data (the fabric's hosts and link rates, traffic.health's Health, the busy hosts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from .health import Health
from .placement import Placement, PlacementError, link_leaves, place, spine_crossings

__all__ = ["ACTIONS", "Decision", "FabricView", "Needs", "admit"]

ACTIONS = ("place", "hold", "refuse")


@dataclass(frozen=True)
class Needs:
    """What a job asks for: ``ranks`` (``per_host`` a server, blocks of ``group`` consecutive ranks kept together),
    its placement ``policy`` and ``seed``; ``healthy_links``: its traffic may not cross a fabric link burn-in
    flagged; ``max_spine_crossings``: at most this many hops of its ring change leaf (None: any);
    ``max_uplink_load``: on every leaf its ring leaves, its hosts there x the host rate over that leaf's healthy
    uplink capacity stays at or below this (the oversubscription the job's traffic may see; None: any)."""

    ranks: int
    per_host: int = 1
    group: int = 1
    policy: str = "topo"
    seed: int = 0
    healthy_links: bool = True
    max_spine_crossings: int | None = None
    max_uplink_load: float | None = None


@dataclass(frozen=True)
class FabricView:
    """The fabric as admission sees it: ``hosts`` as ordered (host, leaf) pairs, each host's NIC rate
    ``host_mbps``, and each leaf's uplinks ``uplinks[leaf] = {link name: rate_mbps}`` (links named ``leaf-spine``
    as burn-in and the faults name them)."""

    hosts: tuple[tuple[str, str], ...]
    host_mbps: float = 0.0
    uplinks: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    @classmethod
    def of(cls, hosts: Sequence[tuple[str, str]], host_mbps: float = 0.0,
           uplinks: Mapping[str, Mapping[str, float]] | None = None) -> "FabricView":
        return cls(tuple((h, lf) for h, lf in hosts), float(host_mbps), dict(uplinks or {}))

    def uplink_mbps(self, leaf: str, bad: Iterable[str] = ()) -> float:
        """The leaf's uplink capacity without the links in ``bad``."""
        skip = set(bad)
        return sum(r for name, r in self.uplinks.get(leaf, {}).items() if name not in skip)


@dataclass(frozen=True)
class Decision:
    """``action`` (place, hold, refuse), the ranks' ``hosts`` (placed or held: where they go), and ``reason``: one
    line that starts with the action's past tense."""

    action: str
    hosts: tuple[str, ...]
    reason: str
    placement: Placement | None = None


def _names(xs: Iterable[str]) -> str:
    return ", ".join(sorted(xs, key=lambda n: (len(n), n)))


def _try(needs: Needs, fabric: FabricView, avoid: frozenset[str]) -> Placement | str:
    """The placement without ``avoid``, or why there is none (PlacementError's line)."""
    try:
        return place(needs.ranks, fabric.hosts, needs.policy, needs.seed, needs.per_host, avoid, needs.group)
    except PlacementError as e:
        return str(e)


def _limits(needs: Needs, fabric: FabricView, p: Placement, bad_links: Iterable[str]) -> str:
    """Why ``p`` breaks the job's limits on spine crossings and uplink load ('' when it keeps them)."""
    cross = spine_crossings(p.leaves)
    if needs.max_spine_crossings is not None and cross > needs.max_spine_crossings:
        return (f"its ring would cross the spine {cross} times ({needs.policy} on {len(set(p.leaves))} leaves); "
                f"at most {needs.max_spine_crossings} allowed")
    if needs.max_uplink_load is not None and cross:
        for lf in dict.fromkeys(p.leaves):
            servers = len({h for h, x in zip(p.hosts, p.leaves) if x == lf})
            up = fabric.uplink_mbps(lf, bad_links)
            load = math.inf if up <= 0 else servers * fabric.host_mbps / up
            if load > needs.max_uplink_load:
                return (f"{lf} would carry {servers} hosts x {fabric.host_mbps:g} Mbit/s over {up:g} Mbit/s of "
                        f"healthy uplinks ({load:.2f}:1); at most {needs.max_uplink_load:g}:1 allowed")
    return ""


def _shortage(needs: Needs, fabric: FabricView, health: Health | None, busy: frozenset[str], held: bool) -> str:
    """'N ranks need M healthy hosts; K are healthy (why)' for the pool the job failed to fit in."""
    need = -(-needs.ranks // needs.per_host)
    what = f"{needs.ranks} ranks" + (f" at {needs.per_host} per host" if needs.per_host > 1 else "")
    bad_h = set(health.bad_hosts) if health else set()
    healthy = [h for h, _ in fabric.hosts if h not in bad_h]
    if held:
        free = [h for h in healthy if h not in busy]
        return (f"{what} need {need} healthy hosts; {len(free)} of the {len(healthy)} healthy are free "
                f"(busy: {_names(busy & set(healthy))})")
    if need > len(healthy):
        return (f"{what} need {need} healthy hosts; {len(healthy)} are healthy ("
                f"{health.why(sorted(bad_h, key=lambda n: (len(n), n))) if health else 'none flagged'})")
    bad_l = set(health.bad_links) if health and needs.healthy_links else set()
    leaves = link_leaves(bad_l, {lf for _, lf in fabric.hosts})
    clean = [h for h, lf in fabric.hosts if h not in bad_h and lf not in leaves]
    return (f"{what} need {need} healthy hosts across the spine; {len(clean)} are behind leaves whose uplinks are "
            f"healthy ({health.why(sorted(bad_l)) if health else ''})")


def admit(needs: Needs, fabric: FabricView, health: Health | None = None, busy: Iterable[str] = ()) -> Decision:
    """Place, hold or refuse the job (module docstring). A host in ``busy`` runs another job now."""
    busy = frozenset(busy)
    bad_links = frozenset(health.bad_links) if health and needs.healthy_links else frozenset()
    avoid = (health.avoid(links=needs.healthy_links) if health else frozenset())
    later = _try(needs, fabric, avoid)
    if isinstance(later, str):
        return Decision("refuse", (), "refused: " + _shortage(needs, fabric, health, busy, held=False))
    if why := _limits(needs, fabric, later, bad_links):
        return Decision("refuse", (), f"refused: {why}")
    now = _try(needs, fabric, avoid | busy) if busy else later
    if isinstance(now, Placement) and not (why := _limits(needs, fabric, now, bad_links)):
        return Decision("place", now.hosts, f"placed: {_describe(now)}", now)
    why = _shortage(needs, fabric, health, busy, held=True) if isinstance(now, str) else why
    freed = _names(busy & set(later.hosts)) or "the busy hosts"
    return Decision("hold", later.hosts, f"held: {why}; it fits on {_describe(later)} once {freed} free", later)


def _describe(p: Placement) -> str:
    hosts = list(dict.fromkeys(p.hosts))
    leaves = list(dict.fromkeys(p.leaves))
    return (f"{p.ranks} ranks on {', '.join(hosts)} ({', '.join(leaves)}; {spine_crossings(p.leaves)} spine "
            f"crossings, {p.policy})")
