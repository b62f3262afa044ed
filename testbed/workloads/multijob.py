"""Several jobs on one live lab at the same time: collective jobs on disjoint hosts beside storage traffic, as a
shared cluster runs them (the seed article's section 03: noisy neighbour jobs, checkpointing, dataset streaming).

    ran = run_together(lab, jobs, checkpoints, datasets)   # entries of testbed.commands.jobsfile
    ran.summaries["train"]                                 # that job's summary.json numbers

Each collective job is a :class:`testbed.workloads.collective.CollectiveJob` with its own run directory under the
lab's (``<run>/<job>/``: manifest.json, ops.csv, sweep.csv, tcp.csv, queues.csv, summary.json) and its own agents
and fork server; the jobs run in threads. When every job's agents are connected (a barrier in each job's
``on_ready``) the jobs' common t = 0 is taken; each job's go waits for its ``start_s`` after it, and the storage
traffic starts on the same clock. Checkpoints: every writer sends its block to the storage host at the same instant over
a persistent TCP connection (traffic.incast), ``count`` times ``every_s`` apart, stopped early when the last job ends.
Inference: request/response windows, the clients' requests as one synchronized round into the server, then its responses
to every client at once, ``count`` of them ``every_s`` apart. Datasets: one paced bulk TCP flow from the storage host to
each reader (``lab.flows``), until its duration or the last job's end. The lab's own folder gets ``storage.csv`` (one
row per checkpoint write, dataset flow and inference request/response) and ``port_deltas.csv`` (every shaped port's
kernel counters from t = 0 until the storage traffic has stopped after the last job's end: every byte storage.csv
counts is inside that window).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import threading
import time
from dataclasses import dataclass, field

from testbed.kernel import netns
from testbed.rundir import RunDir
from testbed.workloads.collective import CollectiveJob
from traffic.incast import IncastRounds
from traffic.placement import Placement

STORAGE_COLUMNS = ["kind", "name", "src", "dst", "index", "start_s", "end_s", "bytes", "seconds", "goodput_mbps"]
PORT_COLUMNS = ["node", "port", "sent_bytes", "sent_packets", "drops", "marks"]
#: how long the jobs wait for each other's agents to connect
READY_TIMEOUT_S = 300.0


@dataclass
class Ran:
    """What :func:`run_together` measured: each job's summary, the storage rows, the ports' counters, t = 0."""
    summaries: dict[str, dict] = field(default_factory=dict)
    storage: list[dict] = field(default_factory=list)
    ports: dict = field(default_factory=dict)
    t0: float = 0.0
    errors: dict[str, str] = field(default_factory=dict)


def _job(lab, entry, on_ready) -> CollectiveJob:
    """The entry's job planned on the lab's fabric, on exactly its hosts, writing into ``<run>/<name>/``."""
    s = entry.settings
    plan = s.plan(lab.net.spec, lab.seed)
    plan = dataclasses.replace(plan, placement=Placement(entry.hosts, entry.leaves, entry.policy,
                                                         plan.placement.seed))
    rundir = RunDir(lab.path / entry.name, "collective", {"job": entry.name, **s.knobs(), "dscp": s.dscp,
                                                          "start_s": entry.start_s}, lab.seed)
    return CollectiveJob(lab, plan, s.transport, s.cc or lab.net.spec.tcp.congestion_control, s.dscp,
                         dataclasses.asdict(s.rdma), s.verify, s.timeout_s, s.sample_interval_ms, rundir=rundir,
                         on_ready=on_ready, uet={"entropy_values": s.entropy_values})


class _Checkpoints:
    """One [[checkpoint]] entry's periodic writes, in a thread (see the module docstring)."""

    def __init__(self, lab, c, done: threading.Event):
        self.c, self.name, self.done, self.rows = c, c.name, done, []
        self.inc = IncastRounds(list(c.hosts), c.storage, lab.endpoints([c.storage, *c.hosts]), netns.entered,
                                c.size_bytes, port=lab.next_ports(1), cc=lab.net.spec.tcp.congestion_control)
        self.inc.connect()
        lab.on_teardown(self.inc.close)
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"checkpoint-{c.name}")
        self.error = ""

    def start(self, t0: float) -> None:
        self.t0 = t0
        self.thread.start()

    def _run(self) -> None:
        c = self.c
        try:
            for k in range(c.count):
                if self.done.wait(max(0.0, self.t0 + c.start_s + k * c.every_s - time.monotonic())):
                    return
                for r, h, s, e, b in self.inc.run(1, first_round=k):
                    self.rows.append({"kind": "checkpoint", "name": c.name, "src": h, "dst": c.storage, "index": r,
                                      "start_s": s, "end_s": e, "bytes": b, "seconds": e - s,
                                      "goodput_mbps": b * 8 / (e - s) / 1e6 if e > s else 0.0})
        except Exception as e:  # noqa: BLE001 - reported with the run
            self.error = f"checkpoint {c.name}: {e}"


class _Inference:
    """One [[inference]] entry's request/response windows, in a thread: the clients' requests as one synchronized
    round into the server (traffic.incast), then the server's responses to every client at once (one round each,
    in threads); a row per client and window, from the window's start to that client's response."""

    def __init__(self, lab, w, done: threading.Event):
        self.w, self.name, self.done, self.rows, self.error = w, w.name, done, [], ""
        cc, ends = lab.net.spec.tcp.congestion_control, lab.endpoints([w.server, *w.hosts])
        self.requests = IncastRounds(list(w.hosts), w.server, ends, netns.entered, w.request_bytes,
                                     port=lab.next_ports(1), cc=cc)
        self.responses = [IncastRounds([w.server], h, ends, netns.entered, w.response_bytes, port=lab.next_ports(1),
                                       cc=cc) for h in w.hosts]
        for inc in (self.requests, *self.responses):
            inc.connect()
            lab.on_teardown(inc.close)
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"inference-{w.name}")

    def start(self, t0: float) -> None:
        self.t0 = t0
        self.thread.start()

    def _window(self, k: int) -> None:
        w = self.w
        req = self.requests.run(1, first_round=k)
        t_start = min(r[2] for r in req)
        got: dict[str, tuple] = {}
        threads = [threading.Thread(target=lambda h=h, inc=inc: got.__setitem__(h, inc.run(1, first_round=k)[0]))
                   for h, inc in zip(w.hosts, self.responses)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for h in w.hosts:
            if h not in got:
                raise RuntimeError(f"no response reached {h} in window {k}")
            end = got[h][3]
            self.rows.append({"kind": "inference", "name": w.name, "src": h, "dst": w.server, "index": k,
                              "start_s": t_start, "end_s": end, "bytes": w.request_bytes + w.response_bytes,
                              "seconds": end - t_start, "goodput_mbps": ((w.request_bytes + w.response_bytes) * 8
                                                                         / (end - t_start) / 1e6)})

    def _run(self) -> None:
        w = self.w
        try:
            for k in range(w.count):
                if self.done.wait(max(0.0, self.t0 + w.start_s + k * w.every_s - time.monotonic())):
                    return
                self._window(k)
        except Exception as e:  # noqa: BLE001 - reported with the run
            self.error = f"inference {w.name}: {e}"


def _datasets(lab, datasets, t0: float, done: threading.Event) -> list:
    """Start each dataset's flows at its start_s (timers); returns [(entry, [Flows handle or None])]."""
    started = [(d, []) for d in datasets]

    def go(d, box):
        if not done.is_set():
            box.append(lab.flows([(d.storage, h) for h in d.hosts], duration_s=d.duration_s or None,
                                 dscp=d.dscp, rate_mbps=d.rate_mbps))
    for d, box in started:
        delay = max(0.0, t0 + d.start_s - time.monotonic())
        if delay <= 0:
            go(d, box)
        else:
            t = threading.Timer(delay, go, (d, box))
            t.daemon = True
            t.start()
            lab.on_teardown(t.cancel)
    return started


def _dataset_rows(started) -> list[dict]:
    rows = []
    for d, box in started:
        for handle in box:
            for i, s in enumerate(handle.stop()):
                rows.append({"kind": "dataset", "name": d.name, "src": s["src"], "dst": s["dst"], "index": i,
                             "start_s": s["start_s"], "end_s": s["end_s"], "bytes": s["bytes"],
                             "seconds": s["seconds"], "goodput_mbps": s["goodput_mbps"]})
    return rows


def _run_jobs(lab, jobs: dict, barrier: threading.Barrier, ran: Ran) -> list[threading.Thread]:
    def work(name: str, job: CollectiveJob) -> None:
        try:
            job.run()
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            ran.errors[name] = str(e)
            barrier.abort()
    threads = [threading.Thread(target=work, args=(n, j), daemon=True, name=f"job-{n}") for n, j in jobs.items()]
    for t in threads:
        t.start()
    return threads


def run_together(lab, entries, checkpoints=(), datasets=(), inference=()) -> Ran:
    """Run the collective jobs ``entries`` and the storage traffic together on ``lab`` (module docstring). Returns
    a :class:`Ran`; a job that failed is in ``errors`` (its summary missing)."""
    ran, done = Ran(), threading.Event()
    box: dict = {}

    def zero() -> None:  # run once, by the last to arrive, before any job is released: the common t = 0
        box["counters"] = lab.port_deltas()
        ran.t0 = time.monotonic()
    barrier = threading.Barrier(len(entries) + 1, action=zero)
    start_of = {e.name: e.start_s for e in entries}

    def ready(name: str):
        def wait() -> None:
            barrier.wait(READY_TIMEOUT_S)
            time.sleep(max(0.0, ran.t0 + start_of[name] - time.monotonic()))
        return wait
    jobs = {e.name: _job(lab, e, ready(e.name)) for e in entries}
    cps = [_Checkpoints(lab, c, done) for c in checkpoints] + [_Inference(lab, w, done) for w in inference]
    threads = _run_jobs(lab, jobs, barrier, ran)
    flows: list = []
    try:
        barrier.wait(READY_TIMEOUT_S)
        lab.start_workload()
        lab.progress(f"{len(jobs)} job(s) ready: t = 0" + (f"; {len(cps)} checkpoint/inference entries, "
                                                          f"{len(datasets)} dataset stream(s)" if cps or datasets
                                                          else ""))
        for cp in cps:
            cp.start(ran.t0)
        flows = _datasets(lab, datasets, ran.t0, done)
    except threading.BrokenBarrierError:
        pass
    for t in threads:
        t.join()
    done.set()
    streamed = _dataset_rows(flows)  # the streams stop with the last job
    for cp in cps:  # a checkpoint write or inference window under way finishes
        if cp.thread.ident is not None:
            cp.thread.join()
        ran.storage += cp.rows
        if cp.error:
            ran.errors[cp.name] = cp.error
    ran.storage += streamed
    # read last, so that the ports' window holds every byte the storage rows count (a write that finished after the
    # last job, a stream's last second): the ports' counters are read against its rows
    ran.ports = box["counters"].stop() if "counters" in box else {}
    _write(lab, ran)
    for name, job in jobs.items():
        if name in ran.errors:
            continue
        table = io.StringIO()
        with contextlib.redirect_stdout(table):  # the nccl-tests table of each job goes into its folder
            ran.summaries[name] = job.summary()
        (job.rundir.path / "nccl.txt").write_text(table.getvalue())
        job.rundir.finish(ran.summaries[name])
    return ran


def _write(lab, ran: Ran) -> None:
    lab.rundir.write_csv("storage.csv", STORAGE_COLUMNS, ([r[c] for c in STORAGE_COLUMNS] for r in ran.storage))
    lab.rundir.write_csv("port_deltas.csv", PORT_COLUMNS, (
        [n, p, d.get("sent_bytes", 0), d.get("sent_packets", 0), d.get("drops", 0), d.get("marks", 0)]
        for (n, p), d in sorted(ran.ports.items())))


__all__ = ["Ran", "run_together", "STORAGE_COLUMNS", "PORT_COLUMNS"]
