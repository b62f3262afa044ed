"""The run's own fidelity verdict, from its raw files (analysis.fidelity's checks): written into summary.json as
``fidelity_ok`` / ``fidelity_reasons`` and the figures behind them, with fidelity.csv beside it.

A software fabric on shared CPUs can stop modelling the network without failing; every lab run therefore measures,
at its end and from what it recorded: each shaped port's achieved rate while backlogged (a shaper or a CPU that did
not keep up), the queue sampler's achieved interval and worst gap (its timer lateness; a stall), and with PFC on
whether the controller reacted within what the headroom allows. Scenario-specific checks (a machine-limited incast,
CPU saturation) are the scenarios' own and arrive in the summary before this runs.
"""

from __future__ import annotations

from analysis import fidelity
from analysis.load import load_csv


def judge_run(rundir, summary: dict) -> None:
    """Every run measures whether the machine kept up (analysis.fidelity), from its raw files: each shaped port's
    achieved rate while backlogged (fidelity.csv, port_rate_ratio_min / port_rate_shortfall), the queue
    sampler's achieved interval and worst gap (sampler_*_ms), and, with PFC on, whether the controller reacted
    within what the headroom allows. A check that fires makes the run unfaithful (fidelity_ok false, its line
    first in fidelity_reasons)."""
    path = rundir.path
    found: list[str | None] = []
    if (path / "queues.csv").exists():
        queues = load_csv(path / "queues.csv", "queues")
        table = fidelity.port_rates(queues, load_csv(path / "ports.csv", "ports"),
                                    fidelity.excluded_intervals(load_csv(path / "pfc.csv", "pfc"),
                                                                load_csv(path / "events.csv", "events")))
        rundir.write_csv("fidelity.csv", list(table.columns), table.itertuples(index=False))
        judged = fidelity.judged_ports(table)
        summary["port_rate_ratio_min"] = float(judged["ratio"].min()) if len(judged) else None
        short = fidelity.port_shortfall(table)
        summary["port_rate_shortfall"] = short or ""
        timing = fidelity.sampler_timing(queues)
        summary.update(timing)
        stalled = fidelity.sampler_stalled(timing.get("sampler_gap_max_ms"))
        # Late timers make a run unfaithful where its timings pass through user-space wake-ups (a collective's or a
        # program's step hand-offs, an incast's rounds). Bulk kernel-TCP flows (pfc-hol, smoke) are paced by the
        # kernel: there a late sampler only samples coarser (the stall check above still applies), and a late PFC
        # controller is judged by its own check below. Lab 05 in the lab VM measured 45-66 ms on a quiet machine
        # with its lossless class at 0 drops in every run.
        late = fidelity.timers_late(timing.get("sampler_late_ms_p99")) if _has_handoffs(path) else None
        found += [short, stalled or late]
    found.append(fidelity.pfc_too_slow(summary))
    found = fidelity.reasons(*found)
    # every run says whether it was faithful (a scenario's own checks may already have said no)
    summary.setdefault("fidelity_ok", True)
    summary.setdefault("fidelity_reasons", "")
    if found:
        before = summary.get("fidelity_reasons") or ""
        summary["fidelity_ok"] = False
        summary["fidelity_reasons"] = ([*found, *before] if isinstance(before, list)
                                       else "; ".join(x for x in (*found, before) if x))


def _has_handoffs(path) -> bool:
    """The run recorded ops (a collective, a program) or incast rounds: steps that user-space agents hand off."""
    for name in ("ops.csv", "rounds.csv"):
        f = path / name
        try:
            with open(f) as fh:
                if fh.readline() and fh.readline():
                    return True
        except OSError:
            continue
    return False
