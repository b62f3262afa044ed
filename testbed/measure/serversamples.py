"""Queue and CPU samples of a fabric over servers, every server's taken on its own machine and brought back on the
reference server's clock (docs/servers.md, issue 29: "queue samples from both sides on one clock").

What it stands for: each switch's telemetry agent (a gNMI / sFlow collector on the switch's own CPU) timestamping
its counters with its own clock, and the collector that joins them putting every sample on one time base with the
clock offsets it measured. Here each server's agent runs the same QueueSampler a one-machine run uses
(testbed.measure.telemetry: every shaped port of its share, and its machine's CPU) and returns the rows at the end;
the reference moves each row's time by that server's ClockModel (analysis.clockoffset: the straight line through
the clock passes before and after), so ``queues.csv`` over servers reads like a one-machine run's and each row is
within its server's bound of the reference clock.

    agent side:  ShareSampling.start(fabric, interval_ms) ... .stop() -> rows   (serveragent's sample_* ops)
    lab side:    s = sample_servers(fab, every_ms) ... s.stop(models) -> ServerSamples
    a job:       ServersSampler(fab, every_ms, models) : start / stop / write(rundir) / stats, as QueueSampler
"""

from __future__ import annotations

from dataclasses import dataclass, field


class ShareSampling:
    """The agent's half: one QueueSampler over this server's share at a time."""

    def __init__(self) -> None:
        self.sampler = None

    def start(self, fabric, interval_ms: float) -> dict:
        from testbed.measure.telemetry import QueueSampler

        if fabric is None:
            raise ValueError("no share is built: build_share first")
        if self.sampler is not None:
            raise ValueError("the share is sampled already: sample_stop first")
        if not 0 < float(interval_ms) <= 10_000:
            raise ValueError(f"interval_ms must be in (0, 10000], got {interval_ms!r}")
        self.sampler = QueueSampler(fabric, interval_s=float(interval_ms) / 1000.0).start()
        return {"ports": len(self.sampler.ports)}

    def stop(self) -> dict:
        """Stop; the queue rows (queues.csv's columns, time first), the CPU rows (time, busy fraction) and the
        sampler's stats, each time on this machine's CLOCK_MONOTONIC."""
        s, self.sampler = self.sampler, None
        if s is None:
            raise ValueError("the share is not being sampled")
        s.stop()
        return {"queues": [list(r) for r in s.rows], "cpu": [list(r) for r in s.cpu.rows], "stats": s.stats()}

    def teardown(self) -> None:
        """The agent is going: stop a sampler still running (its rows are dropped)."""
        if self.sampler is not None:
            s, self.sampler = self.sampler, None
            s.stop()


@dataclass
class ServerSamples:
    """Every server's samples on the reference clock: ``queues`` (queues.csv rows of all servers, by time), ``cpu``
    (server -> its (time, busy fraction) rows) and ``stats`` (server -> its sampler's stats, with the clock bound
    its rows carry, ``clock_uncertainty_s``)."""

    queues: list[tuple] = field(default_factory=list)
    cpu: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    stats: dict[str, dict] = field(default_factory=dict)


class RunningSamples:
    """The lab's half, started by :func:`sample_servers`: every server's agent sampling its share."""

    def __init__(self, fab, every_ms: float):
        self.fab = fab
        self.servers = [n for n in fab.links if n in fab.placement.servers and fab.placement.nodes_on(n)]
        for n in self.servers:
            fab.links[n].call("sample_start", interval_ms=float(every_ms))

    def stop(self, models: dict) -> ServerSamples:
        """Stop every server's sampler and put its rows on the reference clock with ``models`` (server ->
        analysis.clockoffset.ClockModel; None or absent: the reference's own rows)."""
        return on_reference_clock(self.collect(), models)

    def collect(self) -> dict[str, dict]:
        """Stop every server's sampler (at once: the fabric's ``on_each``): server -> its ``sample_stop`` reply, times
        on its own clock. RuntimeError naming the servers that failed or did not answer."""
        try:
            return self.fab.on_each("sample_stop", self.servers, timeout_s=120)
        except RuntimeError as e:   # the fabric's AgentError, named as what was lost
            raise RuntimeError(f"samples not brought back: {e}") from None


def on_reference_clock(got: dict[str, dict], models: dict) -> ServerSamples:
    """Each server's ``sample_stop`` reply with its times moved by its clock model (pure)."""
    out = ServerSamples()
    for name, r in got.items():
        m = models.get(name)
        to_ref = (lambda t: t) if m is None else m.to_reference
        out.queues += [(to_ref(float(row[0])), *row[1:]) for row in r["queues"]]
        out.cpu[name] = [(to_ref(float(t)), float(b)) for t, b in r["cpu"]]
        out.stats[name] = {**r["stats"], "clock_uncertainty_s": 0.0 if m is None else m.uncertainty_s}
    out.queues.sort(key=lambda row: row[0])
    return out


def sample_servers(fab, every_ms: float = 1.0) -> RunningSamples:
    """Start every server's queue sampler (``every_ms``) on its share of ``fab`` (a built ServerFabric)."""
    return RunningSamples(fab, every_ms)


class ServersSampler:
    """QueueSampler's face (start, stop, write, stats) over a fabric on servers, for a collective job
    (testbed.workloads.collective): ``write`` puts every server's rows on the reference clock with ``models()``
    (server -> ClockModel, known once the job's clock pass after it is taken, i.e. after ``stop``) and writes
    queues.csv (every server's ports) and cpu.csv (the reference server's CPU); the run's manifest gets each
    server's sampler stats (``servers_sampling``); :meth:`stats` is the worst server's, for the fidelity verdict."""

    def __init__(self, fab, every_ms: float, models):
        self.fab, self.every_ms, self.models = fab, float(every_ms), models
        self.running: RunningSamples | None = None
        self.got: dict[str, dict] = {}
        self.samples: ServerSamples | None = None

    def start(self) -> "ServersSampler":
        self.running = sample_servers(self.fab, self.every_ms)
        return self

    def stop(self, rundir=None) -> None:
        running, self.running = self.running, None
        if running is not None:
            self.got = running.collect()
        if rundir is not None:
            self.write(rundir)

    def write(self, rundir) -> None:
        from testbed.measure.telemetry import CPU_COLUMNS, QUEUE_COLUMNS

        self.samples = on_reference_clock(self.got, self.models())
        rundir.write_csv("queues.csv", QUEUE_COLUMNS, ((f"{r[0]:.6f}", *r[1:]) for r in self.samples.queues))
        ref = next(iter(self.fab.links))
        rundir.write_csv("cpu.csv", CPU_COLUMNS, ((f"{t:.6f}", f"{b:.4f}") for t, b in self.samples.cpu.get(ref, [])))
        rundir.manifest["servers_sampling"] = self.samples.stats
        rundir.write_manifest()

    def stats(self) -> dict:
        """The worst server's: the longest achieved interval, the fewest rounds, the busiest CPU; ports summed."""
        st = list(self.samples.stats.values()) if self.samples else []
        if not st:
            return {}
        return {"queue_sampler_backend": st[0]["queue_sampler_backend"],
                "queue_sample_interval_s": max(x["queue_sample_interval_s"] for x in st),
                "queue_samples": min(x["queue_samples"] for x in st),
                "queue_ports_sampled": sum(x["queue_ports_sampled"] for x in st),
                "cpu_busy_fraction": max(x["cpu_busy_fraction"] for x in st),
                "cpu_busy_peak": max(x["cpu_busy_peak"] for x in st)}


def sampled_port_delta(queues) -> dict[tuple[str, str], dict[str, int]] | None:
    """A servers run's ports' counters over the job (drops, marks, sent bytes and packets, overlimits), from
    queues.csv: each class's growth from its first sample to its last (analysis.metrics.counter_deltas, which also
    bridges a counter reset), summed per port; every server's sampler runs from the ranks' ready to after the job, the
    window over which a one-machine run reads its qdisc counters. None without samples (``sample_interval_ms=0``:
    the far ports' counters are not read)."""
    from analysis.metrics import port_counter_deltas

    if queues is None or not len(queues):
        return None
    d = port_counter_deltas(queues)
    counters = [c for c in d.columns if c not in ("node", "port")]
    return {(r["node"], r["port"]): {c: int(r[c]) for c in counters} for r in d.to_dict("records")}
