"""Samplers that run beside an experiment: switch queues (queues.csv) and host CPU (cpu.csv, fidelity).

    with QueueSampler(fabric, interval_s=0.001) as qs:   # or qs.start() ... qs.stop()
        ... traffic ...
    qs.write(rundir)            # queues.csv + cpu.csv
    qs.achieved_interval_s      # what the loop really managed (an emulation on slow CPUs rarely makes 1 ms)

The queue sampler holds one netlink socket per namespace (testbed.kernel.qdiscdump's raw dump, or pyroute2 as the
reference); each tick dumps the leaf qdisc stats of every watched port and timestamps the row with time.monotonic()
(the clock every run-directory file uses). It runs in its own process by default (``python -m
testbed.measure.telemetry``, below), or as a thread. Rows are buffered and written at the end, so the sampler never
writes to disk while traffic runs. The CPU sampler beside it is testbed.measure.cpu (/proc/stat, whole machine: in
the lab VM that is every emulated node). :func:`port_totals` reads every port's cumulative counters once.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import subprocess
import threading
import time
from typing import Iterable

from testbed.kernel import netns, qdisc
from testbed.kernel.qdiscdump import RawQdiscDump
from testbed.measure.cpu import CpuSampler
from testbed.measure import liveview

QUEUE_COLUMNS = ["t_s", "node", "port", "class", "backlog_bytes", "backlog_packets", "drops", "marks", "sent_bytes",
                 "sent_packets", "overlimits"]
CPU_COLUMNS = ["t_s", "busy_fraction"]


def port_totals(ports: Iterable[tuple[str, str, str]]) -> dict[tuple[str, str], dict[str, int]]:
    """Cumulative drops, ECN marks, sent packets and bytes of every given egress port, summed over the port's leaf
    queues: {(node, ifname): {"drops", "marks", "sent_packets", "sent_bytes"}}. `ports` is Fabric.ports() ((node,
    namespace, ifname)); one netlink dump per namespace. Read before and after a run: the difference is what the
    run's traffic did to the switch queues (a drop here is a packet the emulated switch discarded, as a real one's
    tail drop); :class:`testbed.measure.portrecord.PortCounters` does that."""
    by_ns: dict[str, list[tuple[str, str]]] = {}
    for node, ns, ifn in ports:
        by_ns.setdefault(ns, []).append((node, ifn))
    out: dict[tuple[str, str], dict[str, int]] = {}
    for ns, items in by_ns.items():
        with netns.entered(ns):
            idx_of = {name: i for i, name in socket.if_nameindex()}
        dump = RawQdiscDump(ns)
        try:
            per_if = dump.leaf_stats()
        finally:
            dump.close()
        for node, ifn in items:
            qs = per_if.get(idx_of.get(ifn, -1), ())
            out[(node, ifn)] = {"drops": sum(q.drops for q in qs), "marks": sum(q.marks for q in qs),
                                "sent_packets": sum(q.sent_packets for q in qs),
                                "sent_bytes": sum(q.sent_bytes for q in qs)}
    return out


class _OneDump:
    """Stands in for an IPRoute in qdisc.leaf_stats: one RTM_GETQDISC dump of the whole namespace, filtered per
    port, instead of one dump per port (the kernel dumps every device's qdiscs either way)."""

    def __init__(self, ipr):
        self.msgs = list(ipr.get_qdiscs())

    def get_qdiscs(self, index: int):
        return [m for m in self.msgs if m["index"] == index]


class QueueSampler:
    """Sample every shaped egress port of `fabric` (or only `ports`, a set of (node, ifname)) every `interval_s`.

    Also runs a CpuSampler (cpu_interval_s) so the fidelity of the run can be judged from the same object.
    backend: "raw" (RawQdiscDump, the default: fast enough for ~1 ms on a real machine) or "pyroute2" (one pyroute2
    dump per namespace parsed by qdisc.leaf_stats; the reference, about 10-50x slower).
    """

    def __init__(self, fabric, interval_s: float = 0.001, ports: Iterable[tuple[str, str]] | None = None,
                 cpu_interval_s: float = 0.1, backend: str = "raw", mode: str = "process"):
        if backend not in ("raw", "pyroute2"):
            raise ValueError(f"backend must be raw or pyroute2 (got {backend!r})")
        if mode not in ("process", "thread"):
            raise ValueError(f"mode must be process or thread (got {mode!r})")
        self.backend = backend
        self.mode = "thread" if backend == "pyroute2" else mode
        self._proc: subprocess.Popen | None = None
        self._rows_file = None  # process mode: the child's rows, in a temporary file with no name
        self._live = None  # testbed.measure.liveview.LiveView while one shows this sampler's rounds
        self.fabric = fabric
        self.interval_s = float(interval_s)
        wanted = set(ports) if ports is not None else None
        self.ports = [(node, ns, ifn) for node, ns, ifn in fabric.ports()
                      if wanted is None or (node, ifn) in wanted]
        if wanted is not None:
            missing = wanted - {(n, i) for n, _, i in self.ports}
            if missing:
                raise KeyError(f"not shaped egress ports of this fabric: {sorted(missing)}")
        self.rows: list[tuple] = []
        self.ticks = 0
        self.t_first = self.t_last = 0.0
        self.cpu = CpuSampler(cpu_interval_s)
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._written = False
        self._labels = {}
        for node, _, ifn in self.ports:
            plan = fabric.port_plan(node, ifn)
            self._labels[(node, ifn)] = plan

    # ---- control ----

    def start(self) -> "QueueSampler":
        if self.mode == "process":
            self._start_process()
        else:
            self._thread = threading.Thread(target=self._loop, name="queue-sampler", daemon=True)
            self._thread.start()
            self._ready.wait(timeout=30)
            if self._error:
                raise self._error
        self.cpu.start()
        return self

    def stop(self, rundir=None) -> None:
        """Stop sampling (a second call does nothing more); with ``rundir``, also :meth:`write` queues.csv and
        cpu.csv there, once: what a lab does at its end, or an experiment before it reads queues.csv."""
        self._stop.set()
        if self._proc is not None:
            self._stop_process()
        if self._thread:
            self._thread.join(timeout=10)
        self.cpu.stop()
        if self._error:
            raise self._error
        if rundir is not None and not self._written:
            self._written = True
            self.write(rundir)

    # ---- process mode: the same loop in a child interpreter, away from the experiment's GIL ----
    # In thread mode the sampler competes for the GIL with the traffic threads of the scenario: every netlink
    # syscall releases it and getting it back can take a 5 ms switch interval, so a 1 ms sampler achieved ~100 ms in
    # the emulated VM. The child only needs namespace names, interface names and class labels.

    def _start_process(self) -> None:
        import json
        import sys
        import tempfile
        from pathlib import Path

        # the child writes its rows into a file with no name (unlinked at once), so a run killed mid-sample leaves
        # nothing in /tmp: the kernel frees it when both processes are gone
        self._rows_file = tempfile.TemporaryFile("w+", prefix="tb-queues-", suffix=".tsv")
        cfg = {"interval_s": self.interval_s, "rows_fd": self._rows_file.fileno(),
               "ports": [[node, ns, ifn, {str(m): lbl for m, lbl, *_ in self._labels[(node, ifn)].classes}]
                         for node, ns, ifn in self.ports]}
        if liveview.enabled():  # the live view reads this sampler's latest round (testbed.measure.liveview)
            self._live = liveview.LiveView(f"busiest ports of {len(self.ports)}").start()
            cfg["live_file"] = self._live.snapshot_path
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self._proc = subprocess.Popen([sys.executable, "-m", "testbed.measure.telemetry"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True, env=env, cwd=root,
                                      pass_fds=(self._rows_file.fileno(),))
        self._proc.stdin.write(json.dumps(cfg) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()  # "ready" once every socket is open
        if line.strip() != "ready":
            self._proc.kill()
            self._proc.wait()
            self._proc = None
            self._rows_file.close()
            if self._live is not None:
                self._live.stop()
                self._live = None
            raise RuntimeError(f"queue sampler process did not start: {line.strip() or 'no output'}")

    def _stop_process(self) -> None:
        import json

        proc, self._proc = self._proc, None
        if self._live is not None:
            self._live.stop()
            self._live = None
        try:
            proc.stdin.write("stop\n")
            proc.stdin.close()
        except OSError:
            pass
        try:
            out = proc.stdout.readline()
            proc.wait(timeout=60)
            try:
                st = json.loads(out)
            except ValueError:
                self._error = RuntimeError(f"queue sampler process failed (exit {proc.returncode}): {out.strip()}")
                return
            if st.get("error"):
                self._error = RuntimeError(f"queue sampler process: {st['error']}")
            self.ticks, self.t_first, self.t_last = st["ticks"], st["t_first"], st["t_last"]
            self._rows_file.seek(0)
            for ln in self._rows_file:
                t, node, ifn, lbl, *nums = ln.rstrip("\n").split("\t")
                self.rows.append((float(t), node, ifn, lbl, *map(int, nums)))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            self._rows_file.close()

    def __enter__(self) -> "QueueSampler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- the loop ----

    def _loop(self) -> None:
        socks: dict[str, object] = {}
        try:
            by_ns: dict[str, list[tuple[str, str, int]]] = {}
            for node, ns, ifn in self.ports:
                if ns not in socks:
                    with netns.entered(ns):
                        idx_of = {ifn: i for i, ifn in socket.if_nameindex()}
                    socks[ns] = (RawQdiscDump(ns) if self.backend == "raw" else netns.ipr(ns), idx_of)
                by_ns.setdefault(ns, []).append((node, ifn, socks[ns][1][ifn]))
            work = [(socks[ns][0], items) for ns, items in by_ns.items()]
        except BaseException as e:  # noqa: BLE001 - reported by start()
            self._error = e
            self._ready.set()
            for s, _ in socks.values():
                with contextlib.suppress(Exception):
                    s.close()
            return
        self._ready.set()
        rows = self.rows
        raw = self.backend == "raw"
        try:
            next_t = time.monotonic()
            self.t_first = next_t
            while not self._stop.is_set():
                for sock, items in work:
                    t = time.monotonic()
                    # one netlink dump per namespace per round, shared by its ports
                    if raw:
                        per_if = sock.leaf_stats()
                    else:
                        dump = _OneDump(sock)
                        per_if = {idx: qdisc.leaf_stats(dump, idx) for _, _, idx in items}
                    for node, ifn, idx in items:
                        plan = self._labels[(node, ifn)]
                        for q in per_if.get(idx, ()):
                            rows.append((t, node, ifn, plan.class_label(q.minor), q.backlog_bytes,
                                         q.backlog_packets, q.drops, q.marks, q.sent_bytes, q.sent_packets,
                                         q.overlimits))
                self.ticks += 1
                self.t_last = time.monotonic()
                next_t += self.interval_s
                delay = next_t - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                else:
                    next_t = time.monotonic()  # late: do not try to catch up with a burst of samples
        except BaseException as e:  # noqa: BLE001
            self._error = e
        finally:
            for s, _ in socks.values():
                with contextlib.suppress(Exception):
                    s.close()

    # ---- results ----

    @property
    def achieved_interval_s(self) -> float:
        """Mean time between the starts of two sampling rounds (every watched port once per round)."""
        if self.ticks < 2:
            return float("nan")
        return (self.t_last - self.t_first) / self.ticks

    def peak_backlog(self, node: str, port: str) -> int:
        return max((r[4] for r in self.rows if r[1] == node and r[2] == port), default=0)

    def mean_backlog(self, node: str, port: str, t0: float | None = None, t1: float | None = None) -> float:
        vals = [r[4] for r in self.rows if r[1] == node and r[2] == port
                and (t0 is None or r[0] >= t0) and (t1 is None or r[0] <= t1)]
        return sum(vals) / len(vals) if vals else 0.0

    def write(self, rundir) -> None:
        """queues.csv and cpu.csv into the run directory (testbed.rundir.RunDir)."""
        rundir.write_csv("queues.csv", QUEUE_COLUMNS,
                         ((f"{r[0]:.6f}", *r[1:]) for r in self.rows))
        rundir.write_csv("cpu.csv", CPU_COLUMNS, ((f"{t:.6f}", f"{b:.4f}") for t, b in self.cpu.rows))

    def stats(self) -> dict:
        return {"queue_sampler_backend": self.backend, "queue_sample_interval_s": self.achieved_interval_s,
                "queue_samples": self.ticks, "queue_ports_sampled": len(self.ports),
                "cpu_busy_fraction": self.cpu.mean_busy, "cpu_busy_peak": self.cpu.peak_busy}


def _open_ports(ports: list) -> dict[str, tuple[RawQdiscDump, list]]:
    """Per namespace of the config's ``ports`` (node, ns, ifname, {minor: class label}): a dump socket and the
    ports to read from it, as (node, ifname, ifindex, labels)."""
    work: dict[str, tuple[RawQdiscDump, list]] = {}
    for node, ns, ifn, labels in ports:
        if ns not in work:
            with netns.entered(ns):
                idx_of = {name: i for i, name in socket.if_nameindex()}
            work[ns] = (RawQdiscDump(ns), [], idx_of)
        work[ns][1].append((node, ifn, work[ns][2][ifn], {int(k): v for k, v in labels.items()}))
    return work


def _sample_round(work: dict, rows: list) -> None:
    """One round: a dump per namespace, a queues.csv row per watched leaf queue (timestamped at its dump)."""
    for sock, items, _ in work.values():
        t = time.monotonic()
        per_if = sock.leaf_stats()
        for node, ifn, idx, labels in items:
            for q in per_if.get(idx, ()):
                rows.append((t, node, ifn, labels.get(q.minor, f"1:{q.minor:x}"), q.backlog_bytes,
                             q.backlog_packets, q.drops, q.marks, q.sent_bytes, q.sent_packets, q.overlimits))


def _child_main() -> int:
    """`python -m testbed.measure.telemetry`: the process-mode sampler. Reads one JSON config line on stdin,
    prints "ready", samples until stdin says stop (or closes), writes rows (tab-separated) to the file named in the
    config and prints {"ticks", "t_first", "t_last"} as JSON."""
    import json
    import sys

    cfg = json.loads(sys.stdin.readline())
    interval = float(cfg["interval_s"])
    try:
        work = _open_ports(cfg["ports"])
    except Exception as e:  # noqa: BLE001
        print(f"error: {e}", flush=True)
        return 1
    print("ready", flush=True)
    live_file = cfg.get("live_file")
    live_due = 0.0
    rows = []
    ticks = 0
    t_first = t_last = next_t = time.monotonic()
    err = None
    stdin = sys.stdin.fileno()
    try:
        while True:
            first = len(rows)
            _sample_round(work, rows)
            ticks += 1
            t_last = time.monotonic()
            if live_file and t_last >= live_due:  # this round, for the live view
                liveview.write_snapshot(live_file, t_last,
                                        [(r[1], r[2], r[3], r[4], r[6], r[7], r[8]) for r in rows[first:]])
                live_due = t_last + liveview.SNAPSHOT_EVERY_S
            next_t += interval
            delay = next_t - time.monotonic()
            if delay < 0:
                next_t = time.monotonic()
                delay = 0
            if select.select([stdin], [], [], delay)[0]:
                break  # "stop" or EOF
    except Exception as e:  # noqa: BLE001
        err = str(e)
    with os.fdopen(cfg["rows_fd"], "w") as f:
        for r in rows:
            f.write(f"{r[0]:.6f}\t" + "\t".join(map(str, r[1:])) + "\n")
    print(json.dumps({"ticks": ticks, "t_first": t_first, "t_last": t_last, "error": err}), flush=True)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(_child_main())
