"""`testbed clean`: remove what the project created and a killed run left behind, and nothing else.

Scope is by name prefix (`tb-` namespaces, `tb*` links, rxe devices, OVS bridges and CPU cgroups) and by the state
files of runs
(/run/testbed/*.json): pids of agents, host sysctls to restore, the job folders a server's agent made
(:func:`job_folders`). Unlike Mininet's `mn -c`, it does not kill every process named `ping` or delete /tmp/*.log.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from testbed.errors import require_root
from testbed.kernel import PREFIX, cgroup, netns
from testbed.kernel.state import saved_states


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _rxe_devices() -> list[tuple[str, str]]:
    """(device, '') of every rxe device named with the prefix. RDMA devices are global in the kernel's default
    "shared" netns mode, so one listing from the root namespace sees the ones made inside any namespace."""
    if not shutil.which("rdma"):
        return []
    try:
        r = subprocess.run(["rdma", "-j", "link", "show"], capture_output=True, text=True, timeout=10)
        return sorted({(link.get("ifname", ""), "") for link in json.loads(r.stdout or "[]")
                       if link.get("ifname", "").startswith(PREFIX)})
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return []


#: a server agent's job folder (testbed.commands.serverprocs: tempfile.mkdtemp(prefix="tb-<run>-job-"))
JOB_FOLDER = re.compile(r"^tb-(?P<run>[A-Za-z0-9_.]+)-job-[A-Za-z0-9_]+$")


def _ours(path: str, run_id: str | None = None) -> bool:
    """``path`` is a job folder this user made (not a link, named tb-<run>-job-*, of ``run_id`` when given)."""
    m = JOB_FOLDER.match(os.path.basename(path))
    if not os.path.isabs(path) or m is None or (run_id is not None and m["run"] != run_id):
        return False
    try:
        st = os.lstat(path)
    except OSError:
        return False
    import stat

    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()


def job_folders(states: list[dict], live_runs: set[str], tmpdir: str | None = None) -> list[str]:
    """Job folders of runs not in ``live_runs`` (the runs whose owner outlives this clean): those each saved state
    records (``folders``, only its own run's name), and ones in the temporary directory no state records (an agent
    SIGKILLed before it recorded one, or older than the record). Only directories this user owns, never a link."""
    found = [f for st in states if st.get("run_id") not in live_runs
             for f in st.get("folders", []) if _ours(str(f), st.get("run_id"))]
    tmpdir = tmpdir or tempfile.gettempdir()
    with contextlib.suppress(OSError):
        for name in os.listdir(tmpdir):
            m = JOB_FOLDER.match(name)
            if m and m["run"] not in live_runs and _ours(os.path.join(tmpdir, name)):
                found.append(os.path.join(tmpdir, name))
    return sorted(set(found))


def plan() -> dict[str, list]:
    states = saved_states()
    pids = []
    for st in states:
        pids += [p for p in st.get("pids", []) if _pid_alive(p)]
        if st.get("pid") and st["pid"] != os.getpid() and _pid_alive(st["pid"]):
            pids.append(st["pid"])
    namespaces = netns.list_ours()
    for ns in namespaces:
        pids += [p for p in netns.pids_in(ns) if p != os.getpid()]
    host_links = []
    with netns.ipr(None) as ipr:
        for link in ipr.get_links():
            name = link.get_attr("IFLA_IFNAME")
            if name and name.startswith(PREFIX) and not name.startswith(PREFIX + "-"):
                host_links.append(name)
    bridges = []
    if shutil.which("ovs-vsctl"):
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            r = subprocess.run(["ovs-vsctl", "--timeout=3", "list-br"], capture_output=True, text=True, timeout=5)
            if r.returncode == 0:
                bridges = [b for b in r.stdout.split() if b.startswith(PREFIX)]
    sysctls = [s for st in states for s in st.get("sysctls", [])]
    # every run's owner is killed above but this process's own (the `clean` of a server's agent)
    live_runs = {st.get("run_id") for st in states if st.get("pid") == os.getpid()}
    return {"processes": sorted(set(pids)), "rxe": _rxe_devices(), "namespaces": namespaces,
            "links": host_links, "ovs_bridges": bridges, "cgroups": cgroup.list_ours(), "sysctls": sysctls,
            "job_folders": job_folders(states, live_runs), "state_files": [st["_path"] for st in states]}


def clean(dry_run: bool = False) -> dict[str, list]:
    p = plan()
    if dry_run:
        return p
    for pid in p["processes"]:
        _kill(pid)
    for dev, ns in p["rxe"]:
        argv = ["rdma", "link", "delete", dev]
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            netns.run(ns, argv, timeout=10) if ns else subprocess.run(argv, capture_output=True, timeout=10)
    for br in p["ovs_bridges"]:
        subprocess.run(["ovs-vsctl", "--timeout=3", "--if-exists", "del-br", br], capture_output=True, timeout=10)
    for ns in p["namespaces"]:
        netns.remove(ns)
    for group in p["cgroups"]:
        cgroup.remove(group)
    with netns.ipr(None) as ipr:
        for name in p["links"]:
            with contextlib.suppress(Exception):
                ipr.link("del", index=ipr.link_lookup(ifname=name)[0])
    for folder in p["job_folders"]:
        shutil.rmtree(folder, ignore_errors=True)
    for s in reversed(p["sysctls"]):
        with contextlib.suppress(OSError):
            netns.sysctl_write(None, s["key"], s["old"])
    for f in p["state_files"]:
        Path(f).unlink(missing_ok=True)
    return p


def main(dry_run: bool = False) -> int:
    require_root("testbed clean")
    p = clean(dry_run)
    verb = "would remove" if dry_run else "removed"
    total = 0
    for kind in ("processes", "rxe", "ovs_bridges", "namespaces", "links", "cgroups", "job_folders", "sysctls"):
        items = p[kind]
        if items:
            total += len(items)
            shown = [i[0] if isinstance(i, (list, tuple)) else (i["key"] if isinstance(i, dict) else i)
                     for i in items]
            label = "sysctls restored" if kind == "sysctls" else kind.replace("_", " ")
            print(f"{verb} {len(items)} {label}: {' '.join(map(str, shown))}")
    if total == 0:
        print("nothing to clean")
    return 0
