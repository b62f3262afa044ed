"""The burn-in battery's judgement (``testbed burnin``, docs/operations.md): which measured point is an outlier
against its peers, which falls short of what the fabric was configured to give, which host's configuration
differs from the majority, and what that says about each host and link. Pure logic on numbers; the battery
(testbed.commands.burnin) measures them on a live fabric.

**The outlier rule.** Each point (a host's rate, a path's rate, a host's compute time, ...) is compared with its
*peers*: the other points of the same metric (leave-one-out, so the culprit does not pull its own reference). With
``m`` the peers' median and ``MAD`` their median absolute deviation, a point is an outlier when it is worse than
``m`` by more than ``max(K_MAD x 1.4826 x MAD, rel_floor x m, abs_floor)``: 1.4826 x MAD estimates a normal
spread's sigma without being moved by the outlier itself, ``K_MAD = 3`` is the usual three-sigma line (a healthy
point crosses it about 0.3% of the time), and the floor keeps a tight healthy spread (MAD near 0: every host
shaped by the same HTB rate) from flagging a 1% difference. Only the bad side counts: a rate below its peers, a
time, latency or loss above them. A rate is also checked against the configured one: below ``expected_fraction``
of it is flagged whatever the peers say (so a fabric where everything is slow is not called healthy).

**Configuration drift.** A host whose MTU, ECN setting or congestion control differs from the majority's value is
named directly (no statistics: a setting is the same or it is not).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from statistics import median

#: how many robust sigmas (1.4826 x MAD) from the peers' median a point must be to be flagged
K_MAD = 3.0
#: MAD -> sigma of a normal distribution
MAD_SIGMA = 1.4826
VERDICT_OK, VERDICT_OUTLIER, VERDICT_LOW, VERDICT_DRIFT = "ok", "outlier", "below configured", "drift"


@dataclass(frozen=True)
class Rule:
    """How one metric is judged: ``worse`` is ``low`` (a rate) or ``high`` (a time, a loss); the floors keep a tight
    healthy spread from flagging; ``expected_fraction``: flag a point below this fraction of its configured value."""

    unit: str
    worse: str
    rel_floor: float
    abs_floor: float = 0.0
    expected_fraction: float | None = None


#: the metrics the battery judges. Floors chosen from the clean runs' spread (docs/operations.md): rates are shaped
#: by HTB and agree within a few percent, times on a shared 2-CPU machine wander by tens of percent.
RULES: dict[str, Rule] = {
    "tx_mbps": Rule("Mbit/s", "low", 0.15, 0.0, 0.7),
    "path_mbps": Rule("Mbit/s", "low", 0.15, 0.0, 0.7),
    "rtt_ms_p50": Rule("ms", "high", 1.0, 0.5),
    # p99 of 40 echoes is about their maximum, so one scheduling stall decides it: a clean CI battery had 2.08 ms
    # against its peers' 0.04; 5 ms sits above a stall and below a jittery link's tail
    "rtt_ms_p99": Rule("ms", "high", 2.0, 5.0),
    "retrans_pct": Rule("%", "high", 0.0, 1.0),
    "path_retrans_pct": Rule("%", "high", 0.0, 1.0),
    "cpu_task_ms": Rule("ms", "high", 0.6, 10.0),
    "cct_vs_bound": Rule("x", "high", 0.6, 0.0),
}
#: host settings checked for drift from the majority
CONFIG_METRICS = ("mtu_bytes", "tcp_ecn", "congestion_control")


@dataclass
class Check:
    """One row of burnin.csv: a measured point and its verdict (``ok``, ``outlier``, ``below configured``,
    ``drift``), with the peers' median and MAD it was judged against, the line it crossed (``threshold``) and the
    configured value (``expected``) where there is one."""

    target: str
    metric: str
    value: float | str
    peers_median: float | str | None = None
    mad: float | None = None
    threshold: float | None = None
    expected: float | None = None
    verdict: str = VERDICT_OK
    unit: str = ""
    reason: str = ""
    kind: str = "host"  # host | path | job

    @property
    def flagged(self) -> bool:
        return self.verdict != VERDICT_OK

    def row(self) -> dict:
        return asdict(self)


COLUMNS = tuple(f.name for f in Check.__dataclass_fields__.values())


def mad(values: list[float]) -> float:
    """Median absolute deviation (0 for fewer than one value)."""
    if not values:
        return 0.0
    m = median(values)
    return float(median(abs(v - m) for v in values))


def median_or_nan(xs: list[float]) -> float:
    """The median of ``xs`` (NaN for none: not measured)."""
    return float(median(xs)) if xs else float("nan")


def p99_or_nan(xs: list[float]) -> float:
    """The nearest-rank 99th percentile of ``xs`` (NaN for none): of 40 echoes, their maximum."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    return float(s[min(len(s) - 1, max(0, -(-99 * len(s) // 100) - 1))])


def margin(peers: list[float], rule: Rule) -> tuple[float, float, float]:
    """(peers' median, MAD, how far past the median a point may lie) for ``rule``."""
    m = float(median(peers))
    d = mad(peers)
    return m, d, max(K_MAD * MAD_SIGMA * d, rule.rel_floor * abs(m), rule.abs_floor)


def _fmt(v: float) -> str:
    return f"{v:.3g}"


def judge(metric: str, values: dict[str, float], expected: dict[str, float] | None = None,
          kind: str = "host") -> list[Check]:
    """Every point of ``metric`` (target -> value; NaN: not measured) against its peers (leave-one-out) and, for
    rates, against ``expected`` (target -> configured value)."""
    rule = RULES[metric]
    out = []
    for target, v in values.items():
        c = Check(target, metric, v, unit=rule.unit, kind=kind)
        if v is None or not math.isfinite(v):
            c.verdict, c.reason = VERDICT_OUTLIER, f"{metric} not measured"
            out.append(c)
            continue
        peers = [p for t, p in values.items() if t != target and p is not None and math.isfinite(p)]
        if peers:
            m, d, room = margin(peers, rule)
            c.peers_median, c.mad = m, d
            c.threshold = m - room if rule.worse == "low" else m + room
            if (v < c.threshold) if rule.worse == "low" else (v > c.threshold):
                c.verdict = VERDICT_OUTLIER
                c.reason = (f"{metric} {_fmt(v)} {rule.unit} {'below' if rule.worse == 'low' else 'above'} its peers' "
                            f"median {_fmt(m)} by more than {_fmt(room)} (MAD {_fmt(d)})")
        exp = (expected or {}).get(target)
        if exp is not None and rule.expected_fraction is not None:
            c.expected = exp
            if v < rule.expected_fraction * exp:
                c.verdict = VERDICT_LOW if c.verdict == VERDICT_OK else c.verdict
                c.reason = "; ".join(x for x in (c.reason, f"{metric} {_fmt(v)} {rule.unit} is "
                                                 f"{v / exp:.0%} of the configured {_fmt(exp)}") if x)
        out.append(c)
    return out


def drift(metric: str, values: dict[str, str]) -> list[Check]:
    """Each host's setting against the majority's: a host with another value is ``drift``; without a strict
    majority every host is (the fabric has no configuration to agree on)."""
    counts: dict[str, int] = {}
    for v in values.values():
        counts[v] = counts.get(v, 0) + 1
    top, n = max(counts.items(), key=lambda kv: kv[1]) if counts else ("", 0)
    majority = n * 2 > len(values)
    out = []
    for target, v in values.items():
        c = Check(target, metric, v, peers_median=top if majority else "no majority")
        if not majority:
            c.verdict, c.reason = VERDICT_DRIFT, f"{metric}: the hosts do not agree ({counts})"
        elif v != top:
            c.verdict, c.reason = VERDICT_DRIFT, f"{metric} is {v} where {n} of {len(values)} hosts have {top}"
        out.append(c)
    return out


@dataclass
class PathInfo:
    """A pinned leaf -> spine -> leaf path: its two fabric links and, per fabric port it crossed, the packets that
    port dropped while the path was measured (the kernel's qdisc counters)."""

    links: tuple[str, ...]
    port_drops: dict[str, int] = field(default_factory=dict)
    port_link: dict[str, str] = field(default_factory=dict)
    port_backlog_bytes: dict[str, float] = field(default_factory=dict)  # mean queue while measured


#: a port whose mean backlog reached this while its path was measured holds a standing queue (two full packets)
BACKLOG_EVIDENCE_BYTES = 3000.0


def blamed_links(path: PathInfo) -> tuple[list[str], str]:
    """The links a flagged path puts in doubt: the one whose port dropped the most (a slow port is where a
    loss-based sender's queue overflows), else the one whose port held the largest standing queue (a delay-based
    sender such as BBR queues at a slow port but drops little), else both; with the evidence."""
    drops = {p: d for p, d in path.port_drops.items() if d > 0}
    if drops:
        port = max(drops, key=drops.get)
        return [path.port_link[port]], f"port {port} dropped {drops[port]} packets"
    queued = {p: b for p, b in path.port_backlog_bytes.items() if b >= BACKLOG_EVIDENCE_BYTES}
    if queued:
        port = max(queued, key=queued.get)
        return [path.port_link[port]], f"port {port} held a {queued[port]:.0f}-byte queue on average"
    return list(path.links), "no port dropped or queued: either link"


def health(checks: list[Check], hosts: list[str], links: list[str], paths: dict[str, PathInfo]) -> dict:
    """health.json: per host and per fabric link ``{"ok": bool, "reasons": [...]}`` (docs/operations.md)."""
    out_hosts: dict[str, dict] = {h: {"ok": True, "reasons": []} for h in hosts}
    out_links: dict[str, dict] = {name: {"ok": True, "reasons": []} for name in links}
    for c in checks:
        if not c.flagged:
            continue
        if c.kind == "host" and c.target in out_hosts:
            out_hosts[c.target]["ok"] = False
            out_hosts[c.target]["reasons"].append(c.reason)
        elif c.kind == "path" and c.target in paths:
            names, why = blamed_links(paths[c.target])
            for name in names:
                out_links[name]["ok"] = False
                out_links[name]["reasons"].append(f"{c.target}: {c.reason} ({why})")
    healthy = all(v["ok"] for v in out_hosts.values()) and all(v["ok"] for v in out_links.values()) \
        and not any(c.flagged for c in checks)
    return {"format": "testbed-burnin-health/1", "healthy": healthy, "hosts": out_hosts, "links": out_links}


def summary_numbers(checks: list[Check], health_doc: dict) -> dict:
    """The battery as summary.json numbers (what a lab statement grades): ``burnin_healthy`` (1/0),
    ``burnin_flagged`` (checks not ok), ``hosts_flagged`` / ``links_flagged`` (not ok in health.json), the pinned
    paths' rates (``path_mbps_min``, ``path_mbps_median``; ``path_fraction_min``: the slowest path over the paths'
    median; ``path_vs_configured_min``: over its configured rate) and the all-reduces' CCT over their alpha-beta
    bound (``fabric_cct_vs_bound``: the ring across the fabric; ``leaf_cct_vs_bound_max``: the worst leaf's)."""
    def values(metric: str, kind: str) -> dict[str, float]:
        out = {}
        for c in checks:
            if c.metric == metric and c.kind == kind and isinstance(c.value, (int, float)) and c.value == c.value:
                out[c.target] = float(c.value)
        return out

    paths = {c.target: c for c in checks if c.metric == "path_mbps" and isinstance(c.value, (int, float))}
    rates = sorted(float(c.value) for c in paths.values())
    jobs = values("cct_vs_bound", "job")
    leaf_jobs = [v for k, v in jobs.items() if k != "allreduce fabric"]
    out = {"burnin_healthy": int(bool(health_doc["healthy"])), "burnin_flagged": sum(c.flagged for c in checks),
           "hosts_flagged": sum(not v["ok"] for v in health_doc["hosts"].values()),
           "links_flagged": sum(not v["ok"] for v in health_doc["links"].values())}
    if rates:
        med = float(median(rates))
        out.update(path_mbps_min=rates[0], path_mbps_median=med, path_fraction_min=rates[0] / med if med else 0.0)
        fractions = [float(c.value) / c.expected for c in paths.values() if c.expected]
        if fractions:
            out["path_vs_configured_min"] = min(fractions)
    if "allreduce fabric" in jobs:
        out["fabric_cct_vs_bound"] = jobs["allreduce fabric"]
    if leaf_jobs:
        out["leaf_cct_vs_bound_max"] = max(leaf_jobs)
    return out


def culprits(checks: list[Check], health_doc: dict) -> list[str]:
    """One line per named culprit: a host or link that is not ok, or a job check that failed, with its evidence."""
    lines = [f"host {h}: " + "; ".join(v["reasons"]) for h, v in health_doc["hosts"].items() if not v["ok"]]
    lines += [f"link {n}: " + "; ".join(v["reasons"]) for n, v in health_doc["links"].items() if not v["ok"]]
    lines += [f"{c.target}: {c.reason}" for c in checks if c.flagged and c.kind == "job"]
    return lines


def verdict_md(checks: list[Check], health_doc: dict, facts: list[str]) -> str:
    """burnin.md: the verdict first ("healthy" or the culprits with their evidence), then what was measured."""
    named = culprits(checks, health_doc)
    head = ["# Burn-in", "", "**Verdict: healthy**" if not named else f"**Verdict: {len(named)} culprit(s)**", ""]
    head += [f"- {line}" for line in named]
    body = ["", "## What was measured", "", *[f"- {f}" for f in facts], "",
            f"Rule: a point is an outlier when it is worse than its peers' median by more than max({K_MAD:g} x "
            f"{MAD_SIGMA} x MAD, a floor); rates also below a fraction of the configured rate; settings against "
            "the majority (analysis/burnin.py).", "",
            "| target | metric | value | peers' median | MAD | verdict |", "|---|---|---|---|---|---|"]
    for c in checks:
        val = _fmt(c.value) if isinstance(c.value, float) else str(c.value)
        med = _fmt(c.peers_median) if isinstance(c.peers_median, float) else str(c.peers_median or "")
        body.append(f"| {c.target} | {c.metric} | {val} | {med} | {'' if c.mad is None else _fmt(c.mad)} | "
                    f"{c.verdict} |")
    return "\n".join(head + body) + "\n"


__all__ = [
    "BACKLOG_EVIDENCE_BYTES", "COLUMNS", "CONFIG_METRICS", "K_MAD", "MAD_SIGMA", "RULES", "Check", "PathInfo",
    "Rule", "blamed_links", "culprits", "drift", "health", "judge", "mad", "margin", "summary_numbers", "verdict_md"
]
