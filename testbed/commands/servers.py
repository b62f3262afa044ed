"""`testbed servers check FILE`: can these machines carry one fabric together? (docs/servers.md, issue 29)

    testbed servers check servers.txt [--max-offset-uncertainty-ms 1] [--exchanges 100] [--json FILE]
    testbed servers clean servers.txt          # testbed clean on every server of the file, through its agent
    testbed clean --servers servers.txt        # the same

Mininet's cluster edition runs ``ssh -n user@server sudo true`` against every server before it builds anything
(``precheck``); this goes further and asks each server's agent (testbed.commands.serveragent, over one ssh session
per server; ``localhost`` as a local process): per server, the agent answered (**reach**, with the time it took), it
runs the reference's testbed (**version**: the same commit), its kernel release and capabilities (**kernel**: the
doctor's probes; the ones every fabric needs must be there), the file's address is on one of its interfaces with at
least the file's MTU (**nic**); and per server beside the reference, over the servers' own addresses: a ping of the
underlay MTU with don't-fragment each way (**mtu**), a VXLAN pair of VNI 16777215 on UDP 4789 carrying pings
(**vxlan**), and its clock's offset against the reference with the offset's bound (**clock**, refused above
``--max-offset-uncertainty-ms``).

One line per check (``SERVER CHECK ok|FAIL detail``); exit status 0 when every check passed, 1 when one failed,
2 for a bad file or option (one line, before any server is contacted). Whatever the check made on a server (its
scratch namespaces, the clock echo) is removed by that server's agent when the check ends, is interrupted or is sent
SIGTERM (the agent tears down when its input closes).
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from testbed.errors import UsageError, require_root
from testbed.network import servernic, serversfile
from testbed.network.serversfile import Server

#: the VNI of the check's VXLAN pair (the largest: a fabric numbers its crossing links from 1)
CHECK_VNI = 16777215
CHECK_INNER = ("198.18.255.1", "198.18.255.2", 30)
CLOCK_PORT = 9319
#: agent round trips timed per server
RTT_PINGS = 20
#: the doctor's probes the check reports; the first ones every fabric needs (the others say which scenarios fit)
NEEDED_PROBES = ("qdisc:htb", "qdisc:bfifo")
REPORTED_PROBES = NEEDED_PROBES + ("qdisc:tbf", "qdisc:red+ecn", "qdisc:netem", "qdisc:prio", "tcp:dctcp",
                                   "cls:u32")


@dataclass
class Result:
    server: str
    check: str
    ok: bool
    detail: str


@dataclass
class Report:
    results: list[Result] = field(default_factory=list)
    numbers: dict = field(default_factory=dict)

    def add(self, server: str, check: str, ok: bool, detail: str) -> bool:
        self.results.append(Result(server, check, ok, detail))
        print(f"{server:<12} {check:<8} {'ok' if ok else 'FAIL':<5} {detail}", flush=True)
        return ok

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)


def _per_server(rep: Report, s: Server, link, ref_version: dict | None) -> dict | None:
    """reach (already done), version, kernel, nic for one server; its version dict."""
    ver = link.call("version")
    if ref_version is None or (ver["commit"], ver["package"]) == (ref_version["commit"], ref_version["package"]):
        rep.add(s.name, "version", True, f"{(ver['commit'] or 'no git')[:12]} (package {ver['package']})"
                + (", uncommitted changes" if ver["dirty"] else ""))
    else:
        rep.add(s.name, "version", False, f"{(ver['commit'] or 'no git')[:12]} (package {ver['package']}), the "
                f"reference runs {(ref_version['commit'] or 'no git')[:12]} ({ref_version['package']})")
    t0 = time.monotonic()
    doc = link.call("doctor", timeout_s=300, only=list(REPORTED_PROBES))
    have = {c["name"] for c in doc["checks"] if c["ok"]}
    missing = [p for p in REPORTED_PROBES if p not in have]
    lacking = [p for p in NEEDED_PROBES if p not in have]
    rep.add(s.name, "kernel", not lacking, f"{ver['kernel']}: {len(have)}/{len(REPORTED_PROBES)} capabilities"
            + (f", missing {' '.join(missing)}" if missing else "")
            + (f" (a fabric needs {' '.join(lacking)})" if lacking else "")
            + f" [doctor {time.monotonic() - t0:.1f} s]")
    if s.address is None:
        rep.add(s.name, "nic", False, "no address= in the file (tunnels and the clock need one)")
        return ver
    n = link.call("nic", address=s.address)
    bad = servernic.problem(s.name, s.address, n, s.mtu, f"the file's mtu={s.mtu}")
    rep.add(s.name, "nic", bad is None, bad or f"{s.address} on {n['ifname']}, MTU {n['mtu']} (file: {s.mtu}), GRO "
            + ("on: crossing frames can reach its queues merged" if servernic.gro_on(n) else "off"))
    return ver


def _ping_ok(link, argv: list[str], ns: str | None = None) -> tuple[bool, str]:
    r = link.call("run", timeout_s=60, argv=argv, ns=ns)
    lines = [x for x in (r["stdout"] + r["stderr"]).splitlines() if "received" in x or "rtt" in x]
    return r["rc"] == 0, "; ".join(lines) or (r["stderr"].strip().splitlines() or [f"status {r['rc']}"])[-1]


def _pair(rep: Report, ref: Server, s: Server, links: dict, args) -> None:
    """mtu, vxlan and clock between the reference and server ``s``."""
    from testbed.network.serverlink import clock_pass

    ref_link, link = links[ref.name], links[s.name]
    mtu = min(ref.mtu, s.mtu)
    size = mtu - 28
    ok1, d1 = _ping_ok(ref_link, ["ping", "-n", "-q", "-c", "2", "-i", "0.2", "-W", "2", "-M", "do", "-s",
                                  str(size), s.address])
    ok2, d2 = _ping_ok(link, ["ping", "-n", "-q", "-c", "2", "-i", "0.2", "-W", "2", "-M", "do", "-s", str(size),
                              ref.address])
    rep.add(s.name, "mtu", ok1 and ok2, f"{mtu}-byte packets, don't fragment, both ways with {ref.name}: {d1}"
            + ("" if ok2 else f"; back: {d2}"))
    a, b, plen = CHECK_INNER
    try:
        ns = ref_link.call("vxlan_up", vni=CHECK_VNI, local=ref.address, remote=s.address,
                           inner_cidr=f"{a}/{plen}", mtu=mtu - 50)["ns"]
        link.call("vxlan_up", vni=CHECK_VNI, local=s.address, remote=ref.address, inner_cidr=f"{b}/{plen}",
                  mtu=mtu - 50)
        ok, d = _ping_ok(ref_link, ["ping", "-n", "-q", "-c", "3", "-i", "0.2", "-W", "2", b], ns=ns)
        rep.add(s.name, "vxlan", ok, f"VNI {CHECK_VNI} on UDP 4789 with {ref.name}: {d}")
    except Exception as e:  # noqa: BLE001 - AgentError: the device could not be made
        rep.add(s.name, "vxlan", False, str(e))
    finally:
        for lk in (ref_link, link):
            lk.call("vxlan_down")
    c = clock_pass(ref_link, link, s.address, CLOCK_PORT, args.exchanges)
    bound_us, limit_us = c["uncertainty_s"] * 1e6, args.max_offset_uncertainty_ms * 1e3
    rep.numbers[s.name]["clock"] = c
    rep.add(s.name, "clock", bound_us <= limit_us and c["n"] >= 3,
            f"offset {c['offset_s']:+.6f} s +- {bound_us:.0f} us (limit {limit_us:.0f} us; {c['n']}/{c['sent']} "
            f"exchanges, fastest round trip {c['delay_min_s'] * 1e6:.0f} us, "
            f"median {c['delay_median_s'] * 1e6:.0f} us)")


def _round_trips(link, n: int = RTT_PINGS) -> list[float]:
    """Seconds per ping request and reply through the agent's pipe (ssh's included for a remote server)."""
    out = []
    for _ in range(n):
        t0 = time.monotonic()
        link.call("ping")
        out.append(time.monotonic() - t0)
    return out


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def check(servers: list[Server], args) -> Report:
    """Every check, in order; the agents are closed (and tear down) whatever happens."""
    from testbed.network.serverlink import AgentError, AgentLink

    rep = Report()
    links: dict = {}
    try:
        ref_version = None
        for s in servers:
            t0 = time.monotonic()
            try:
                link = links[s.name] = AgentLink.start(s, connect_timeout_s=args.connect_timeout_s)
                link.call("ping", timeout_s=args.connect_timeout_s + 60)
            except AgentError as e:
                rep.add(s.name, "reach", False, str(e))
                continue
            reach_s = time.monotonic() - t0
            rtt_s = _round_trips(link)
            rep.numbers[s.name] = {"reach_s": reach_s, "agent_rtt_s": rtt_s}
            rep.add(s.name, "reach", True, f"agent answered {reach_s:.2f} s after start "
                    + ("(local process)" if s.local else f"(ssh {s.target})")
                    + f"; round trip {_median(rtt_s) * 1e3:.2f} ms (median of {len(rtt_s)})")
            try:
                ver = _per_server(rep, s, link, ref_version)
                ref_version = ref_version or ver
            except AgentError as e:
                rep.add(s.name, "agent", False, str(e))
        ref = servers[0]
        for s in servers[1:]:
            if ref.address is None or s.address is None:
                rep.add(s.name, "pair", False, "no address= for this server or the reference: mtu, vxlan and clock "
                        "not checked")
            elif any(r.server in (ref.name, s.name) and r.check == "reach" and not r.ok for r in rep.results):
                rep.add(s.name, "pair", False, f"mtu, vxlan and clock not checked: {ref.name} or {s.name} unreached")
            else:
                try:
                    _pair(rep, ref, s, links, args)
                except AgentError as e:
                    rep.add(s.name, "pair", False, str(e))
    finally:
        for link in links.values():
            link.close()
    return rep


def clean(servers: list[Server], args) -> Report:
    """`testbed clean` on every server of the file, each by its agent (the project's tb- objects only; a server
    that cannot be reached is one failed line, the others are still cleaned)."""
    from testbed.network.serverlink import AgentError, AgentLink

    rep = Report()
    for s in servers:
        link = None
        try:
            link = AgentLink.start(s, connect_timeout_s=args.connect_timeout_s)
            dry_run = getattr(args, "dry_run", False)
            p = link.call("clean", timeout_s=args.connect_timeout_s + 120, dry_run=dry_run)
            done = [f"{len(v)} {k.replace('_', ' ')}" for k, v in p.items() if v]
            verb = "would remove " if dry_run else "removed "
            rep.add(s.name, "clean", True, verb + ", ".join(done) if done else "nothing to clean")
        except AgentError as e:
            rep.add(s.name, "clean", False, str(e))
        finally:
            if link is not None:
                link.close()
    return rep


def main(args: argparse.Namespace) -> int:
    if args.exchanges < 3 or args.max_offset_uncertainty_ms <= 0 or args.connect_timeout_s <= 0:
        raise UsageError("--exchanges must be >= 3, --max-offset-uncertainty-ms and --connect-timeout-s > 0")
    servers = serversfile.load(args.file)
    require_root(f"testbed servers {args.action}")
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    rep = check(servers, args) if args.action == "check" else clean(servers, args)
    if args.json:
        Path(args.json).write_text(json.dumps({"results": [asdict(r) for r in rep.results], "numbers": rep.numbers},
                                              indent=1) + "\n")
    failed = [r for r in rep.results if not r.ok]
    print(f"{len(rep.results) - len(failed)} of {len(rep.results)} checks passed"
          + (f"; failed: {', '.join(f'{r.server} {r.check}' for r in failed)}" if failed else ""))
    return 0 if rep.ok else 1


def clean_main(path: str, dry_run: bool = False) -> int:
    """`testbed clean --servers FILE`: as `testbed servers clean FILE`."""
    return main(argparse.Namespace(action="clean", file=path, dry_run=dry_run, json=None, exchanges=100,
                                   max_offset_uncertainty_ms=1.0, connect_timeout_s=10.0))


def add_parser(sub) -> None:
    p = sub.add_parser("servers", help="check the machines a fabric is split over (ssh, version, kernel, MTU, "
                       "VXLAN, clock)", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=("check", "clean"), help="check: every check for every server of FILE; clean: "
                   "testbed clean on every server of FILE, through its agent")
    p.add_argument("file", help="the servers file (docs/servers.md)")
    p.add_argument("--max-offset-uncertainty-ms", type=float, default=1.0, metavar="MS",
                   help="the clock check fails when the offset's bound is wider (default 1 ms: half the host's "
                   "queue-sampling interval of 1 ms would be 0.5; the lab VM measures 0.27-0.32)")
    p.add_argument("--exchanges", type=int, default=100, help="clock ping-pongs per server, 10 ms apart")
    p.add_argument("--json", metavar="FILE", help="also write every check's result and the numbers (set-up time, "
                   "agent round trips, clock pass) to FILE")
    p.add_argument("--connect-timeout-s", type=float, default=10.0, help="ssh's connect timeout")
    p.add_argument("--dry-run", action="store_true", help="clean: list what would be removed on each server")
    p.set_defaults(func=main)
