"""What burn-in flagged, as placement reads it: burn-in's ``health.json`` (``testbed burnin``, docs/operations.md).

    h = load_health("results/bi/health.json")    # HealthError (one line) on a missing or malformed file
    h.bad_hosts        # {"h4": "cpu_task_ms 187 ms above ..."}: the hosts whose checks named them, with why
    h.bad_links        # {"leaf2-spine1": "leaf1>spine1>leaf2: path_mbps 2.17 ..."}
    h.avoid()          # what traffic.placement's ``avoid`` takes: the bad hosts and the bad links

This stands for the scheduler's view of the fabric after a burn-in: a host or link that failed its burn-in does not
enter the production pool. Pure: reads one JSON file, imports nothing of the testbed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

__all__ = ["FORMAT", "Health", "HealthError", "load_health", "parse_health"]

#: the format tag burn-in writes (analysis.burnin.health)
FORMAT = "testbed-burnin-health/1"


class HealthError(ValueError):
    """A health file that cannot be read or is not burn-in's (one-line message)."""

    def __init__(self, message: object) -> None:
        super().__init__(" ".join(str(message).split()))


@dataclass(frozen=True)
class Health:
    """Every host and fabric link burn-in checked (``hosts``, ``links``), and those it flagged with their reasons
    joined into one line (``bad_hosts``, ``bad_links``); ``source`` is the file read."""

    hosts: tuple[str, ...]
    links: tuple[str, ...]
    bad_hosts: Mapping[str, str] = field(default_factory=dict)
    bad_links: Mapping[str, str] = field(default_factory=dict)
    source: str = ""

    @property
    def healthy_hosts(self) -> tuple[str, ...]:
        return tuple(h for h in self.hosts if h not in self.bad_hosts)

    def avoid(self, links: bool = True) -> frozenset[str]:
        """The flagged hosts, and with ``links`` the flagged links (placement keeps traffic across the spine away
        from a leaf one of them joins)."""
        return frozenset(self.bad_hosts) | (frozenset(self.bad_links) if links else frozenset())

    def why(self, names: Iterable[str], width: int = 60) -> str:
        """``h3: <reason>, h5: <reason>`` for the flagged ones among ``names``, each reason cut to ``width``."""
        bad = {**self.bad_hosts, **self.bad_links}
        return ", ".join(f"{n}: {_cut(bad[n], width)}" for n in names if n in bad)

    def check_fabric(self, hosts: Iterable[str]) -> None:
        """HealthError unless every host burn-in checked is one of ``hosts`` (a health file of another fabric)."""
        known = set(hosts)
        alien = [h for h in self.hosts if h not in known]
        if alien:
            raise HealthError(f"{self.source or 'health file'}: host {alien[0]} is not in this fabric (burn-in of "
                              f"another fabric?)")


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 3].rstrip() + "..."


def _section(doc: Mapping[str, Any], key: str, where: str) -> tuple[tuple[str, ...], dict[str, str]]:
    sec = doc.get(key)
    if not isinstance(sec, Mapping):
        raise HealthError(f"{where}: \"{key}\" must be an object of name -> {{ok, reasons}}")
    bad = {}
    for name, v in sec.items():
        if not isinstance(v, Mapping) or not isinstance(v.get("ok"), bool):
            raise HealthError(f"{where}: {key}.{name} needs \"ok\": true or false")
        reasons = v.get("reasons", [])
        if not isinstance(reasons, list) or not all(isinstance(r, str) for r in reasons):
            raise HealthError(f"{where}: {key}.{name}.reasons must be a list of strings")
        if not v["ok"]:
            bad[str(name)] = "; ".join(reasons) or "flagged by burn-in"
    return tuple(str(n) for n in sec), bad


def parse_health(doc: Any, source: str = "health file") -> Health:
    """A :class:`Health` from health.json's parsed content."""
    if not isinstance(doc, Mapping):
        raise HealthError(f"{source}: not a JSON object")
    if doc.get("format") != FORMAT:
        raise HealthError(f"{source}: format is {doc.get('format')!r}, expected {FORMAT!r} (testbed burnin writes it)")
    hosts, bad_hosts = _section(doc, "hosts", source)
    links, bad_links = _section(doc, "links", source)
    return Health(hosts, links, bad_hosts, bad_links, source)


def load_health(path: str | Path) -> Health:
    """Read burn-in's health.json at ``path``."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise HealthError(f"health file {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise HealthError(f"health file {path}: not UTF-8 text") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise HealthError(f"health file {path}: not JSON ({e.msg} at line {e.lineno})") from None
    return parse_health(doc, f"health file {path}")
