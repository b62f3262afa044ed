#!/usr/bin/env python3
"""How many emulated hosts does this machine carry faithfully? (a benchmark, not a test; needs root)

    sudo .venv/bin/python benchmarks/capacity.py [--hosts 8,16,32,64] [--rate-mbps 10] [--out DIR]
    sudo testbed vm -- .venv/bin/python benchmarks/capacity.py --hosts 8,16      # the same in the lab VM

For each size, a leaf-spine of 8 hosts per leaf and 2 spines (full bisection: uplinks at 4x the host rate) runs

* a ring all-reduce over every host (1 MB per rank, 3 iterations after a warm-up), judged against its alpha-beta
  bound: the ratio is the peer this benchmark prints, measured in the same run;
* an incast of 8 senders into one host (32 kB blocks, 10 rounds), judged by how busy it kept the bottleneck.

It prints, per size and workload: the fabric's set-up time per host, the memory the run took per host (the
machine's MemAvailable before the build and at its low point while the run went), the CPU busy fraction, the run's
own fidelity verdict and reasons (analysis.fidelity: ports that fell short while backlogged, a machine-limited
incast, CPU saturation), and the largest size at which both workloads stayed faithful."""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testbed.errors import require_root  # noqa: E402
from testbed.commands.runner import run_scenario  # noqa: E402
from testbed.scenario import get  # noqa: E402

HOSTS_PER_LEAF = 8


def mem_available_kb() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    return 0


class MemLow:
    """The lowest MemAvailable while a run goes (sampled every 0.2 s)."""

    def __init__(self):
        self.low = mem_available_kb()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        while not self._stop.wait(0.2):
            self.low = min(self.low, mem_available_kb())

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


def params(name: str, hosts: int, rate: float, opts: argparse.Namespace) -> dict:
    sc = get(name)
    p = {x.name: x.default for x in sc.params}
    leaves = max(1, hosts // HOSTS_PER_LEAF)
    shape = dict(spines=2, leaves=leaves, hosts_per_leaf=min(hosts, HOSTS_PER_LEAF), host_rate_mbps=rate,
                 fabric_rate_mbps=rate * HOSTS_PER_LEAF / 2)
    if name == "collective":
        p.update(collective="allreduce", size="1M", iterations=3, warmup=1, ranks=hosts,
                 sample_interval_ms=opts.sample_ms or 10, mtu=opts.mtu, servers=opts.servers, **shape)
    else:
        p.update(topology="leafspine", senders=min(8, hosts - 1), block_bytes=32_000, rounds=10, **shape)
        if opts.sample_ms:
            p.update(sample_interval_ms=opts.sample_ms)
    sc.validate(p)
    return p


def one(name: str, hosts: int, rate: float, out: Path, opts: argparse.Namespace) -> dict:
    before = mem_available_kb()
    t0 = time.monotonic()
    with MemLow() as mem:
        s = run_scenario(get(name), params(name, hosts, rate, opts), 1, out / f"{name}-{hosts}", quiet=True)
    wall = time.monotonic() - t0
    manifest = json.loads((out / f"{name}-{hosts}" / "manifest.json").read_text())
    build_s = manifest.get("fabric_build_s")
    return {"workload": name, "hosts": hosts, "wall_s": round(wall, 1),
            "setup_ms_per_host": round(build_s * 1e3 / hosts, 1) if isinstance(build_s, (int, float)) else None,
            "mem_mb_per_host": round((before - mem.low) / 1024 / hosts, 1),
            "cpu_busy": round(s.get("cpu_busy_fraction") or 0, 2),
            "vs_bound": round(s["cct_vs_bound"], 2) if name == "collective" else None,
            "utilisation": round(s["bottleneck_utilisation"], 2) if name == "incast" else None,
            "port_ratio_min": round(s["port_rate_ratio_min"], 2) if s.get("port_rate_ratio_min") else None,
            "faithful": bool(s.get("fidelity_ok")), "reasons": s.get("fidelity_reasons") or ""}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", default="8,16,32,64", help="sizes to try, ascending (default 8,16,32,64)")
    ap.add_argument("--rate-mbps", type=float, default=10.0, help="host link rate (default 10)")
    ap.add_argument("--out", default="results/capacity", help="run directories (default results/capacity)")
    ap.add_argument("--mtu", type=int, default=1500, help="the collective's link MTU (default 1500; 9000: jumbo)")
    ap.add_argument("--servers", type=int, default=1,
                    help="split the collective's fabric over this many servers joined by VXLAN tunnels (default 1)")
    ap.add_argument("--sample-ms", type=float, default=0,
                    help="queue sampling interval of both workloads (default: 10 ms collective, 1 ms incast)")
    args = ap.parse_args()
    require_root("the capacity benchmark")
    sizes = [int(x) for x in args.hosts.split(",")]
    out = Path(args.out)
    rows = []
    largest = None
    for n in sizes:
        got = [one(w, n, args.rate_mbps, out, args) for w in ("collective", "incast")]
        rows += got
        for r in got:
            print(json.dumps(r), flush=True)
        if all(r["faithful"] for r in got):
            largest = n
    print("\n| hosts | workload | wall s | set-up ms/host | MB/host | CPU busy | vs bound | bottleneck busy | "
          "port ratio min | faithful |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['hosts']} | {r['workload']} | {r['wall_s']} | {r['setup_ms_per_host']} | {r['mem_mb_per_host']} "
              f"| {r['cpu_busy']} | {r['vs_bound'] or ''} | {r['utilisation'] or ''} | {r['port_ratio_min'] or ''} "
              f"| {'yes' if r['faithful'] else 'no: ' + r['reasons'][:80]} |")
    print(f"\nlargest size with both workloads faithful: {largest or 'none'} hosts at {args.rate_mbps:g} Mbit/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
