"""`testbed doctor`: what can this kernel do? Probed by function, never guessed from a version number.

Each probe (testbed.kernel.probes) tries the real thing in a scratch network namespace (a qdisc is added to a veth,
a congestion control is set on a socket, an rxe pair must complete an RC transfer) and records OK or MISSING, what a
missing capability disables and how to get it. The scratch namespaces and everything in them are removed, also on
failure. Verdicts are cached for the life of the boot (:func:`missing`).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass

from testbed.errors import UsageError, require_root
from testbed.kernel import state
from testbed.kernel.probes import PROBES, Scratch

@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    disables: str
    hint: str


def _reason(e: Exception) -> str:
    """One line saying why a probe failed, in the kernel's terms."""
    import errno

    from pyroute2.netlink.exceptions import NetlinkError

    code = getattr(e, "code", None) if isinstance(e, NetlinkError) else getattr(e, "errno", None)
    if code == errno.ENOENT:
        return "the kernel does not have it (not built in, and no module it can load)"
    if code == errno.EOPNOTSUPP:
        return "the kernel refuses it (operation not supported)"
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def probe_names() -> list[str]:
    return [p.name for p in PROBES]


def run_probes(only: list[str] | None = None) -> list[Check]:
    """Run the probes (all, or the named ones) and return their verdicts. Needs root."""
    require_root("testbed doctor")
    selected = PROBES
    if only:
        unknown = sorted(set(only) - set(probe_names()))
        if unknown:
            raise UsageError(f"unknown capability {unknown[0]!r} (known: {', '.join(probe_names())})")
        selected = [p for p in PROBES if p.name in only]
    results: list[Check] = []
    for p in selected:
        for attempt in (1, 2):  # a second try, so a loaded machine's timeout is not taken for a missing feature
            try:
                with Scratch() as s:
                    detail = p.fn(s)
                results.append(Check(p.name, True, detail, p.disables, ""))
                break
            except Exception as e:  # noqa: BLE001 - every failure is a verdict, reported with its reason
                if attempt == 2 or _reason(e).startswith("the kernel does not have it"):
                    results.append(Check(p.name, False, _reason(e)[:200], p.disables, p.hint))
                    break
    return results


def _cache_path():
    from pathlib import Path

    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = "unknown"
    return state.STATE_DIR / "capabilities" / f"{boot}.json"


def _save_cache(checks: list[Check]) -> None:
    path = _cache_path()
    try:
        known = json.loads(path.read_text()) if path.exists() else {}
        known.update({c.name: c.ok for c in checks})
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(known))
    except (OSError, ValueError):
        pass


def missing(names: list[str]) -> list[str]:
    """Which of the named capabilities this kernel lacks; verdicts are cached for the life of this boot (a kernel
    cannot gain or lose a capability without a reboot here: modules cannot be loaded on hosts that lack them)."""
    path = _cache_path()
    try:
        known = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        known = {}
    todo = [n for n in names if n not in known]
    if todo:
        checks = run_probes(todo)
        _save_cache(checks)
        known.update({c.name: c.ok for c in checks})
    return [n for n in names if not known[n]]


def report(only: list[str] | None = None) -> dict:
    checks = run_probes(only)
    _save_cache(checks)
    return {
        "kernel_release": os.uname().release,
        "in_lab_vm": os.environ.get("TESTBED_IN_VM") == "1",
        "all_ok": all(c.ok for c in checks),
        "checks": [asdict(c) for c in checks],
    }


def _print_table(rep: dict) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # pragma: no cover
        for c in rep["checks"]:
            print(f"{c['name']:<22} {'OK' if c['ok'] else 'MISSING':<8} {c['detail']}")
        return
    t = Table(title=f"testbed doctor: kernel {rep['kernel_release']}"
              + (" (lab VM)" if rep["in_lab_vm"] else ""))
    for col in ("capability", "status", "detail", "if missing, disables", "how to get it"):
        t.add_column(col, overflow="fold")
    for c in rep["checks"]:
        t.add_row(c["name"], "[green]OK[/]" if c["ok"] else "[red]MISSING[/]", c["detail"],
                  "" if c["ok"] else c["disables"], c["hint"])
    Console(width=160).print(t)
    missing = [c["name"] for c in rep["checks"] if not c["ok"]]
    print("all capabilities present" if not missing else f"{len(missing)} missing: {', '.join(missing)}")


def main(as_json: bool = False, only: list[str] | None = None) -> int:
    rep = report(only)
    if as_json:
        json.dump(rep, sys.stdout, indent=2)
        print()
    else:
        _print_table(rep)
    return 0 if rep["all_ok"] else 1
