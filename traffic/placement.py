"""Rank -> host placement: which host runs which rank of a collective (one rank per host, or ``per_host`` ranks
per server: a server's ranks are consecutive and packed on it, the policy then places servers).

Input is the fabric's ordered list of ``(host, leaf)`` pairs.  Policies:

* ``packed``  -- fill leaf by leaf (leaves in order of first appearance, hosts in list order): neighbouring
  ranks share a leaf, so a ring crosses the spine as rarely as possible;
* ``spread``  -- round-robin over the leaves (rank r on leaf r mod L as long as that leaf has hosts left):
  neighbouring ranks sit on different leaves, maximising spine traffic;
* ``random``  -- a seeded shuffle of all hosts (identical across Python/NumPy versions), first ``ranks`` taken.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .schedule import Schedule, stable_rng, stable_shuffle

__all__ = ["PlacementError", "Placement", "POLICIES", "place"]

POLICIES = ("packed", "spread", "random")


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
          per_host: int = 1) -> Placement:
    """Place ``ranks`` ranks on distinct hosts from the ordered ``(host, leaf)`` list by ``policy``; with
    ``per_host`` > 1 the policy places ceil(ranks / per_host) servers and each server takes ``per_host``
    consecutive ranks (the last one the rest).

    Raises :class:`PlacementError` if there are more ranks than host slots, for an unknown policy, or for a
    malformed host list.
    """
    if isinstance(per_host, bool) or not isinstance(per_host, int) or per_host < 1:
        raise PlacementError(f"per_host must be an integer >= 1, got {per_host!r}")
    if per_host > 1 and isinstance(ranks, int) and not isinstance(ranks, bool) and ranks >= 1:
        need = -(-ranks // per_host)
        if need > len(_hosts(hosts)):
            raise PlacementError(f"{ranks} ranks at {per_host} per host need {need} hosts; there are {len(hosts)}")
        servers = place(need, hosts, policy, seed)
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
