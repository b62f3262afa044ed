"""The Lab API: an experiment is a short script.

    from testbed.lab import Lab
    from topologies.mininet_topo import LeafSpineTopo

    with Lab(LeafSpineTopo(spines=2, leaves=2, hosts_per_leaf=2), out="results/look", seed=1) as lab:
        lab.sample_queues(every_ms=1)
        print(lab.net["h1"].cmd("ping -c3", lab.net["h4"].IP()))
        lab.cli()                       # Mininet's CLI on the live fabric; the samplers keep running
    # leaving the block stops the samplers, writes the run directory and tears everything down

A :class:`Lab` is one run: it checks the output folder and root before creating anything (one line, exit status 2
from the CLI), records what it creates in the run's state (so ``testbed clean`` finds a killed run's leftovers),
builds the network as a :class:`~testbed.net.TestbedNet` (``lab.net`` is the Mininet object: ``lab.net['h1']``,
``pingAll``, ``iperf``), writes ``manifest.json`` (resolved parameters, seed, topology, kernel, versions), and tears
down on success, failure, Ctrl-C and SIGTERM. The manifest says ``complete: true`` only when the block ended
normally.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable

from testbed.errors import require_root


class Lab:
    """One experiment on one emulated fabric (see the module docstring).

    ``topo``: a Mininet ``Topo`` (``topologies.mininet_topo``'s or any user-written one); ``out``: the run directory
    (default ``results/<name>-<time>``); ``seed``: fixes the fabric's ECMP hash seed and every schedule drawn from
    :attr:`rng`; ``name``/``params``: what the manifest records as scenario and parameters; ``rxe``: a SoftRoCE device
    on every host."""

    def __init__(self, topo, out: str | Path | None = None, seed: int = 1, name: str = "lab",
                 params: dict[str, Any] | None = None, rxe: bool = False, quiet: bool = False):
        from testbed.errors import UsageError
        from testbed.params import SEED_HELP, SEED_MAX
        from testbed.rundir import check_out_dir, default_out

        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= SEED_MAX:
            raise UsageError(f"seed: {SEED_HELP} (got {seed!r})")
        self.seed = seed
        self.topo = topo
        self.name = name
        self.params = dict(params or {})
        self.rxe = rxe
        self.quiet = quiet
        self.out = check_out_dir(out) if out is not None else default_out(name)
        self.net = None
        self.rundir = None
        self.state = None
        self.summary: dict[str, Any] = {}
        self._teardown: list[Callable[[], None]] = []
        self._old_sigterm = None

    # ---- progress ----

    def progress(self, msg: str) -> None:
        if not self.quiet:
            t0 = self.rundir.manifest["t0_monotonic"] if self.rundir else time.monotonic()
            print(f"[{time.monotonic() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

    # ---- lifetime ----

    def __enter__(self) -> "Lab":
        from testbed.net import TestbedNet
        from testbed.rundir import RunDir
        from testbed.state import RunState

        require_root(f"a lab ({self.name})")
        self._install_sigterm()
        try:
            self.state = RunState()
            self.state.save()
            self.rundir = RunDir(self.out, self.name, self.params, self.seed)
            self.net = TestbedNet(self.topo, state=self.state, rxe=self.rxe, progress=self.progress, build=False)
            self.net.build()
            self.net.start()
            self.rundir.manifest["topology"] = self.net.fabric.describe()
            self.rundir.write_manifest()
        except BaseException:
            self._close()
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self._close()
        finally:
            if exc_type is None and self.rundir is not None:
                self.rundir.finish(self.summary)

    def on_teardown(self, fn: Callable[[], None]) -> None:
        """Register an undo step; they run in reverse order before the network goes, whatever happens."""
        self._teardown.append(fn)

    def _close(self) -> None:
        self.progress("tearing down")
        for fn in reversed(self._teardown):
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - keep undoing the rest
                print(f"testbed: teardown step failed: {e}", file=sys.stderr)
        self._teardown.clear()
        if self.net is not None:
            self.net.stop()
        if self.state is not None:
            self.state.drop()
        if self._old_sigterm is not None:
            signal.signal(signal.SIGTERM, self._old_sigterm)
            self._old_sigterm = None

    def _install_sigterm(self) -> None:
        main_pid = os.getpid()

        def on_sigterm(signum, frame):
            if os.getpid() != main_pid:  # a forked helper (pyroute2) inherited this handler: it just dies
                os._exit(128 + signum)
            raise KeyboardInterrupt

        self._old_sigterm = signal.signal(signal.SIGTERM, on_sigterm)

    # ---- the network ----

    @property
    def path(self) -> Path:
        return Path(self.out)

    @property
    def hosts(self) -> list:
        """The Mininet host objects, in topology order."""
        return list(self.net.hosts)

    def node(self, name: str):
        return self.net[name]

    def ports(self) -> list[tuple[str, str, str]]:
        """(node, namespace, ifname) of every shaped egress port."""
        return self.net.fabric.ports()

    # ---- measurement ----

    def sample_queues(self, every_ms: float = 1.0, ports: list[tuple[str, str]] | None = None):
        """Sample the backlog, drops and marks of ``ports`` ((node, ifname); default: every shaped port) every
        ``every_ms`` until the lab ends; ``queues.csv`` is written then. Returns the sampler."""
        from testbed.telemetry import QueueSampler

        sampler = QueueSampler(self.net.fabric, interval_s=every_ms / 1000.0, ports=ports).start()

        def stop() -> None:
            sampler.stop()
            sampler.write(self.rundir)

        self.on_teardown(stop)
        return sampler

    def port_counters(self) -> dict[tuple[str, str], dict[str, int]]:
        """Sent/dropped/marked totals of every shaped port now (one netlink dump per namespace)."""
        from testbed.telemetry import port_totals

        return port_totals(self.ports())

    # ---- looking around ----

    def cli(self) -> None:
        """Mininet's CLI on the live fabric (``exit`` or Ctrl-D returns to the script; samplers keep running)."""
        from testbed.net import TestbedCLI

        TestbedCLI(self.net)
