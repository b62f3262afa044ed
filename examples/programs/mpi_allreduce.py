#!/usr/bin/env python3
"""An MPI all-reduce timing loop (mpi4py, Open MPI): the osu/nccl-tests pattern, timed by the program itself.

    sudo testbed run program --set launcher=mpi --set cmd='python3 examples/programs/mpi_allreduce.py' --set ranks=4

Every iteration all-reduces a float32 buffer (``--bytes``) with ``MPI_Allreduce`` (SUM) and checks the result; each
is reported as a step with one op through the testbed's event protocol, and rank 0 prints the timing table. Runs
unchanged under any mpirun (without TESTBED_EVENTS the events are no-ops).
"""

import argparse
import sys
import time

import numpy as np
from mpi4py import MPI

try:
    from traffic.progevents import Events
except ImportError:
    Events = None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bytes", type=int, default=256 * 1024, help="message size per rank (bytes)")
    ap.add_argument("--iterations", type=int, default=10)
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    events = Events(rank=rank) if Events else None
    n = max(1, args.bytes // 4)
    send = np.full(n, rank + 1, dtype=np.float32)
    recv = np.empty_like(send)
    expect = world * (world + 1) / 2
    times, ok = [], True
    comm.Barrier()
    for it in range(args.iterations):
        if events:
            events.emit("step_begin", step=it)
            events.emit("op_begin", name="allreduce", collective="allreduce", bytes=n * 4)
        t0 = time.monotonic()
        comm.Allreduce(send, recv, op=MPI.SUM)
        t1 = time.monotonic()
        if events:
            events.emit("op_end", name="allreduce", t=t1)
            events.emit("step_end", step=it, t=t1)
        times.append(t1 - t0)
        ok = ok and bool(np.all(recv == expect))
    ok = comm.allreduce(ok, op=MPI.LAND)
    worst = comm.reduce(max(times), op=MPI.MAX, root=0)
    if rank == 0:
        t = sorted(times)
        lib = MPI.Get_library_version().splitlines()[0]
        print(f"# MPI_Allreduce {n * 4} B x {args.iterations}, {world} ranks ({lib})")
        print(f"# p50 {t[len(t) // 2] * 1e3:.2f} ms, max {worst * 1e3:.2f} ms, algbw "
              f"{n * 4 / t[len(t) // 2] * 8 / 1e6:.2f} Mbit/s, data verified: {ok}", flush=True)
    return 0 if ok else 3


if __name__ == "__main__":
    sys.exit(main())
