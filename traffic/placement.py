"""Rank -> host placement: which host runs which rank of a collective (one rank per host, or ``per_host`` ranks
per server: a server's ranks are consecutive and packed on it, the policy then places servers).

Input is the fabric's ordered list of ``(host, leaf)`` pairs.  Policies:

* ``packed``  -- fill leaf by leaf (leaves in order of first appearance, hosts in list order): neighbouring
  ranks share a leaf, so a ring crosses the spine as rarely as possible;
* ``spread``  -- round-robin over the leaves (rank r on leaf r mod L as long as that leaf has hosts left):
  neighbouring ranks sit on different leaves, maximising spine traffic;
* ``random``  -- a seeded shuffle of all hosts (identical across Python/NumPy versions), first ``ranks`` taken;
* ``topo``    -- topology-aware, as a scheduler that knows the fabric places a job: the fewest leaves that hold the
  job (so a ring of consecutive ranks crosses the spine once per leaf used, the fewest possible; none when one leaf
  holds it), each leaf a block of consecutive ranks, and every block of ``group`` consecutive ranks (a TP or EP group
  as traffic.jobplan lays them out, rank order tp-dp) inside one server (``per_host``) or, when larger, one leaf.

``avoid`` (any policy; empty: every policy as before) names what a job may not use, e.g. what burn-in flagged
(traffic.health): a host, a leaf (all its hosts), or a fabric link ``leaf-spine`` (the name health.json and the
faults use). A leaf with an avoided link carries no traffic across the spine: ``topo`` uses it only for a job that
fits inside it alone; the other policies, which do not know where their ring crosses, leave its hosts out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from .schedule import Schedule, stable_rng, stable_shuffle

__all__ = ["PlacementError", "Placement", "POLICIES", "place", "spine_crossings", "link_leaves"]

POLICIES = ("packed", "spread", "random", "topo")


class PlacementError(ValueError):
    """Bad placement request (one-line message)."""

    def __init__(self, message: object) -> None:
        super().__init__(" ".join(str(message).split()))


@dataclass(frozen=True)
class Placement:
    """Where each rank runs: ``hosts[r]`` on leaf ``leaves[r]``, chosen by ``policy`` (and ``seed``)."""

    hosts: tuple[str, ...]
    leaves: tuple[str, ...]
    policy: str = "packed"
    seed: int = 0
    per_host: int = 1  # ranks per server (GPUs per host); a server's ranks are consecutive

    def __post_init__(self) -> None:
        object.__setattr__(self, "hosts", tuple(self.hosts))
        object.__setattr__(self, "leaves", tuple(self.leaves))
        if len(self.hosts) != len(self.leaves):
            raise PlacementError(f"{len(self.hosts)} hosts but {len(self.leaves)} leaves")
        counts = {h: self.hosts.count(h) for h in set(self.hosts)}
        if max(counts.values(), default=0) > self.per_host:
            raise PlacementError("a host is given more than one rank" if self.per_host == 1 else
                                 f"a host is given more than {self.per_host} ranks")
        if self.policy not in POLICIES:
            raise PlacementError(f"unknown placement policy {self.policy!r}; known: {', '.join(POLICIES)}")

    @property
    def ranks(self) -> int:
        return len(self.hosts)

    def host_of(self, rank: int) -> str:
        return self.hosts[rank]

    def leaf_of(self, rank: int) -> str:
        return self.leaves[rank]

    def rank_of(self, host: str) -> int:
        try:
            return self.hosts.index(host)
        except ValueError:
            raise PlacementError(f"host {host!r} has no rank") from None

    def same_leaf(self, a: int, b: int) -> bool:
        return self.leaves[a] == self.leaves[b]

    def ranks_on_leaf(self, leaf: str) -> tuple[int, ...]:
        return tuple(r for r, lf in enumerate(self.leaves) if lf == leaf)

    def local_rank(self, rank: int) -> int:
        """The rank's index among its server's ranks (0 .. per_host - 1)."""
        return self.hosts[:rank].count(self.hosts[rank])

    def as_dict(self) -> dict[str, str]:
        """{rank as string: host} for manifests."""
        return {str(r): h for r, h in enumerate(self.hosts)}

    def cross_leaf_bytes(self, schedule: Schedule) -> int:
        """Payload bytes of ``schedule`` whose sender and receiver sit on different leaves (i.e. cross the spine)."""
        if schedule.ranks != self.ranks:
            raise PlacementError(f"schedule has {schedule.ranks} ranks, placement {self.ranks}")
        total = 0
        for p in schedule.programs:
            for st in p.steps:
                for s in st.sends:
                    if not self.same_leaf(p.rank, s.peer):
                        total += s.src.count * schedule.itemsize
        return total


def _hosts(hosts: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for i, item in enumerate(hosts):
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise PlacementError(f"hosts[{i}] must be a (host, leaf) pair, got {item!r}")
        h, lf = item
        if not isinstance(h, str) or not h or not isinstance(lf, str) or not lf:
            raise PlacementError(f"hosts[{i}]: host and leaf must be non-empty strings, got {item!r}")
        if h in seen:
            raise PlacementError(f"hosts[{i}]: host {h!r} listed twice")
        seen.add(h)
        out.append((h, lf))
    return out


def place(ranks: int, hosts: Sequence[tuple[str, str]], policy: str = "packed", seed: int = 0,
          per_host: int = 1, avoid: Iterable[str] = (), group: int = 1) -> Placement:
    """Place ``ranks`` ranks on distinct hosts from the ordered ``(host, leaf)`` list by ``policy``; with
    ``per_host`` > 1 the policy places ceil(ranks / per_host) servers and each server takes ``per_host``
    consecutive ranks (the last one the rest). ``avoid``: hosts, leaves and ``leaf-spine`` links not to use (module
    docstring); ``group``: the size of the blocks of consecutive ranks ``topo`` keeps inside a server or a leaf.

    Raises :class:`PlacementError` if there are more ranks than host slots, for an unknown policy, or for a
    malformed host list.
    """
    if isinstance(group, bool) or not isinstance(group, int) or group < 1:
        raise PlacementError(f"group must be an integer >= 1, got {group!r}")
    avoid = frozenset(avoid)
    if policy == "topo" or avoid:
        return _place_filtered(ranks, hosts, policy, seed, per_host, avoid, group)
    return _place(ranks, hosts, policy, seed, per_host)


def _place(ranks: int, hosts: Sequence[tuple[str, str]], policy: str, seed: int, per_host: int) -> Placement:
    """packed, spread, random over every host given (the policies as they were before ``avoid`` and ``topo``)."""
    if isinstance(per_host, bool) or not isinstance(per_host, int) or per_host < 1:
        raise PlacementError(f"per_host must be an integer >= 1, got {per_host!r}")
    if per_host > 1 and isinstance(ranks, int) and not isinstance(ranks, bool) and ranks >= 1:
        need = -(-ranks // per_host)
        if need > len(_hosts(hosts)):
            raise PlacementError(f"{ranks} ranks at {per_host} per host need {need} hosts; there are {len(hosts)}")
        servers = _place(need, hosts, policy, seed, 1)
        chosen = [h for h in servers.hosts for _ in range(per_host)][:ranks]
        leaf = dict(zip(servers.hosts, servers.leaves))
        return Placement(tuple(chosen), tuple(leaf[h] for h in chosen), policy, seed, per_host)
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise PlacementError(f"ranks must be an integer >= 1, got {ranks!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise PlacementError(f"seed must be an integer, got {seed!r}")
    if policy not in POLICIES:
        raise PlacementError(f"unknown placement policy {policy!r}; known: {', '.join(POLICIES)}")
    pool = _hosts(hosts)
    if ranks > len(pool):
        raise PlacementError(f"{ranks} ranks but only {len(pool)} hosts")
    by_leaf: dict[str, list[str]] = {}
    for h, lf in pool:
        by_leaf.setdefault(lf, []).append(h)
    leaf_of = dict(pool)
    if policy == "packed":
        order = [h for lf in by_leaf for h in by_leaf[lf]]
    elif policy == "spread":
        order = []
        depth = max(len(v) for v in by_leaf.values())
        for i in range(depth):
            order.extend(v[i] for v in by_leaf.values() if i < len(v))
    else:
        order = stable_shuffle(stable_rng(seed), [h for h, _ in pool])
    chosen = order[:ranks]
    return Placement(tuple(chosen), tuple(leaf_of[h] for h in chosen), policy, seed)


def link_leaves(names: Iterable[str], leaves: Iterable[str]) -> frozenset[str]:
    """The leaves among ``leaves`` that one of ``names`` names a fabric link of (``leaf1-spine2``: leaf1)."""
    known = set(leaves)
    return frozenset(part for n in names if "-" in n for part in n.split("-") if part in known)


def spine_crossings(leaves: Sequence[str]) -> int:
    """How many hops of the ring over ranks 0 .. n-1 (rank r sends to r + 1, the last to 0) change leaf."""
    n = len(leaves)
    return 0 if n < 2 else sum(leaves[r] != leaves[(r + 1) % n] for r in range(n))


def _usable(pool: list[tuple[str, str]], avoid: frozenset[str]) -> tuple[dict[str, list[str]], frozenset[str]]:
    """Hosts by leaf (in order) without the avoided hosts and leaves; and the leaves with an avoided link."""
    by_leaf: dict[str, list[str]] = {}
    for h, lf in pool:
        by_leaf.setdefault(lf, [])
        if h not in avoid and lf not in avoid:
            by_leaf[lf].append(h)
    return by_leaf, link_leaves(avoid, by_leaf)


def _short(ranks: int, per_host: int, usable: int, avoid: frozenset[str]) -> PlacementError:
    need = -(-ranks // per_host)
    what = f"{ranks} ranks" + (f" at {per_host} per host" if per_host > 1 else "")
    return PlacementError(f"{what} need {need} hosts; {usable} usable" + (
        f" (avoiding {', '.join(sorted(avoid))})" if avoid else ""))


def _place_filtered(ranks: int, hosts: Sequence[tuple[str, str]], policy: str, seed: int, per_host: int,
                    avoid: frozenset[str], group: int) -> Placement:
    if isinstance(per_host, bool) or not isinstance(per_host, int) or per_host < 1:
        raise PlacementError(f"per_host must be an integer >= 1, got {per_host!r}")
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise PlacementError(f"ranks must be an integer >= 1, got {ranks!r}")
    if policy not in POLICIES:
        raise PlacementError(f"unknown placement policy {policy!r}; known: {', '.join(POLICIES)}")
    pool = _hosts(hosts)
    by_leaf, bad_links = _usable(pool, avoid)
    if policy != "topo":
        kept = [(h, lf) for h, lf in pool if lf not in bad_links and h in by_leaf[lf]]
        if -(-ranks // per_host) > len(kept):
            raise _short(ranks, per_host, len(kept), avoid)
        p = _place(ranks, kept, policy, seed, per_host)
        return Placement(p.hosts, p.leaves, policy, seed, per_host)
    chosen = _topo(ranks, by_leaf, bad_links, per_host, group)
    if chosen is None:
        usable = sum(len(v) for lf, v in by_leaf.items() if lf not in bad_links)
        one = max((len(v) for v in by_leaf.values()), default=0)
        raise _short(ranks, per_host, max(usable, one), avoid)
    leaf_of = dict(pool)
    return Placement(tuple(chosen), tuple(leaf_of[h] for h in chosen), "topo", seed, per_host)


def _fit(ranks: int, hosts: list[str], per_host: int, group: int) -> int:
    """How many of ``ranks`` ranks one leaf with ``hosts`` takes as whole ``group`` blocks (all of them if it holds
    them all)."""
    cap = len(hosts) * per_host
    return ranks if ranks <= cap else cap // group * group


def _topo(ranks: int, by_leaf: dict[str, list[str]], bad_links: frozenset[str], per_host: int,
          group: int) -> list[str] | None:
    """Each rank's host by ``topo`` (module docstring), or None when the usable hosts cannot take the job."""
    slots = {lf: [h for h in hs for _ in range(per_host)] for lf, hs in by_leaf.items()}
    for lf in sorted(by_leaf, key=lambda x: x in bad_links):  # one leaf: clean leaves first, in order
        if len(slots[lf]) >= ranks:
            return slots[lf][:ranks]
    clean = [lf for lf in by_leaf if lf not in bad_links]
    for aligned in (True, False):  # whole groups per leaf; failing that, groups may straddle leaves
        take, left = {}, ranks
        for lf in sorted(clean, key=lambda x: -len(slots[x])):  # fewest leaves: the largest first
            if left <= 0:
                break
            n = min(left, _fit(left, by_leaf[lf], per_host, group) if aligned else len(slots[lf]))
            if n > 0:
                take[lf], left = n, left - n
        if left <= 0:
            return [h for lf in clean if lf in take for h in slots[lf][:take[lf]]]
    return None
