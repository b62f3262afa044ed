"""What a server's agent reports about its server (testbed.commands.serveragent's ``version`` and ``nic``): the
testbed checkout it runs and the interface holding the servers file's address, as `testbed servers check` and
ServerFabric's NIC check read them (docs/servers.md)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from testbed import __version__
from testbed.kernel import netns

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def version() -> dict:
    """The testbed this agent runs: the checkout's commit (None outside a git checkout), whether the checkout has
    uncommitted changes, the package version, and the kernel."""
    def git(*args: str) -> str | None:
        try:
            r = subprocess.run(["git", "-C", str(PROJECT_ROOT), *args], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return r.stdout.strip() if r.returncode == 0 else None
    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit, "dirty": bool(status), "package": __version__, "kernel": os.uname().release,
            "python": sys.version.split()[0], "root": str(PROJECT_ROOT)}


def nic(address: str, ns: str | None = None) -> dict:
    """The interface holding ``address`` in the agent's namespace (or ``ns``, the one standing for the server's NIC),
    with its MTU and receive-aggregation features (testbed.kernel.links.gro_features); ``ifname`` None when none
    holds it, with ``others``: the addresses that are there. LookupError when ``ns`` does not exist."""
    from testbed.kernel import links

    if ns is not None and not (netns.NETNS_DIR / ns).exists():
        raise LookupError(f"no namespace {ns} here")
    others = []
    with netns.ipr_in(ns) if ns else netns.ipr(None) as ipr:
        names = {lk["index"]: lk.get_attr("IFLA_IFNAME") for lk in ipr.get_links()}
        for a in ipr.get_addr(family=socket.AF_INET):
            if a.get_attr("IFA_ADDRESS") == address:
                link = ipr.get_links(a["index"])[0]
                ifname = link.get_attr("IFLA_IFNAME")
                return {"ifname": ifname, "mtu": link.get_attr("IFLA_MTU"), "prefixlen": a["prefixlen"],
                        "gro": links.gro_features(ns, ifname)}
            others.append(f"{a.get_attr('IFA_ADDRESS')}/{a['prefixlen']} on {names.get(a['index'], '?')}")
    return {"ifname": None, "others": others}
