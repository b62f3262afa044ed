"""`testbed run collective --set transport=rdma` on this host: with --vm never on a kernel without SoftRoCE
across namespaces it is one line naming the capability and exit 2, and nothing (no run directory) is made.
The verdict comes from the doctor of this very kernel, so on a kernel that has rxe (the Vagrant box) the same
command must not be refused for it."""

import os
import subprocess
import sys

from testbed.kernel import doctor

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def run(*args):
    return subprocess.run([sys.executable, "-m", "testbed.cli", *args], capture_output=True, text=True,
                          timeout=600, cwd=ROOT)


def test_rdma_with_vm_never(tmp_path):
    out = tmp_path / "run"
    lacking = doctor.missing(["rxe:netns", "pyverbs"])
    if lacking:
        r = run("run", "collective", "--set", "transport=rdma", "--vm", "never", "--out", str(out))
        assert r.returncode == 2, (r.stdout, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert f"missing capability: {', '.join(lacking)}" in r.stderr and "--vm auto" in r.stderr
    else:  # rxe works here: --vm never is not refused for it (checked by the decision, without a run)
        from testbed.commands.runner import use_vm
        from testbed.scenario import get

        c = get("collective")
        p = {x.name: x.default for x in c.params}
        p["transport"] = "rdma"
        assert "rxe:netns" in c.needs_of(p)
        assert use_vm("never", ["rxe:netns", "pyverbs"], in_vm=False) is False
    assert not out.exists()


def test_bad_capture_is_one_line_before_anything(tmp_path):
    out = tmp_path / "run"
    r = run("run", "collective", "--set", "transport=rdma", "--set", "capture=h1:eth9", "--vm", "never",
            "--out", str(out))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "capture: h1 has no port 'eth9'" in r.stderr
    assert not out.exists()


def test_sweep_takes_every_points_needs(tmp_path):
    """A sweep over transport=tcp,rdma needs rxe for its second point: --vm never on a kernel without it is refused
    before any point runs (the sweep used to look at the scenario's fixed needs only)."""
    out = tmp_path / "sweep"
    lacking = doctor.missing(["rxe:netns", "pyverbs", "qdisc:htb", "qdisc:bfifo"])
    if lacking:
        r = run("sweep", "collective", "--set", "transport=tcp,rdma", "--vm", "never", "--out", str(out))
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "rxe:netns" in r.stderr
        assert not out.exists()
    else:  # everything is here (the Vagrant box): the sweep stays on this kernel
        from testbed.commands.runner import use_vm

        assert use_vm("never", ["rxe:netns", "pyverbs"], in_vm=False) is False
