"""A picture of the fabric: every node and link of a run, each egress port coloured by what its queue did.

The fabric is read from the run directory alone (``ports.csv``: every shaped egress port as built, with its peer and
tier), so any topology the testbed built draws the same way: leaf-spine, dumbbell or a graph from a Mininet ``Topo``.
A port is one egress queue of a veth end (an HTB shaper with its qdisc below it): it is drawn as a marker on the
link it sends into, a quarter of the way from its node, and coloured by ``queues.csv``:

* ``backlog``: the peak backlog in bytes (``backlog_bytes`` summed over the port's classes at each sample, then the
  maximum; in packets when every queue of the run is sized in packets). Sampled, so a lower bound on the true peak.
* ``packets``: the same in packets (``backlog_packets``).
* ``drops`` / ``marks``: the qdisc's drop / ECN-mark counter's increase over the run (summed over classes).

Ports the sampler did not watch are drawn hollow and grey ("not sampled"), never as zero.

Layout (deterministic): hosts at the bottom, then every other node in tiers by its hop distance from the nearest
host (leaves 1, spines 2, ...). Hosts sit in the order of the edge node they hang from; a node above sits over the
mean position of its neighbours below unless that would crowd its tier, then the tier is spread evenly.

    from analysis.topopicture import draw_topology
    draw_topology("results/incast-...", "topology.png")      # Path, or None when the run cannot be drawn
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.text import Text

from .load import Run, RunDirError, load_run
from .metrics.queues import port_counter_deltas
from .names import natural_key

__all__ = ["BY", "NothingToDraw", "TopologyPicture", "Layout", "draw", "draw_topology", "figure", "hottest",
           "layout", "picture", "port_values"]

#: what a port can be coloured by (the command's --by)
BY = ("backlog", "packets", "drops", "marks")
#: the colour map of the ports: pale (idle) to dark red (hottest)
PORT_CMAP = "YlOrRd"
#: how many of the hottest ports are labelled with their value
HOTTEST_LABELLED = 5
#: above this many hosts the fabric is "large": small markers, no host names
LARGE_HOSTS = 32
#: where a port sits on its link, as a fraction of the way from its node to the peer
PORT_AT = 0.25


class NothingToDraw(ValueError):
    """The run directory lacks what the picture needs (ports.csv, queue samples); the message is one line."""


@dataclass(frozen=True)
class Layout:
    """Where each node goes: ``tier`` (0 = hosts, then hop distance from the nearest host) and ``xy`` (x in [0, 1],
    y = tier); ``order`` lists each tier's nodes left to right; ``links`` the node pairs joined by a link."""

    tier: dict[str, int]
    xy: dict[str, tuple[float, float]]
    order: list[list[str]]
    links: list[tuple[str, str]]
    hosts: list[str]


@dataclass(frozen=True)
class TopologyPicture:
    """What :func:`figure` draws: the layout, one row per port (``node, port, peer, tier, value, buffer``; value nan
    = not sampled, buffer nan = not known, both in ``unit``), what the value is (``by``, ``unit``) and the title."""

    run_name: str
    layout: Layout
    ports: pd.DataFrame
    by: str
    unit: str
    title: str


def _hosts(ports: pd.DataFrame) -> list[str]:
    """Nodes that are hosts: those with a ``host_nic`` egress; a topology whose tiers do not say (a graph from a
    Mininet Topo names every tier ``port``) has its hosts as the nodes with one port (hosts attach by one link)."""
    hosts = set(ports.loc[ports["tier"] == "host_nic", "node"])
    if not hosts:
        degree = ports.groupby("node").size()
        hosts = set(degree[degree == 1].index)
    return sorted(hosts, key=natural_key)


def _spread(nodes: list[str], bary: dict[str, float]) -> dict[str, float]:
    """x of each node of a tier: at its barycentre when the tier is not crowded that way, else evenly spaced."""
    n = len(nodes)
    even = {v: (i + 0.5) / n for i, v in enumerate(nodes)}
    xs = [bary.get(v, math.nan) for v in nodes]
    if any(math.isnan(x) for x in xs) or (n > 1 and min(np.diff(xs)) < 0.6 / n):
        return even
    return dict(zip(nodes, xs))


def layout(ports: pd.DataFrame) -> Layout:
    """The tiered layout of the fabric ``ports.csv`` describes (see the module docstring)."""
    nbrs: dict[str, set[str]] = {}
    for node, peer in zip(ports["node"], ports["peer"]):
        nbrs.setdefault(node, set()).add(peer)
        nbrs.setdefault(peer, set()).add(node)
    hosts = _hosts(ports)
    if not hosts:
        raise NothingToDraw("ports.csv names no host (no host_nic port and no node with a single port)")
    tier = {h: 0 for h in hosts}
    todo = deque(hosts)
    while todo:  # breadth-first from every host at once: a node's tier is its distance to the nearest host
        v = todo.popleft()
        for w in sorted(nbrs[v], key=natural_key):
            if w not in tier:
                tier[w] = tier[v] + 1
                todo.append(w)
    top = max(tier.values())
    for v in sorted(nbrs, key=natural_key):  # not connected to any host: one tier above everything
        tier.setdefault(v, top + 1)
    ntiers = max(tier.values()) + 1
    members = [sorted((v for v in tier if tier[v] == t), key=natural_key) for t in range(ntiers)]
    x: dict[str, float] = {}
    if ntiers > 1:
        edge = {v: i for i, v in enumerate(members[1])}
        members[0].sort(key=lambda h: (min((edge[w] for w in nbrs[h] if w in edge), default=len(edge)), natural_key(h)))
    x.update(_spread(members[0], {}))
    for t in range(1, ntiers):
        bary = {v: float(np.mean([x[w] for w in nbrs[v] if tier[w] == t - 1]))
                for v in members[t] if any(tier[w] == t - 1 for w in nbrs[v])}
        members[t].sort(key=lambda v: (bary.get(v, 2.0), natural_key(v)))
        x.update(_spread(members[t], bary))
    links = sorted({tuple(sorted((a, b), key=natural_key)) for a, b in zip(ports["node"], ports["peer"])},
                   key=lambda ab: (natural_key(ab[0]), natural_key(ab[1])))
    return Layout(tier=tier, xy={v: (x[v], float(tier[v])) for v in tier}, order=members,
                  links=[(a, b) for a, b in links], hosts=members[0])


def _sized_in_packets(manifest: dict) -> bool:
    """Every tier queue of the run is sized in packets (pfifo): its lesson is in packets."""
    queues = (manifest.get("topology") or {}).get("queues")
    if not isinstance(queues, dict) or not queues:
        return False
    return all(isinstance(q, dict) and q.get("buffer_packets") and not q.get("buffer_bytes") for q in queues.values())


def _buffer_sizes(manifest: dict, ports: pd.DataFrame, unit: str) -> list[float]:
    """Per row of ``ports``: its queue's buffer in ``unit`` (``buffer_bytes`` / ``buffer_packets``) from the
    manifest's topology (the tier's queue, or a per-port override's), nan where it does not say (a graph topology,
    or classes, whose queues split a port)."""
    topo = manifest.get("topology") or {}
    queues = topo.get("queues")
    if not isinstance(queues, dict) or topo.get("classes"):
        return [math.nan] * len(ports)
    own = {}
    for o in topo.get("ports") or []:
        if isinstance(o, dict) and isinstance(o.get("queue"), dict) and ":" in str(o.get("port", "")):
            own[tuple(str(o["port"]).split(":", 1))] = o["queue"]
    out = []
    for r in ports.itertuples():
        q = own.get((r.node, r.port), queues.get(r.tier))
        size = q.get(unit) if isinstance(q, dict) else None
        out.append(float(size) if isinstance(size, (int, float)) and size > 0 else math.nan)
    return out


def port_values(queues: pd.DataFrame, ports: pd.DataFrame, by: str) -> pd.DataFrame:
    """One row per port of ``ports`` (``node, port, peer, tier, value``): its peak backlog (``backlog`` = bytes,
    ``packets``) or counter increase (``drops``, ``marks``), summed over classes; nan where queues.csv has no
    sample of the port."""
    if by not in BY:
        raise ValueError(f"by must be one of {', '.join(BY)} (got {by!r})")
    out = ports[["node", "port", "peer", "tier"]].drop_duplicates(["node", "port"]).reset_index(drop=True)
    if queues.empty:
        return out.assign(value=np.nan)
    if by in ("backlog", "packets"):
        col = "backlog_bytes" if by == "backlog" else "backlog_packets"
        per_t = queues.groupby(["node", "port", "t_s"], sort=True)[col].sum()
        vals = per_t.groupby(level=["node", "port"]).max().astype(float).rename("value").reset_index()
    else:
        vals = port_counter_deltas(queues)[["node", "port", by]].rename(columns={by: "value"})
    return out.merge(vals, on=["node", "port"], how="left")


def hottest(values: pd.DataFrame, k: int = HOTTEST_LABELLED) -> pd.DataFrame:
    """The ``k`` ports with the largest value above zero, largest first (ties: natural order of node, port)."""
    v = values[values["value"] > 0]
    keys = [(-float(r.value), natural_key(r.node), natural_key(r.port)) for r in v.itertuples()]
    return v.iloc[sorted(range(len(v)), key=keys.__getitem__)[:k]]


_LABELS = {"backlog": "peak backlog", "packets": "peak backlog", "drops": "drops", "marks": "ECN marks"}


def picture(run: Run, by: str = "backlog") -> TopologyPicture:
    """The picture of a loaded run; :class:`NothingToDraw` when it has no ports.csv or no queue samples."""
    if run.ports.empty:
        raise NothingToDraw(f"{run.name}: no ports.csv (the fabric as built): cannot draw it")
    if run.queues.empty:
        raise NothingToDraw(f"{run.name}: no queue samples in queues.csv: nothing to colour the ports by")
    if by == "backlog" and _sized_in_packets(run.manifest):
        by = "packets"
    values = port_values(run.queues, run.ports, by)
    values["buffer"] = (_buffer_sizes(run.manifest, values, f"buffer_{'packets' if by == 'packets' else 'bytes'}")
                        if by in ("backlog", "packets") else math.nan)
    unit = {"backlog": "KiB", "packets": "packets", "drops": "packets dropped", "marks": "packets marked"}[by]
    if by == "backlog":
        values["value"] = values["value"] / 1024.0
        values["buffer"] = values["buffer"] / 1024.0
    what = {"backlog": "peak backlog (KiB, summed over classes; sampled: a lower bound)",
            "packets": "peak backlog (packets, summed over classes; sampled: a lower bound)",
            "drops": "packets dropped over the run (qdisc counter)",
            "marks": "packets ECN-marked over the run (qdisc counter)"}[by]
    interval = run.summary.get("sampler_interval_ms")
    every = f", sampled every {interval:.1f} ms" if isinstance(interval, (int, float)) and interval > 0 else ""
    title = f"{run.name}: each egress port coloured by its {what}{every}"
    return TopologyPicture(run.name, layout(run.ports), values, by, unit, title)


def _fmt(value: float, by: str, buffer: float = math.nan) -> str:
    """A hot port's label value: ``59 KiB (92% of buffer)``, ``40 drops``."""
    if by == "backlog":
        text = f"{value:.1f} KiB" if value < 10 else f"{value:.0f} KiB"
    else:
        text = f"{value:.0f} {'pkts' if by == 'packets' else by}"
    return text + (f" ({100 * value / buffer:.0f}% of buffer)" if buffer > 0 else "")


def _port_xy(lay: Layout, node: str, peer: str, nth: int = 0) -> tuple[float, float]:
    """Where a port is drawn: on its link near its node; the ``nth`` of parallel links' ports a little further."""
    (x0, y0), (x1, y1) = lay.xy[node], lay.xy[peer]
    f = PORT_AT + 0.08 * nth
    return x0 + f * (x1 - x0), y0 + f * (y1 - y0)


def _draw_nodes(ax, lay: Layout, large: bool, label_hosts: set[str]) -> None:
    for t, members in enumerate(lay.order):
        xs = [lay.xy[v][0] for v in members]
        if t == 0:
            ax.scatter(xs, [0.0] * len(xs), marker="s", s=18 if large else 60, color="0.35", zorder=3)
            for v in members:
                if not large or v in label_hosts:
                    ax.text(lay.xy[v][0], -0.12, v, ha="center", va="top", fontsize=7 if large else 8,
                            rotation=90 if large else 0)
        else:
            ax.scatter(xs, [float(t)] * len(xs), marker="o", s=60 if large else 260, color="0.85",
                       edgecolors="0.3", zorder=3)
            for v in members:
                ax.text(lay.xy[v][0], t + 0.13, v, ha="center", va="bottom", fontsize=8 if large else 9,
                        fontweight="bold")
        name = "hosts" if t == 0 else f"tier {t}"
        ax.text(-0.035, float(t), f"{name}\n({len(members)})", ha="right", va="center", fontsize=8, color="0.3")


#: where a hot port's label may go, in points from the port, tried in turn until it overlaps no other label
_LABEL_OFFSETS = ((12, 8), (12, -16), (12, 24), (12, -32), (12, 40), (12, -48), (12, 56))


def _label_hottest(fig: Figure, ax, pic: TopologyPicture, hot: pd.DataFrame, nth: pd.Series) -> None:
    """Label the hottest ports ``node→peer: value``, each at the first offset where it overlaps no label placed
    before it (hottest first); ports on the right get labels opening leftwards, clear of the colour bar."""
    renderer = fig.canvas.get_renderer()
    placed = []
    for r in hot.itertuples():
        px, py = _port_xy(pic.layout, r.node, r.peer, int(nth[r.Index]))
        side = -1 if px > 0.6 else 1
        ann = ax.annotate(f"{r.node}\u2192{r.peer}: {_fmt(r.value, pic.by, getattr(r, 'buffer', math.nan))}",
                          (px, py), xytext=(side * 12, 8), ha="left" if side > 0 else "right",
                          textcoords="offset points", fontsize=8, zorder=6,
                          bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "0.5", "alpha": 0.9},
                          arrowprops={"arrowstyle": "-", "color": "0.4", "linewidth": 0.6})
        for dx, dy in _LABEL_OFFSETS:
            ann.xyann = (side * dx, dy)
            ann.update_positions(renderer)
            box = Text.get_window_extent(ann, renderer).padded(3)  # the text alone, not the line to its port
            if not any(box.overlaps(b) for b in placed):
                break
        placed.append(box)


def figure(pic: TopologyPicture) -> Figure:
    """The matplotlib Figure (Agg canvas, no pyplot) of a :class:`TopologyPicture`: links grey, nodes named, ports
    coloured (gid ``ports`` on their collection), a colour bar and a legend outside the data, the hottest labelled."""
    lay, vals = pic.layout, pic.ports
    large = len(lay.hosts) > LARGE_HOSTS
    ntiers = len(lay.order)
    fig = Figure(figsize=(min(max(7.0, 0.22 * len(lay.hosts) + 3), 22.0), 1.5 * ntiers + 2.2), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for a, b in lay.links:
        (xa, ya), (xb, yb) = lay.xy[a], lay.xy[b]
        ax.plot([xa, xb], [ya, yb], color="0.75", linewidth=0.6 if large else 1.0, zorder=1)
    hot = hottest(vals)
    _draw_nodes(ax, lay, large, set(hot["node"]) | set(hot["peer"]))
    nth = vals.groupby(["node", "peer"], sort=False).cumcount()  # parallel links: their ports side by side
    xy = np.array([_port_xy(lay, r.node, r.peer, int(nth[r.Index])) for r in vals.itertuples()]).reshape(-1, 2)
    seen = vals["value"].notna().to_numpy()
    vmax = float(vals["value"].max()) if seen.any() and vals["value"].max() > 0 else 1.0
    norm, cmap = Normalize(vmin=0.0, vmax=vmax), colormaps[PORT_CMAP]
    size = 16 if large else 70
    ax.scatter(xy[~seen, 0], xy[~seen, 1], s=size, facecolors="white", edgecolors="0.6", zorder=4)
    sc = ax.scatter(xy[seen, 0], xy[seen, 1], c=vals["value"].to_numpy()[seen], cmap=cmap, norm=norm, s=size,
                    edgecolors="black", linewidths=0.5, zorder=5, gid="ports")
    bar = fig.colorbar(sc, ax=ax, fraction=0.03, pad=0.02)
    bar.set_label(f"{_LABELS[pic.by]} ({pic.unit})")
    ax.set_xlim(-0.1, 1.04)
    ax.set_ylim(-0.7 if large else -0.45, ntiers - 0.55)
    ax.axis("off")
    ax.set_title(pic.title, fontsize=10, wrap=True)
    handles = [Line2D([], [], marker="o", ls="", mfc=cmap(0.7), mec="black", label="egress port (on the link it "
                      "sends into, next to its node)"),
               Line2D([], [], marker="o", ls="", mfc="white", mec="0.6", label="port not sampled")]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.02), ncol=2, fontsize=8, frameon=False)
    fig.tight_layout()
    _label_hottest(fig, ax, pic, hot, nth)
    return fig


def draw(run_dir: str | Path | Run, path: str | Path, by: str = "backlog") -> Path:
    """Load ``run_dir`` (or take a loaded :class:`~analysis.load.Run`) and save its picture to ``path`` (format from
    the suffix: png, svg, pdf). Raises :class:`NothingToDraw` or :class:`~analysis.load.RunDirError` (one-line
    messages) before writing anything."""
    pic = picture(run_dir if isinstance(run_dir, Run) else load_run(run_dir), by)
    fig = figure(pic)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


def draw_topology(run_dir: str | Path | Run, path: str | Path, by: str = "backlog") -> Path | None:
    """For the report: the picture saved to ``path``, or None when the run cannot be drawn (no ports.csv, no queue
    samples, an unreadable run directory)."""
    try:
        return draw(run_dir, path, by)
    except (NothingToDraw, RunDirError):
        return None
