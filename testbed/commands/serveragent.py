"""The server agent: one long-lived process per server, what the reference server's lab talks to (docs/servers.md).

    python -m testbed.commands.serveragent [--lease-s S]   # over the server's ssh connection, or locally

It speaks JSON lines on stdin/stdout, one request and one reply per line, as MaxiNet's worker answers RPCs but over
ssh's own pipe (no port, no password of its own)::

    {"id": 1, "op": "ping"}                       -> {"id": 1, "ok": true, "result": {"t_s": ..., "pid": ...}}
    {"id": 2, "op": "run", "args": {"argv": ["ip", "-j", "link"], "ns": null}}
                                                  -> {"id": 2, "ok": false, "error": "one line"}   (on failure)

Operations (``OPS``): ping, version (the testbed commit and package version), doctor (the kernel's capabilities,
testbed.kernel.doctor), nic (the interface holding an address, its MTU and GRO), run (a command here or in one of
the project's namespaces, to its end), spawn / proc_poll / proc_kill (a process started in one of them without
holding the agent, with its files and a control connection: testbed.commands.serverprocs), clock_serve / clock_probe
(the clock echo and its prober, testbed.measure.clockprobe and analysis.clockoffset), vxlan_up / vxlan_down (a
scratch VXLAN end in a namespace of the agent's, for the servers check), build_share / share_counters /
teardown_share (this server's share of a fabric), sample_start / sample_stop (its queue sampler:
testbed.measure.serversamples), clean (testbed clean on this server: only
the project's tb- objects), quit.

**It tears down what it made when its stdin closes**: a lab killed on the reference server (SIGKILL included) closes
the ssh session, the agent reads EOF, kills what it spawned, removes its namespaces and ends its echoes; SIGTERM and
SIGHUP (sshd's when the connection drops) do the same. **And when the lab goes silent** (``--lease-s S``, what
AgentLink.start asks for): a link that stops carrying packets without closing (a cable pulled, a firewall that
starts dropping) leaves sshd waiting for its keepalive for hours; the lab renews its lease with a ping every S/3 s,
and an agent that has no request for S s while idle tears down and ends with status 1 (:class:`Lease`).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from testbed.commands.serverinfo import PROJECT_ROOT, nic, version  # noqa: F401 - PROJECT_ROOT: the agent's root
from testbed.commands.serverprocs import Processes
from testbed.measure.serversamples import ShareSampling
from testbed.kernel import netns
from testbed.kernel.state import RunState


class Agent:
    """One server's agent: the operations and what they created (its RunState, the echo threads)."""

    def __init__(self) -> None:
        self.state = RunState()
        self.echoes: list[tuple[socket.socket, threading.Thread]] = []
        self.fabric = None   # the share this server builds (testbed.network.share), if any
        self.procs = Processes(self.state)   # what spawn started (a collective's ranks)
        self.samples = ShareSampling()       # the share's queue sampler (serversamples)

    # ---- operations -------------------------------------------------------------------------------------------
    def ping(self) -> dict:
        return {"t_s": time.monotonic(), "pid": os.getpid()}

    def version(self) -> dict:
        return version()

    def doctor(self, only: list[str] | None = None) -> dict:
        from testbed.kernel import doctor

        return doctor.report(only)

    def nic(self, address: str, ns: str | None = None) -> dict:
        return nic(address, ns)

    def run(self, argv: list[str], ns: str | None = None, timeout_s: float = 30.0) -> dict:
        """argv here (ns None) or in the project's namespace ``ns``; its status and output."""
        if ns is not None and not netns.ours(ns):
            raise ValueError(f"namespace {ns!r} is not the project's (tb-...)")
        full = netns.in_namespace(ns, argv) if ns else argv
        r = subprocess.run(full, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
        return {"rc": r.returncode, "stdout": r.stdout[-20000:], "stderr": r.stderr[-5000:]}

    def spawn(self, ns: str, argv: list[str], files: dict[str, str] | None = None, control: list | None = None,
              control_arg: str = "--control") -> dict:
        """argv started in the project's namespace ``ns`` (not waited for): serverprocs.Processes.spawn."""
        return self.procs.spawn(ns, argv, files, control, control_arg)

    def proc_poll(self, pid: int) -> dict:
        return self.procs.poll(pid)

    def proc_kill(self, pid: int, sig: int = signal.SIGKILL) -> dict:
        return self.procs.kill(pid, sig)

    def sample_start(self, interval_ms: float = 1.0) -> dict:
        return self.samples.start(self.fabric, interval_ms)

    def sample_stop(self) -> dict:
        return self.samples.stop()

    def clock_serve(self, bind: str, port: int, idle_s: float = 60.0) -> dict:
        """Start the clock echo on ``bind``:``port`` (a thread; it ends on STOP, after idle_s, or with the agent, and
        closes its socket, so a later pass binds the port again)."""
        from testbed.measure import clockprobe

        def echo(sock: socket.socket) -> None:
            try:
                clockprobe.serve(sock, idle_s)
            except OSError:       # closed by teardown
                pass
            finally:
                sock.close()      # a later pass on the same port can bind again
        for old, t in self.echoes:   # a previous pass's echo on this port: its STOP may still be on its way in
            try:
                same = old.getsockname() == (bind, port)
            except OSError:          # closed meanwhile
                continue
            if same:
                t.join(timeout=5)
        self.echoes = [(old, t) for old, t in self.echoes if t.is_alive()]
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind((bind, port))
        t = threading.Thread(target=echo, args=(sock,), daemon=True)
        t.start()
        self.echoes.append((sock, t))
        return {"bind": bind, "port": sock.getsockname()[1]}

    def clock_probe(self, addr: str, port: int, count: int = 100, interval_s: float = 0.01) -> dict:
        """One clock pass against the echo at addr:port: the offset (echo's clock - this one's) and its bound."""
        from analysis.clockoffset import estimate
        from testbed.measure import clockprobe

        clockprobe.wait_ready(addr, port, within_s=10)
        ex = clockprobe.probe(addr, port, count=count, interval_s=interval_s)
        clockprobe.stop(addr, port)
        out = estimate(ex).as_dict()
        out["sent"] = count
        out["delay_median_s"] = sorted(e.delay_s for e in ex)[len(ex) // 2]
        return out

    def vxlan_up(self, vni: int, local: str, remote: str, inner_cidr: str, mtu: int) -> dict:
        """A VXLAN end (``vni``, ``local`` -> ``remote`` on UDP 4789) made in the agent's namespace, where its socket
        and underlay stay, and moved into a scratch namespace of the agent's with ``inner_cidr``: the crossing-link
        end a split fabric makes (testbed.kernel.tunnel.add_vxlan_end), for one check."""
        from testbed.kernel import links, tunnel

        ns = f"tb-{self.state.run_id}-vx"
        self.state.add("namespaces", ns)
        netns.create(ns)
        tunnel.add_vxlan_end(None, ns, "eth0", vni, local, remote, None, mtu)
        addr, prefixlen = inner_cidr.split("/")
        links.add_address(ns, "eth0", addr, int(prefixlen))
        with netns.ipr_in(ns) as ipr:
            ipr.link("set", index=ipr.link_lookup(ifname="eth0")[0], state="up")
        return {"ns": ns}

    def vxlan_down(self) -> dict:
        ns = f"tb-{self.state.run_id}-vx"
        netns.remove(ns)
        return {"removed": ns}

    def build_share(self, share: dict, underlay_ns: str | None = None) -> dict:
        """Build this server's share of a fabric over servers (testbed.network.share: the Fabric builder on the
        nodes placed here, crossing links as VXLAN ends over this server's NIC, or ``underlay_ns``'s); one share
        per agent. Its namespaces go into the agent's RunState as they are made."""
        from testbed.network import share as shares

        if self.fabric is not None:
            raise ValueError(f"a share (run {self.fabric.run_id}) is built already: teardown_share first")
        t0 = time.monotonic()
        self.fabric = shares.build(share, self.state, underlay_ns)
        return {"build_s": time.monotonic() - t0, "kernel": os.uname().release, "run_id": self.fabric.run_id,
                "namespaces": self.fabric.namespaces, "ports": len(self.fabric.port_plans)}

    def share_counters(self) -> dict:
        """What the share's tunnels carried: UDP counters of the namespace holding this server's NIC (every VXLAN
        frame received is one InDatagram) and each crossing port's packets and bytes, both ways."""
        from testbed.kernel import tunnel

        if self.fabric is None:
            raise ValueError("no share is built")
        udp = tunnel.udp_datagrams(self.fabric.share.underlay_ns)
        links = self.fabric.topology.links
        ports = {}
        for i in self.fabric.placement.crossing:
            l = links[i]
            for node, port in ((l.a, l.a_port), (l.b, l.b_port)):
                if node in self.fabric.namespaces:
                    ports[f"{node}:{port}"] = tunnel.link_stats(self.fabric.ns(node), port)
        return {"udp": udp, "ports": ports}

    def teardown_share(self) -> dict:
        """Remove the share (its namespaces; the VXLAN ends die with their nodes)."""
        if self.fabric is None:
            return {"removed": []}
        self.samples.teardown()
        names = list(self.fabric.namespaces.values())
        self.fabric.teardown()
        self.fabric = None
        kept = [n for n in self.state.data.get("namespaces", []) if n not in names]
        self.state.data["namespaces"] = kept
        self.state.save()
        return {"removed": names}

    def clean(self, dry_run: bool = False) -> dict:
        """`testbed clean` on this server (the project's tb- objects and saved run states; this agent spared)."""
        from testbed.commands import clean

        self.teardown()
        p = clean.clean(dry_run=dry_run)
        return {k: v for k, v in p.items() if k != "state_files"}

    # ---- lifetime ---------------------------------------------------------------------------------------------
    def teardown(self) -> list[str]:
        """Remove what this agent made: the processes it started, its share, its echoes, its namespaces; then its
        run state, dropped when nothing it records is left (else saved, for `testbed clean`). Every step is tried
        whatever the ones before it did: a failure is one line on stderr and in the list returned."""
        failed: list[str] = []
        _step(failed, "killing the processes it started", self.procs.teardown)
        _step(failed, "stopping its queue sampler", self.samples.teardown)
        _step(failed, "removing its share", self._drop_share)
        for sock, _ in self.echoes:
            _step(failed, "closing a clock echo", sock.close)
        self.echoes.clear()
        for ns in list(self.state.data.get("namespaces", [])):
            if _step(failed, f"removing namespace {ns}", _remove_namespace, ns):
                self.state.data["namespaces"].remove(ns)
        _step(failed, "dropping its run state", self._drop_state)
        return failed

    def _drop_share(self) -> None:
        fabric, self.fabric = self.fabric, None
        if fabric is not None:
            fabric.teardown()

    def _drop_state(self) -> None:
        left = {k: self.state.data.get(k) for k in ("pids", "folders", "namespaces") if self.state.data.get(k)}
        if not left:
            self.state.drop()
            return
        self.state.save()
        print(f"serveragent: teardown: left for `testbed clean` (run state {self.state.path}): "
              + "; ".join(f"{k} {' '.join(map(str, v))}" for k, v in left.items()), file=sys.stderr, flush=True)


def _step(failed: list[str], what: str, fn, *args) -> bool:
    """``fn(*args)``; False, with the failure one line on stderr and in ``failed``, when it raised."""
    try:
        fn(*args)
        return True
    except Exception as e:  # noqa: BLE001 - teardown goes on: the next step must not be skipped
        text = str(e).strip().splitlines()
        line = f"serveragent: teardown: {what} failed: {type(e).__name__}: {text[0] if text else ''}"
        print(line, file=sys.stderr, flush=True)
        failed.append(line)
        return False


def _remove_namespace(ns: str) -> None:
    netns.remove(ns)          # quiet when it is gone already; one still there is a failure
    if (netns.NETNS_DIR / ns).exists():
        raise OSError(f"{ns} is still there")


OPS = ("ping", "version", "doctor", "nic", "run", "spawn", "proc_poll", "proc_kill", "clock_serve", "clock_probe",
       "vxlan_up", "vxlan_down", "build_share", "share_counters", "teardown_share", "sample_start", "sample_stop",
       "clean")



def handle(agent: Agent, line: str) -> dict:
    """One request line -> its reply (never raises: an error is a reply with its one-line message)."""
    try:
        req = json.loads(line)
        rid, op, args = req.get("id"), req.get("op"), req.get("args") or {}
    except (ValueError, AttributeError):
        return {"id": None, "ok": False, "error": "not a JSON object"}
    if op not in OPS:
        return {"id": rid, "ok": False, "error": f"unknown op {op!r} (known: {', '.join(OPS)}, quit)"}
    try:
        return {"id": rid, "ok": True, "result": getattr(agent, op)(**args)}
    except Exception as e:  # noqa: BLE001 - the caller gets the reason as one line
        text = str(e).strip().splitlines()
        return {"id": rid, "ok": False, "error": f"{type(e).__name__}: {text[0] if text else ''}"}


class Lease:
    """The lab's lease on this agent, as a DHCP lease or a Kubernetes node lease: renewed by every request, it runs
    out after ``lease_s`` without one while the agent is idle (a request being served keeps it). Then the agent
    sends itself SIGTERM, so :func:`serve` tears down as for sshd's SIGHUP. Needs the main thread (signals)."""

    def __init__(self, lease_s: float):
        self.lease_s = float(lease_s)
        self.expired = False
        self._last = time.monotonic()
        self._busy = False
        self._mutex = threading.Lock()   # a request starting and the lease running out: one or the other
        self._stop = threading.Event()
        threading.Thread(target=self._watch, name="lease", daemon=True).start()

    def begin(self) -> bool:
        """A request arrived: False when the lease has already run out (it must not be served)."""
        with self._mutex:
            self._busy, self._last = True, time.monotonic()
            return not self.expired

    def end(self) -> None:
        with self._mutex:
            self._busy, self._last = False, time.monotonic()

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(min(1.0, self.lease_s / 4)):
            with self._mutex:
                if self._busy or time.monotonic() - self._last <= self.lease_s:
                    continue
                self.expired = True
            print(f"serveragent: no request for {self.lease_s:g} s (the lab's lease ran out): tearing down",
                  file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGTERM)
            return


def serve(stdin=None, stdout=None, lease_s: float | None = None) -> int:
    """Answer requests until ``quit`` or end of input; then tear down what was made. With ``lease_s``, also when no
    request came for that long while idle (:class:`Lease`; main thread only): status 1 then, else 0."""
    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    agent = Agent()
    lease = None

    stopping = []   # set once the loop is left: a signal then (the lease's own) must not cut the teardown short

    def _end(signum, frame):
        if not stopping:
            raise KeyboardInterrupt
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, _end)
        lease = Lease(lease_s) if lease_s else None
    try:
        for line in stdin:
            if not line.strip():
                continue
            if lease and not lease.begin():
                stopping.append(True)
                break
            if _is_quit(line):
                stdout.write(json.dumps({"id": _id(line), "ok": True, "result": "bye"}) + "\n")
                stdout.flush()
                break
            stdout.write(json.dumps(handle(agent, line)) + "\n")
            stdout.flush()
            if lease:
                lease.end()
    except (KeyboardInterrupt, BrokenPipeError):
        pass
    finally:
        stopping.append(True)
        if threading.current_thread() is threading.main_thread():  # a second signal must not cut the teardown short
            for sig in (signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, signal.SIG_IGN)
        if lease:
            lease.stop()
        agent.teardown()
    return 1 if lease and lease.expired else 0


def _is_quit(line: str) -> bool:
    try:
        return json.loads(line).get("op") == "quit"
    except (ValueError, AttributeError):
        return False


def _id(line: str):
    try:
        return json.loads(line).get("id")
    except (ValueError, AttributeError):
        return None


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="serveragent", description="a server's agent (JSON lines on stdin/stdout)")
    ap.add_argument("--lease-s", type=float, default=None,
                    help="tear down when no request came for this long while idle (the lab renews it)")
    a = ap.parse_args(argv)
    if a.lease_s is not None and a.lease_s <= 0:
        ap.error("--lease-s must be > 0")
    return serve(lease_s=a.lease_s)


if __name__ == "__main__":
    sys.exit(main())
