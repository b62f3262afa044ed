"""Faults on a timeline: what they are, how they are written, and how each is checked against a topology before
anything is built. Pure logic; testbed.faults.timeline plays them on a live fabric.

Written the same way on the CLI (``testbed run NAME --fault SPEC``, repeatable, or ``--faults FILE`` with one SPEC
per line) and in a script (``lab.at(2.0, "link-down leaf1-spine1 for_s=0.5")`` or
``lab.at(2.0, link_down("leaf1-spine1", for_s=0.5))``)::

    KIND TARGET [key=value ...]          times are seconds from the workload's start, or, with at_iteration=K,
                                         from the start of the collective's measured iteration K (0 = the first;
                                         warm-up iterations are negative, as in ops.csv)

    link-down  LINK  at_s=T [for_s=D] [detect_ms=M]    the link stops carrying frames (both directions) at T, for D
                                                        seconds (default: for good); routing withdraws it M ms
                                                        after it died (BFD-like detection, default 50) and takes
                                                        it back M ms after it came back
    flap       LINK  at_s=T down_s=D up_s=U count=N [detect_ms=M]
                                                        N times: down for D, then up for U
    slow-port  PORT  at_s=T fraction=F [for_s=D]       the egress port's rate cut to F (0 < F <= 1) of its rate:
                                                        a slow link or a slow-draining switch port
    netem      PORT  at_s=T [for_s=D] [loss_percent=P] [delay_ms=X] [jitter_ms=J] [corrupt_percent=C]
                     [ge_p_percent=P ge_r_percent=R [ge_bad_loss_percent=B] [ge_good_loss_percent=G]]
                                                        loss / delay / jitter / corruption of what leaves PORT
                                                        (netem on the far end's ingress; the lab VM has netem);
                                                        ge_*: bursty loss, netem's Gilbert-Elliott model: per
                                                        packet good -> bad with P %, bad -> good with R %, loss
                                                        B % in the bad state (default 100), G % in the good (0)
    pause-storm PORT at_s=T [for_s=D]                  the port's link peer keeps sending PFC XOFF (a stuck
                                                        receiver): the port's lossless classes stay paused, and
                                                        the pause spreads upstream (needs PFC running; the PFC
                                                        watchdog, when on, releases it)
    slow-host  HOST  at_s=T cpu_fraction=F [for_s=D] [period_ms=P]
                                                        a straggler: the host's processes get at most F of one CPU
                                                        per period (CFS bandwidth control, default period 100 ms)
    host-config HOST [cc=NAME] [ecn=0|1] [at_s=T] [for_s=D] [mtu_bytes=M] [rto_min_ms=R]
                                                        a host that behaves differently: its own congestion control
                                                        and ECN setting (fixed when a connection opens, so they hold
                                                        for the whole run: no at_s/for_s with them), a smaller MTU
                                                        on its link, an older RTOmin on its routes (from T, for D)

LINK is ``leaf1-spine1`` (the two nodes; when they share several links, ``leaf1:spine1-spine1:leaf1``). PORT is
``node:ifname``, an egress port of the fabric (``spine1:leaf2``: spine1's port towards leaf2). HOST is a host's
name (``h3``). Values are numbers, except ``cc`` (a congestion control's name). Anything wrong is a
:class:`~testbed.errors.UsageError` with one line, before a namespace exists.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from testbed.errors import UsageError
from testbed.pfc.queues import lossless_classes

DEFAULT_DETECT_MS = 50.0
MAX_FLAPS = 1000
#: netem's Gilbert-Elliott loss model (bursty loss)
GE_KEYS = ("ge_p_percent", "ge_r_percent", "ge_bad_loss_percent", "ge_good_loss_percent")
NETEM_KEYS = ("loss_percent", "delay_ms", "jitter_ms", "corrupt_percent", *GE_KEYS)
#: per kind: allowed keys, required keys, the target's kind
KINDS: dict[str, tuple[frozenset, frozenset, str]] = {
    "link-down": (frozenset({"at_s", "for_s", "detect_ms"}), frozenset({"at_s"}), "link"),
    "flap": (frozenset({"at_s", "down_s", "up_s", "count", "detect_ms"}),
             frozenset({"at_s", "down_s", "up_s", "count"}), "link"),
    "slow-port": (frozenset({"at_s", "fraction", "for_s"}), frozenset({"at_s", "fraction"}), "port"),
    "netem": (frozenset({"at_s", "for_s", "loss_percent", "delay_ms", "jitter_ms", "corrupt_percent", *GE_KEYS}),
              frozenset({"at_s"}), "port"),
    "pause-storm": (frozenset({"at_s", "for_s"}), frozenset({"at_s"}), "port"),
    "slow-host": (frozenset({"at_s", "cpu_fraction", "for_s", "period_ms"}), frozenset({"at_s", "cpu_fraction"}),
                  "host"),
    "host-config": (frozenset({"at_s", "for_s", "cc", "ecn", "mtu_bytes", "rto_min_ms"}), frozenset(), "host"),
}
#: every kind but host-config may start at an iteration of a collective job instead of a time
for _kind, (_allowed, _required, _target) in list(KINDS.items()):
    if _kind != "host-config":
        KINDS[_kind] = (_allowed | {"at_iteration"}, _required, _target)
#: keys whose value is a word, not a number
WORD_KEYS = frozenset({"cc"})
#: host-config keys a connection takes when it opens (applied before the workload, for the whole run) and keys
#: that change a live host (from at_s, for for_s)
OPEN_TIME_KEYS = ("cc", "ecn")
LIVE_HOST_KEYS = ("mtu_bytes", "rto_min_ms")
MIN_MTU_BYTES, MAX_MTU_BYTES = 576, 9000


@dataclass(frozen=True)
class Fault:
    """One fault as written: ``kind``, ``target`` (a link or a port, by name) and its parameters."""

    kind: str
    target: str
    params: tuple[tuple[str, float | str], ...] = field(default_factory=tuple)

    def get(self, key: str, default: float | str | None = None) -> float | str | None:
        return dict(self.params).get(key, default)

    @property
    def at_s(self) -> float:
        return float(dict(self.params)["at_s"])

    @property
    def at_iteration(self) -> int | None:
        """The iteration whose start t = 0 of this fault's times is (None: the workload's start)."""
        v = dict(self.params).get("at_iteration")
        return None if v is None else int(v)

    @property
    def end_s(self) -> float:
        """When the fault's last effect ends (inf: for good)."""
        p = dict(self.params)
        if self.kind == "flap":
            return p["at_s"] + p["count"] * (p["down_s"] + p["up_s"])
        return p["at_s"] + p["for_s"] if "for_s" in p else math.inf

    def __str__(self) -> str:
        return " ".join([self.kind, self.target, *(f"{k}={v}" if isinstance(v, str) else f"{k}={v:.12g}"
                                                    for k, v in self.params)])


@dataclass(frozen=True)
class Step:
    """One change the timeline makes at ``t_s`` (seconds from the workload's start): ``op`` is cut / mend (a
    link), rate (a port's rate as a fraction of its own, 1.0 restores), netem / netem-clear (a port), storm /
    storm-end (a port's pause storm), cpu (a host's
    CPU fraction, None lifts the limit), host-live / host-restore (a host's MTU and RTOmin) or host-open (records
    the open-time settings the timeline applied before the workload)."""

    t_s: float
    op: str
    fault: Fault
    value: float | dict | None = None


def make(kind: str, target: str, **params: float) -> Fault:
    """A fault from keyword parameters (checked for form, not yet against a topology)."""
    return _checked(kind, target, params)


def parse(text: str, at_s: float | None = None) -> Fault:
    """``KIND TARGET key=value ...`` (see the module docstring) -> Fault; ``at_s``, when given, is the start time
    (``lab.at(t, text)`` writes it outside the text)."""
    words = shlex.split(text, comments=True)
    if len(words) < 2:
        raise UsageError(f"fault {text.strip()!r}: write KIND TARGET key=value ... (kinds: {', '.join(KINDS)})")
    params: dict[str, float | str] = {}
    for w in words[2:]:
        key, eq, val = w.partition("=")
        if not eq:
            raise UsageError(f"fault {text.strip()!r}: {w!r} is not key=value")
        if key in WORD_KEYS:
            params[key] = val
            continue
        try:
            params[key] = float(val)
        except ValueError:
            raise UsageError(f"fault {text.strip()!r}: {key}={val!r} is not a number") from None
    if at_s is not None:
        params["at_s"] = at_s
    return _checked(words[0], words[1], params)


def parse_file(path: str | Path) -> list[Fault]:
    """One fault per line; blank lines and ``#`` comments are skipped."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise UsageError(f"--faults {path}: {e.strerror or e}") from None
    return [parse(line) for line in lines if line.split("#", 1)[0].strip()]


def _checked(kind: str, target: str, params: dict) -> Fault:
    if kind not in KINDS:
        raise UsageError(f"fault: unknown kind {kind!r} (kinds: {', '.join(KINDS)})")
    allowed, required, _ = KINDS[kind]
    where = f"fault {kind} {target}"
    for key in params:
        if key not in allowed:
            raise UsageError(f"{where}: unknown parameter {key!r} (allowed: {', '.join(sorted(allowed))})")
    if "at_iteration" in params:  # at_s then counts from the iteration's start
        params = {"at_s": 0.0, **params}
    for key in sorted(required - set(params)):
        raise UsageError(f"{where}: {key}= is required")
    p = {k: (str(v) if k in WORD_KEYS else float(v)) for k, v in params.items()}
    p.setdefault("at_s", 0.0)
    for key, v in p.items():
        if key not in WORD_KEYS and not math.isfinite(v):
            raise UsageError(f"{where}: {key} must be a finite number (got {v})")
    _check_ranges(where, kind, p)
    if kind == "host-config":
        _check_host_config(where, p)
    return Fault(kind, target, tuple(sorted(p.items())))


def _check_host_config(where: str, p: dict) -> None:
    open_keys = [k for k in OPEN_TIME_KEYS if k in p]
    live_keys = [k for k in LIVE_HOST_KEYS if k in p]
    if not open_keys and not live_keys:
        raise UsageError(f"{where}: give at least one of {', '.join(OPEN_TIME_KEYS + LIVE_HOST_KEYS)}")
    if open_keys and (p["at_s"] > 0 or "for_s" in p):
        verb = "is" if len(open_keys) == 1 else "are"
        raise UsageError(f"{where}: {'/'.join(open_keys)} {verb} fixed when a connection opens, so they hold for "
                         "the whole run: drop at_s/for_s, or put the live settings in a fault of their own")
    if "cc" in p and not re.fullmatch(r"[a-z][a-z0-9_]{0,14}", p["cc"]):
        raise UsageError(f"{where}: cc={p['cc']!r} is not a congestion control's name (e.g. cubic, dctcp)")
    if "ecn" in p and p["ecn"] not in (0.0, 1.0):
        raise UsageError(f"{where}: ecn must be 0 or 1 (got {p['ecn']:g})")
    if "mtu_bytes" in p and not (p["mtu_bytes"] == int(p["mtu_bytes"])
                                 and MIN_MTU_BYTES <= p["mtu_bytes"] <= MAX_MTU_BYTES):
        raise UsageError(f"{where}: mtu_bytes must be a whole number {MIN_MTU_BYTES}..{MAX_MTU_BYTES} "
                         f"(got {p['mtu_bytes']:g})")
    if "rto_min_ms" in p and not (p["rto_min_ms"] == int(p["rto_min_ms"]) and 1 <= p["rto_min_ms"] <= 120_000):
        raise UsageError(f"{where}: rto_min_ms must be a whole number 1..120000 (got {p['rto_min_ms']:g})")


def _check_ranges(where: str, kind: str, p: dict[str, float]) -> None:
    def need(ok: bool, what: str) -> None:
        if not ok:
            raise UsageError(f"{where}: {what}")

    need(p["at_s"] >= 0, f"at_s must be >= 0 (got {p['at_s']:g})")
    for key in ("for_s", "down_s", "up_s"):
        if key in p:
            need(p[key] > 0, f"{key} must be > 0 (got {p[key]:g})")
    if "at_iteration" in p:
        need(p["at_iteration"] == int(p["at_iteration"]) and -1000 <= p["at_iteration"] <= 100_000,
             f"at_iteration must be a whole number (got {p['at_iteration']:g})")
    if "detect_ms" in p:
        need(0 <= p["detect_ms"] <= 60_000, f"detect_ms must be 0..60000 (got {p['detect_ms']:g})")
    if "count" in p:
        need(p["count"] == int(p["count"]) and 1 <= p["count"] <= MAX_FLAPS,
             f"count must be a whole number 1..{MAX_FLAPS} (got {p['count']:g})")
    if kind == "slow-host":
        need(0 < p["cpu_fraction"] <= 1, f"cpu_fraction must be in (0, 1] of one CPU (got {p['cpu_fraction']:g})")
        need(1 <= p.get("period_ms", 100) <= 1000, f"period_ms must be 1..1000 (got {p.get('period_ms', 100):g})")
        need(p["cpu_fraction"] * p.get("period_ms", 100) >= 1,
             "cpu_fraction x period_ms must be at least 1 ms (the kernel's smallest quota)")
    if kind == "slow-port":
        need(0 < p["fraction"] <= 1, f"fraction must be in (0, 1] (got {p['fraction']:g}; a rate of 0 is a "
             "dead link: use link-down)")
    for key in ("loss_percent", "corrupt_percent", *GE_KEYS):
        if key in p:
            need(0 <= p[key] <= 100, f"{key} must be 0..100 (got {p[key]:g})")
    for key in ("delay_ms", "jitter_ms"):
        if key in p:
            need(0 <= p[key] <= 10_000, f"{key} must be 0..10000 (got {p[key]:g})")
    if kind == "netem":
        need(any(p.get(k, 0) > 0 for k in ("loss_percent", "delay_ms", "jitter_ms", "corrupt_percent",
                                           "ge_p_percent")),
             "give at least one of loss_percent, delay_ms, jitter_ms, corrupt_percent, ge_p_percent > 0")
        ge = [k for k in GE_KEYS if k in p]
        if ge:
            need(p.get("ge_p_percent", 0) > 0 and p.get("ge_r_percent", 0) > 0,
                 "bursty loss needs ge_p_percent > 0 and ge_r_percent > 0 (good -> bad, bad -> good)")
            need(p.get("loss_percent", 0) == 0, "loss_percent and the ge_* bursty loss model exclude each other")
        need(p.get("jitter_ms", 0) <= p.get("delay_ms", 0), "jitter_ms must not exceed delay_ms")


# ---- against a topology ----

def find_link(topology, text: str):
    """The :class:`~topologies.spec.Link` named ``a-b`` (node names) or by its full name ``a:pa-b:pb``."""
    for l in topology.links:
        if text == l.name:
            return l
    nodes = {n.name for n in topology.nodes}
    for i, ch in enumerate(text):
        if ch != "-":
            continue
        a, b = text[:i], text[i + 1:]
        if a in nodes and b in nodes:
            found = [l for l in topology.links if {l.a, l.b} == {a, b}]
            if len(found) == 1:
                return found[0]
            if len(found) > 1:
                raise UsageError(f"fault link {text!r}: {a} and {b} share {len(found)} links; name one: "
                                 f"{', '.join(l.name for l in found)}")
            raise UsageError(f"fault link {text!r}: no link between {a} and {b}")
    raise UsageError(f"fault link {text!r}: unknown link (write NODE-NODE, e.g. "
                     f"{topology.links[0].a}-{topology.links[0].b})")


def find_port(topology, text: str) -> tuple[str, str]:
    """(node, ifname) of the egress port ``node:ifname``."""
    node, colon, ifname = text.partition(":")
    ports = {(p.node, p.ifname) for p in topology.egress_ports()}
    if not colon or (node, ifname) not in ports:
        some = sorted(ports)[:3]
        raise UsageError(f"fault port {text!r}: no such egress port (write NODE:IFNAME, e.g. "
                         f"{', '.join(f'{n}:{i}' for n, i in some)})")
    return node, ifname


def find_host(topology, text: str) -> str:
    """The host named `text`."""
    hosts = [n.name for n in topology.nodes if n.is_host]
    if text not in hosts:
        raise UsageError(f"fault host {text!r}: no such host (hosts: {', '.join(hosts[:6])}"
                         f"{', ...' if len(hosts) > 6 else ''})")
    return text


def find_target(topology, f: Fault):
    """The fault's target in `topology`: a Link, a (node, ifname) port or a host name."""
    kind = KINDS[f.kind][2]
    return {"link": find_link, "port": find_port, "host": find_host}[kind](topology, f.target)


def _check_lossless(topology, f: Fault, port: tuple[str, str]) -> None:
    if port not in lossless_classes(topology):
        raise UsageError(f"fault {f.kind} {f.target}: the port has no lossless class for PFC to pause (a pause storm "
                         "needs PFC: e.g. the collective's pfc=on, or a topology file with a lossless class)")


def check(faults: list[Fault], topology, horizon_s: float | None = None, iterations: int | None = None) -> None:
    """Every fault's target exists in `topology`; with a known workload length `horizon_s`, every fault starts
    before it ends; with a known number of measured `iterations` (0: the workload has none), every fault at an
    iteration names one of them."""
    for f in faults:
        if f.at_iteration is not None and iterations is not None:
            if iterations == 0:
                raise UsageError(f"fault {f}: at_iteration needs a workload with iterations (a collective job)")
            if f.at_iteration >= iterations:
                raise UsageError(f"fault {f}: at_iteration={f.at_iteration} is past the last iteration "
                                 f"({iterations - 1})")
        target = find_target(topology, f)
        if f.kind == "pause-storm":
            _check_lossless(topology, f, target)
        if horizon_s is not None and f.at_iteration is None and f.at_s >= horizon_s:
            raise UsageError(f"fault {f}: at_s={f.at_s:g} is past the end of the workload ({horizon_s:g} s)")


def steps(f: Fault) -> list[Step]:
    """The changes one fault makes, in time order (routing's reaction is the player's: it depends on timing)."""
    p = dict(f.params)
    at = p["at_s"]
    if f.kind == "link-down":
        out = [Step(at, "cut", f)]
        if "for_s" in p:
            out.append(Step(at + p["for_s"], "mend", f))
        return out
    if f.kind == "flap":
        out, t = [], at
        for _ in range(int(p["count"])):
            out += [Step(t, "cut", f), Step(t + p["down_s"], "mend", f)]
            t += p["down_s"] + p["up_s"]
        return out
    if f.kind == "slow-port":
        out = [Step(at, "rate", f, p["fraction"])]
        if "for_s" in p:
            out.append(Step(at + p["for_s"], "rate", f, 1.0))
        return out
    if f.kind == "pause-storm":
        return [Step(at, "storm", f), *([Step(at + p["for_s"], "storm-end", f)] if "for_s" in p else [])]
    if f.kind == "slow-host":
        out = [Step(at, "cpu", f, p["cpu_fraction"])]
        if "for_s" in p:
            out.append(Step(at + p["for_s"], "cpu", f, None))
        return out
    if f.kind == "host-config":
        live = {k: p[k] for k in LIVE_HOST_KEYS if k in p}
        out = [Step(0.0, "host-open", f, {k: p[k] for k in OPEN_TIME_KEYS if k in p})] \
            if any(k in p for k in OPEN_TIME_KEYS) else []
        if live:
            out.append(Step(at, "host-live", f, live))
            if "for_s" in p:
                out.append(Step(at + p["for_s"], "host-restore", f, live))
        return out
    netem = {k: p[k] for k in NETEM_KEYS if k in p}
    out = [Step(at, "netem", f, netem)]
    if "for_s" in p:
        out.append(Step(at + p["for_s"], "netem-clear", f))
    return out


def needs(faults: list[Fault]) -> tuple[str, ...]:
    """Kernel capabilities the faults need (testbed.vm.needs names)."""
    out: list[str] = []
    if any(KINDS[f.kind][2] == "link" for f in faults) or any(f.kind == "netem" for f in faults):
        out += ["cls:u32", "act:mirred"]
    if any(f.kind == "netem" for f in faults):
        out.append("qdisc:netem")
    if any(f.kind == "pause-storm" for f in faults):
        out.append("qdisc:plug")
    if any(f.kind == "slow-host" for f in faults):
        out.append("cgroup:cpu")
    for f in faults:
        if f.kind == "host-config" and f.get("cc") in ("dctcp", "bbr", "reno", "cubic"):
            out.append(f"tcp:{f.get('cc')}")
        if f.kind == "host-config" and f.get("ecn") == 1.0:
            out.append("sysctl:ecn")
    return tuple(dict.fromkeys(out))


__all__ = ["DEFAULT_DETECT_MS", "KINDS", "LIVE_HOST_KEYS", "OPEN_TIME_KEYS", "WORD_KEYS", "Fault", "Step", "check",
           "find_host", "find_link", "find_port", "find_target", "make", "needs", "parse", "parse_file", "steps"]
