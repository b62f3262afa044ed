"""Nothing the project ships leaves the host changed: every host sysctl a run, a benchmark or its peer (stock
Mininet's fixLimits) could touch reads the same before and after, and no namespace of the project is left."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
#: the host (initial-namespace) sysctl trees a run or a peer tool could write
TREES = ("net/core", "net/ipv4", "net/ipv6/conf/all", "net/ipv6/conf/default", "net/ipv6/neigh/default",
         "kernel/pty/max", "fs/file-max")
VOLATILE = ("route/flush", "tcp_fastopen_key")


def host_sysctls() -> dict[str, str]:
    out = {}
    for tree in TREES:
        base = Path("/proc/sys") / tree
        files = [base] if base.is_file() else [p for p in base.rglob("*") if p.is_file()]
        for p in files:
            rel = str(p.relative_to("/proc/sys"))
            if any(rel.endswith(v) for v in VOLATILE):
                continue
            try:
                out[rel] = " ".join(p.read_text().split())
            except OSError:
                continue  # write-only or not permitted to read
    return out


def ours() -> list[str]:
    return sorted(n for n in (os.listdir("/run/netns") if os.path.isdir("/run/netns") else []) if n.startswith("tb-"))


def test_setup_benchmark_restores_what_stock_mininet_changes():
    before, ns_before = host_sysctls(), ours()
    assert len(before) > 100  # really read the trees
    r = subprocess.run([sys.executable, "benchmarks/fabric_setup_vs_mininet.py", "--spines", "1", "--leaves", "2",
                        "--hosts-per-leaf", "1", "--rate-mbps", "10"], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "mininet" in r.stdout and "ratio" in r.stdout, r.stdout
    after = host_sysctls()
    changed = {k: (before[k], after.get(k)) for k in before if after.get(k) != before[k]}
    assert not changed, f"host sysctls left changed: {changed}"
    assert ours() == ns_before


def test_guard_restores_a_changed_sysctl_and_records_it(tmp_path, monkeypatch):
    """preserved_sysctls puts back a value changed inside it and records the old one for testbed clean."""
    monkeypatch.setenv("TESTBED_STATE_DIR", str(tmp_path))
    from testbed.kernel import hostguard
    from testbed.kernel.state import RunState

    key = "net.core.netdev_max_backlog"
    old = hostguard.snapshot([key])[key]
    state = RunState()
    state.path = tmp_path / "guard.json"
    try:
        with hostguard.preserved_sysctls([key], state=state):
            Path("/proc/sys/net/core/netdev_max_backlog").write_text(str(int(old) + 7))
            assert hostguard.snapshot([key])[key] == str(int(old) + 7)
            assert {"key": key, "old": old} in state.data["sysctls"]
        assert hostguard.snapshot([key])[key] == old
    finally:
        Path("/proc/sys/net/core/netdev_max_backlog").write_text(old)
