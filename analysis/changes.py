"""What differs between runs, and how large a change is: the vocabulary both comparisons (:mod:`analysis.compare`)
lead with.

* :func:`param_texts` / :func:`param_diff`: a run's configuration as text (scenario, every parameter, where it ran)
  and the values that are not the same on every side;
* :func:`change_text` / :func:`change_size`: a change a ratio cannot say (``0 -> 664 (new)``, ``664 -> 0 (gone)``)
  and its size (``|log ratio|``, a change from or to 0 the largest);
* :func:`change_order`: rows by the size of the change, verdicts first, echoes of a parameter and metrics of the
  machine (CPU, sampler) after the experiment's own.
"""

from __future__ import annotations

import json
import math
import re
from typing import Sequence

from .render import fmt

__all__ = ["NOT_PARAMS", "WHERE", "change_order", "change_size", "change_text", "is_machine_metric", "param_diff",
           "param_names", "param_texts"]


#: manifest values beside ``params`` that say where a run ran (a difference there can explain one in the results)
WHERE = ("in_lab_vm", "kernel_release", "git_commit")
#: parameters every repeat has its own value of: never "a difference between the sides"
NOT_PARAMS = frozenset({"seed"})


def _text(v) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, (dict, list, tuple)):
        return json.dumps(v, sort_keys=True, default=str)
    return fmt(v)


def param_texts(manifest: dict) -> dict[str, str]:
    """A run's configuration as text, one entry per name: ``scenario``, every manifest ``params`` value (text,
    numbers, bools and lists alike; not ``seed``) and :data:`WHERE` (host or lab VM, kernel, commit)."""
    out = {"scenario": _text(manifest.get("scenario", "?"))}
    params = manifest.get("params")
    if isinstance(params, dict):
        out.update({str(k): _text(v) for k, v in params.items() if k not in NOT_PARAMS})
    out.update({k: _text(manifest[k]) for k in WHERE if k in manifest})
    return out


def _side_text(values: Sequence[str]) -> str:
    distinct = list(dict.fromkeys(values))
    if len(distinct) == 1:
        return distinct[0]
    return "varies: " + ", ".join(distinct[:4]) + (", ..." if len(distinct) > 4 else "")


def param_diff(sides: Sequence[Sequence[dict[str, str]]]) -> list[tuple[str, list[str]]]:
    """``[(name, [text per side])]`` for every configuration value (:func:`param_texts`) that is not the same on
    every side, in first-seen order (``scenario`` first, :data:`WHERE` last). ``sides``: per side, its runs'
    :func:`param_texts`; a side whose runs disagree reads ``varies: a, b``, a name a side lacks ``(not set)``."""
    names = list(dict.fromkeys(k for runs in sides for r in runs for k in r))
    names = [k for k in names if k not in WHERE] + [k for k in WHERE if k in names]
    out = []
    for name in names:
        texts = [_side_text([r.get(name, "(not set)") for r in runs]) if runs else "(no runs)" for runs in sides]
        if len(set(texts)) > 1:
            out.append((name, texts))
    return out


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def change_text(first, later, ratio_text: str = "") -> str:
    """How a metric went from the first side to the other when a ratio cannot say it: ``0 -> 664 (new)``,
    ``664 -> 0 (gone)``, ``0 both``, ``absent -> 5`` / ``5 -> absent`` (a side lacks the metric), ``-`` (both lack
    it); otherwise ``ratio_text``."""
    if _missing(first) and _missing(later):
        return "-"
    if _missing(first) or _missing(later):
        return " -> ".join("absent" if _missing(v) else fmt(v) for v in (first, later))
    if first == 0 and later == 0:
        return "0 both"
    if first == 0 or later == 0:
        return f"{fmt(first)} -> {fmt(later)} ({'new' if first == 0 else 'gone'})"
    return ratio_text


def change_size(first, later) -> float:
    """``|log(later / first)|``: inf for a change from or to 0 (or of sign), 0 for 0 both, nan when a side lacks it."""
    if _missing(first) or _missing(later):
        return math.nan
    if first == 0 and later == 0:
        return 0.0
    if first == 0 or later == 0 or (first < 0) != (later < 0):
        return math.inf
    return abs(math.log(later / first))


#: Metrics about the machine that ran the emulation (its CPUs, the sampler's own timing), not about the network or
#: the job: a real difference in them is worth showing, after the differences that are the experiment's.
_MACHINE_METRIC = re.compile(r"^(cpu_busy|sampler_|queue_sample_)")


def is_machine_metric(name: str) -> bool:
    return bool(_MACHINE_METRIC.match(str(name)))


def change_order(sizes: Sequence[float], told: Sequence[bool] | None = None,
                 echoes: Sequence[bool] | None = None, machine: Sequence[bool] | None = None) -> list[int]:
    """Row positions, largest change first: rows with a verdict (``told``) before those without, then by
    :func:`change_size` (descending; nan last), rows that only echo a parameter (``echoes``) after all others;
    within each group, metrics of the machine (``machine``: CPU, sampler) after the experiment's own; ties keep
    their order."""
    def key(i: int):
        size = sizes[i]
        return (bool(echoes[i]) if echoes else False, not told[i] if told else False,
                bool(machine[i]) if machine else False, -(-1.0 if math.isnan(size) else size), i)

    return sorted(range(len(sizes)), key=key)


def param_names(manifests: Sequence[dict]) -> set[str]:
    """The names of the runs' ``params``: a metric of that name only echoes the configuration."""
    return {str(k) for mf in manifests if isinstance(mf.get("params"), dict) for k in mf["params"]}
