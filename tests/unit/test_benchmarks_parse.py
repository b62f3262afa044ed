"""The benchmarks stay runnable where they cannot be run here: each imports (analysis.stats included) and parses its
arguments (--help exits 0; an unknown option exits 2 before anything is built). The RDMA one needs the lab VM to
measure, not to start."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: the runnable ones (a module the benchmarks share, e.g. verbs_pair.py, has no main)
BENCHMARKS = sorted(p.name for p in (ROOT / "benchmarks").glob("*.py") if '__name__ == "__main__"' in p.read_text())


def test_every_benchmark_is_listed():
    assert {"agent_vs_iperf3.py", "ddp_fabric_overhead.py", "fabric_setup_vs_mininet.py",
            "rdma_vs_ib_write_bw.py"} <= set(BENCHMARKS)


@pytest.mark.parametrize("name", BENCHMARKS)
def test_a_benchmark_imports_and_parses_its_arguments(name):
    ok = subprocess.run([sys.executable, str(ROOT / "benchmarks" / name), "--help"], capture_output=True, text=True,
                        timeout=120, cwd=ROOT)
    assert ok.returncode == 0 and "usage:" in ok.stdout, (ok.stdout, ok.stderr)
    bad = subprocess.run([sys.executable, str(ROOT / "benchmarks" / name), "--no-such-option"], capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    assert bad.returncode == 2 and "unrecognized arguments" in bad.stderr, (bad.stdout, bad.stderr)


@pytest.mark.parametrize("args, says", [(["--steps", "2"], "--steps must be >= 3"),
                                        (["--rate-mbps", "0"], "--rate-mbps must be in"),
                                        (["--repeats", "0"], "--repeats must be >= 1"),
                                        (["--results", "/proc/r.json"], "--results")])
def test_the_ddp_overhead_benchmark_refuses_bad_values_before_building(args, says):
    """A value it cannot run is one line and exit status 2, checked before root or any fabric."""
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ddp_fabric_overhead.py"), *args],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 2 and says in r.stderr and r.stdout == "", (r.stdout, r.stderr)
