"""The decision of a canary rollout (issue 27 item 4; the seed article's "canary jobs after firmware and driver
changes, rollback playbooks for transport-level tuning changes"): a tuning change ran on a canary slice of the
fabric beside an untouched control slice of the same shape, the same job on both, n runs a side; is it rolled out?

The metric is the job's completion time (lower is better), one value per run. :func:`decide` compares canary
against control with :func:`analysis.stats.compare` (ratio of medians canary / control with its bootstrap 95%
interval, Mann-Whitney U) and applies the rule, in this order:

1. a canary run that failed (a job that did not finish) -> **roll back**;
2. fewer than ``stats.MIN_RUNS_FOR_VERDICT`` runs on a side -> **roll back** (no comparison can be told);
3. the canary is slower, told apart from the control (verdict ``A > B``), and its median ratio is above the
   ``tolerance`` (default 1.10: the slowdown an operator accepts from a tuning change) -> **roll back**;
4. the ratio's interval reaches above ``ceiling`` (default 1.5): a slowdown that large cannot be ruled out with
   these runs, even if not told -> **roll back** (a change is not rolled out on hope; ``runs_needed`` says how many
   runs would tell);
5. otherwise -> **roll out**.

After a roll out the change is applied fabric-wide and the job runs once more on every slice at once;
:func:`verify` keeps the roll out when each slice's time is within the canary's interval (at most its high end) or
not worse than the control beyond the tolerance (at most ``tolerance`` x the control's median), else the change is
rolled back. :func:`log_markdown` writes the decision log, the verdict first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from analysis import stats

ROLL_OUT = "roll out"
ROLL_BACK = "roll back"
DEFAULT_TOLERANCE = 1.10
DEFAULT_CEILING = 1.5


@dataclass(frozen=True)
class Rule:
    """The thresholds of :func:`decide` (see the module docstring)."""
    tolerance: float = DEFAULT_TOLERANCE
    ceiling: float = DEFAULT_CEILING

    def __post_init__(self) -> None:
        if not (1.0 <= self.tolerance <= self.ceiling):
            raise ValueError(f"need 1 <= tolerance <= ceiling (got {self.tolerance:g}, {self.ceiling:g})")

    def text(self) -> str:
        return (f"roll back if a canary run failed, if a side has fewer than {stats.MIN_RUNS_FOR_VERDICT} runs, if "
                f"the canary is told slower (Mann-Whitney, ratio interval above 1) with a median ratio above "
                f"{self.tolerance:g}, or if the ratio's 95% interval reaches above {self.ceiling:g}; else roll out")


@dataclass(frozen=True)
class Decision:
    """What :func:`decide` concluded: ``action`` (ROLL_OUT / ROLL_BACK), ``reason`` (one sentence) and the
    comparison it rests on (``diff``: canary = A, control = B)."""
    action: str
    reason: str
    diff: stats.Difference
    failed_runs: int = 0
    rule: Rule = field(default_factory=Rule)

    @property
    def rolled_out(self) -> bool:
        return self.action == ROLL_OUT

    def as_dict(self) -> dict:
        return {"action": self.action, "reason": self.reason, "failed_canary_runs": self.failed_runs,
                "rule": self.rule.text(), "tolerance": self.rule.tolerance, "ceiling": self.rule.ceiling,
                "comparison": self.diff.as_dict()}


def decide(canary_ms: Sequence[float], control_ms: Sequence[float], failed_canary_runs: int = 0,
           rule: Rule = Rule()) -> Decision:
    """Roll out or roll back (the module docstring's rule), from each side's per-run completion times."""
    d = stats.compare(canary_ms, control_ms)
    r = d.ratio
    if failed_canary_runs:
        return Decision(ROLL_BACK, f"{failed_canary_runs} canary run(s) failed", d, failed_canary_runs, rule)
    if min(d.a.n, d.b.n) < stats.MIN_RUNS_FOR_VERDICT:
        return Decision(ROLL_BACK, f"too few runs to compare ({d.a.n} canary, {d.b.n} control; at least "
                                   f"{stats.MIN_RUNS_FOR_VERDICT} a side)", d, 0, rule)
    if d.verdict == "A > B" and r > rule.tolerance:
        return Decision(ROLL_BACK, f"the canary is slower: {r:.2f}x the control [{d.ratio_low:.2f}, "
                                   f"{d.ratio_high:.2f}], above the tolerance {rule.tolerance:g}", d, 0, rule)
    if math.isnan(d.ratio_high) or d.ratio_high > rule.ceiling:
        more = f"; about {d.runs_needed} runs a side would tell" if d.runs_needed else ""
        return Decision(ROLL_BACK, f"a slowdown cannot be ruled out: the ratio's interval [{d.ratio_low:.2f}, "
                                   f"{d.ratio_high:.2f}] reaches above {rule.ceiling:g}{more}", d, 0, rule)
    how = {"A < B": "faster than", "A > B": "slower than"}.get(d.verdict, "not distinguishable from")
    return Decision(ROLL_OUT, f"the canary is {how} the control: {r:.2f}x [{d.ratio_low:.2f}, {d.ratio_high:.2f}], "
                              f"within the tolerance {rule.tolerance:g}", d, 0, rule)


@dataclass(frozen=True)
class Verification:
    """The fabric-wide run after a roll out: each slice's time, the bound it had to meet, and whether all did."""
    values_ms: tuple[float, ...]
    bound_ms: float
    ok: bool

    def as_dict(self) -> dict:
        return {"values_ms": list(self.values_ms), "bound_ms": self.bound_ms, "ok": self.ok}


def verify(values_ms: Iterable[float], decision: Decision) -> Verification:
    """Every slice's fabric-wide time at most max(the canary interval's high end, tolerance x control median);
    a slice without a value (its job failed) fails the check."""
    vals = tuple(float(v) for v in values_ms)
    d = decision.diff
    bound = max(d.a.high, decision.rule.tolerance * d.b.median)
    ok = bool(vals) and all(math.isfinite(v) and v <= bound for v in vals)
    return Verification(vals, float(bound), ok)


def _side(name: str, e: stats.Estimate) -> str:
    return f"| {name} | {e.n} | {e.median:.1f} | [{e.low:.1f}, {e.high:.1f}] | {e.coverage:.0%} |"


def log_markdown(change: str, canary: str, control: str, decision: Decision, verification: Verification | None,
                 final: str, notes: Sequence[str] = ()) -> str:
    """The decision log: the final action first, then what changed where, each side's runs, the comparison, the
    rule and the verification."""
    d = decision.diff
    lines = [f"# Canary: {final.upper()}", "",
             f"**{final}** `{change}`: {decision.reason}."]
    if verification is not None:
        slices = ", ".join(f"{v:.1f}" for v in verification.values_ms)
        outcome = "passed" if verification.ok else "FAILED, rolled back"
        lines.append(f"Fabric-wide check after the roll out: slices at {slices} ms against a bound of "
                     f"{verification.bound_ms:.1f} ms: {outcome}.")
    lines += ["", f"- change: `{change}`", f"- canary slice: {canary}", f"- control slice: {control} (untouched)",
              "", "| side | runs | job time median (ms) | interval (ms) | coverage |", "|---|---|---|---|---|",
              _side("canary", d.a), _side("control", d.b), "",
              f"Ratio canary / control: {d.ratio:.3f} [{d.ratio_low:.3f}, {d.ratio_high:.3f}] (bootstrap 95%), "
              f"Mann-Whitney p = {d.p_value:.3g}, verdict `{d.verdict}`"
              + (f", about {d.runs_needed} runs a side would tell" if d.runs_needed else "") + ".", "",
              f"Rule: {decision.rule.text()}."]
    lines += [f"\n{n}" for n in notes]
    return "\n".join(lines) + "\n"


def summary_numbers(decision: Decision, verification: Verification | None, final: str,
                    rounds_ms: dict[str, Sequence[float]], readback_ok: bool) -> dict[str, float]:
    """A canary's numbers for summary.json (analysis.metricnames' canary group): the final action as
    ``rolled_back`` / ``rolled_out`` (1/0), ``rollout_verified`` (1 when a roll out passed its fabric-wide check,
    else 0), ``readback_verified`` (1 when every kernel read-back held what that step meant to set), the ratio canary
    / control of the job times' medians with its 95% interval ends, each side's median job time, and each side's
    round p99 over all its rounds of the canary phase (``rounds_ms``: side -> round times in ms; nearest rank, an
    observed round: of 5 runs x 20 rounds, the second slowest)."""
    from analysis.metrics.samples import nearest_rank

    d = decision.diff
    out = {"rolled_back": int(final == ROLL_BACK), "rolled_out": int(final == ROLL_OUT),
           "rollout_verified": int(verification is not None and verification.ok and final == ROLL_OUT),
           "readback_verified": int(bool(readback_ok)), "canary_ratio": float(d.ratio),
           "canary_ratio_low": float(d.ratio_low), "canary_ratio_high": float(d.ratio_high),
           "canary_job_ms_median": float(d.a.median), "control_job_ms_median": float(d.b.median),
           "canary_runs": int(d.a.n), "control_runs": int(d.b.n)}
    for side in ("canary", "control"):
        out[f"{side}_round_ms_p99"] = nearest_rank(rounds_ms.get(side, ()), 0.99)
    return out


__all__ = ["DEFAULT_CEILING", "DEFAULT_TOLERANCE", "Decision", "ROLL_BACK", "ROLL_OUT", "Rule", "Verification",
           "decide", "log_markdown", "summary_numbers", "verify"]
