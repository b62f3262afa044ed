"""PFC on one run: the controller (testbed.pfc.controller) set up, started, stopped and accounted for, in one place for
every
scenario and lab that runs a lossless class.

    pfc = start_pfc(lab.net.fabric, lab.rundir, lab.on_teardown, interval_ms=1, frames=True, start=False)
    pfc.start()             # forks the controller: before the traffic's threads exist
    ... traffic ...
    summary.update(pfc.finish())      # stop, pfc.csv (+ queues.csv), pfc_* numbers and lossless_drops

:func:`start_pfc` builds the :class:`~testbed.pfc.controller.PfcController` over every lossless class of the fabric,
installs
its plugs (and, with ``frames``, the sockets that put each pause and resume on the link as an 802.1Qbb frame),
registers its clean-up with the run; :meth:`PfcRun.start` reads the class's queue counters (the "before" of the
lossless-drop accounting) and forks the controller. A fabric without a lossless class (a lossy baseline) can still
be watched: ``watch`` names the class whose queues the (disabled) controller then samples with the given thresholds,
so queues.csv, the drop accounting and the summary keys are those of the lossless run, with zero pauses.

:meth:`PfcRun.finish` stops the controller (idempotent), reads the counters again, writes ``pfc.csv`` (and
``queues.csv`` from the controller's own samples unless ``write_queues=False``: a run with its own queue sampler)
and returns ``PfcController.summary()`` plus ``lossless_drops`` (drops of the lossless class on switch ports
during the run; None without PFC). :meth:`PfcRun.delta` and :meth:`PfcRun.drops_by_port` give the other counts.
"""

from __future__ import annotations

from typing import Callable, Iterable

from testbed.pfc.controller import PfcController
from testbed.pfc.queues import class_queue


def watch_class(fabric, cls: str, pcp: int, xoff_bytes: int, xon_bytes: int, headroom_bytes: int,
                interval_s: float) -> PfcController:
    """A disabled controller over class ``cls`` of every port (a lossy fabric has no lossless class to find): it
    samples those queues as the lossless run would, and pauses nothing."""
    ctl = PfcController(fabric, interval_s=interval_s, enabled=False)
    for plan in fabric.port_plans:
        for minor, name, leaf, *_rest in plan.classes:
            if name == cls:
                ctl.queues[(plan.node, plan.ifname, minor)] = class_queue(fabric, plan, minor, leaf, name, pcp,
                                                                          xoff_bytes, xon_bytes, headroom_bytes)
    return ctl


class PfcRun:
    """One run's PFC controller with its counters before and after (see the module docstring)."""

    def __init__(self, controller: PfcController, rundir, write_queues: bool = True):
        self.controller = controller
        self.rundir = rundir
        self.write_queues = write_queues
        self.before: dict = {}
        self.after: dict | None = None
        self._summary: dict | None = None

    @property
    def enabled(self) -> bool:
        return self.controller.enabled

    @property
    def queues(self) -> dict:
        return self.controller.queues

    @property
    def switch_ports(self) -> list[tuple[str, str]]:
        return sorted({(q.node, q.port) for q in self.queues.values() if q.is_switch})

    @property
    def host_ports(self) -> list[tuple[str, str]]:
        return sorted({(q.node, q.port) for q in self.queues.values() if not q.is_switch})

    def class_stats(self) -> dict[tuple[str, str], object]:
        """{(node, port): QueueSample} of the watched class on every port now (one netlink dump per namespace)."""
        return {(n, p): st for (n, p, _), st in self.controller.class_stats(switch_only=False).items()}

    def start(self) -> "PfcRun":
        """Read the class's counters (the run's "before") and fork the controller process (do it before the
        traffic's threads exist)."""
        self.before = self.class_stats()
        self.controller.start()
        return self

    def stop(self) -> None:
        """Stop the controller (idempotent; every pause it holds is released)."""
        self.controller.stop()

    def delta(self, attr: str, ports: Iterable[tuple[str, str]]) -> int:
        """Growth of a counter (drops, marks, sent_packets, ...) of the class on ``ports`` during the run."""
        after = self.after if self.after is not None else self.class_stats()
        return sum(getattr(after[x], attr) - getattr(self.before[x], attr) for x in ports
                   if x in after and x in self.before)

    def drops_by_port(self) -> str:
        """``node:port=N; ...`` of the switch ports whose class dropped during the run."""
        return "; ".join(f"{n}:{i}={d}" for n, i in self.switch_ports if (d := self.delta("drops", [(n, i)])))

    def finish(self) -> dict:
        """Stop, read the counters, write pfc.csv (and queues.csv); the controller's summary plus
        ``lossless_drops``. Idempotent: a second call returns the same dict."""
        if self._summary is None:
            # the counters before the stop: stopping releases every pause, and traffic still running then drains
            # the paused queues into ports no longer protected; its drops are not the lossless class's
            self.after = self.class_stats()
            self.stop()
            self.controller.write(self.rundir, queues=self.write_queues)
            s = self.controller.summary()
            s["lossless_drops"] = self.delta("drops", self.switch_ports) if self.enabled else None
            self._summary = s
        return dict(self._summary)


def without_hosts(ctl: PfcController) -> None:
    """Pause switch ports only: the host NICs' lossless queues leave the controller (and every feeder list), so
    their leaf queues stay the fabric's (a host NIC pacing its QPs with DCQCN's fq cannot also hold a plug)."""
    hosts = [k for k, q in ctl.queues.items() if not q.is_switch]
    for k in hosts:
        del ctl.queues[k]
    for q in ctl.queues.values():
        q.feeders = [f for f in q.feeders if f in ctl.queues]


def start_pfc(fabric, rundir, on_teardown: Callable[[Callable[[], object]], None], *, interval_ms: float = 1.0,
              watchdog_ms: float = 0.0, watchdog_restore_ms: float = 200.0, enabled: bool = True,
              frames: bool = True, watch: dict | None = None, write_queues: bool = True,
              start: bool = True, pause_hosts: bool = True) -> PfcRun:
    """PFC on the fabric's lossless classes for this run (see the module docstring). ``enabled=False`` or a
    fabric without a lossless class: nothing is paused; ``watch`` (``cls, pcp, xoff_bytes, xon_bytes,
    headroom_bytes``) then says which class to sample. ``start=False``: call :meth:`PfcRun.start` later.
    ``pause_hosts=False``: only switch ports are paused (:func:`without_hosts`)."""
    ctl = PfcController(fabric, interval_s=interval_ms / 1000.0, watchdog_ms=watchdog_ms,
                        watchdog_restore_ms=watchdog_restore_ms, enabled=enabled, frames=frames)
    if not pause_hosts:
        without_hosts(ctl)
    if not ctl.queues and watch:
        ctl = watch_class(fabric, interval_s=interval_ms / 1000.0, **watch)
    on_teardown(ctl.close)
    fabric.pfc = ctl  # the fault timeline's pause storms go through it
    ctl.install()
    run = PfcRun(ctl, rundir, write_queues=write_queues)
    on_teardown(run.stop)
    return run.start() if start else run
