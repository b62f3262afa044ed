#!/usr/bin/env python3
"""A small data-parallel training loop: DistributedDataParallel over gloo (CPU), a few-layer MLP, synthetic data.

Run it on the fabric (each rank in its host's namespace, started as torchrun starts it):

    sudo testbed run program --set cmd='python3 examples/programs/ddp_train.py --steps 20' --set ranks=4

It reads the environment torchrun gives (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, GLOO_SOCKET_IFNAME), and
reports each step and each gradient bucket's all-reduce through the testbed's event protocol: two lines
(``Events()``, ``events.ddp_hook(model)``) plus the ``with events.step(i):`` around the step. Outside the testbed
(no TESTBED_EVENTS) those are no-ops; with torchrun it runs unchanged.
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

try:
    from traffic.progevents import Events
except ImportError:  # outside the testbed's tree: no events
    class Events:
        def step(self, i):
            import contextlib
            return contextlib.nullcontext()

        def ddp_hook(self, model):
            pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--hidden", type=int, default=256, help="hidden width (the gradient size grows with its square)")
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--bucket-mb", type=float, default=0.25, help="DDP gradient bucket size (MB)")
    ap.add_argument("--timeout-s", type=float, default=120.0, help="gloo's connect and op timeout")
    args = ap.parse_args()

    torch.manual_seed(0)  # every rank builds the same model; DDP checks it
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=__import__("datetime").timedelta(seconds=args.timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    layers = []
    for _ in range(args.layers):
        layers += [nn.Linear(args.hidden, args.hidden), nn.ReLU()]
    model = DistributedDataParallel(nn.Sequential(*layers, nn.Linear(args.hidden, 1)),
                                    bucket_cap_mb=args.bucket_mb)
    events = Events()
    events.ddp_hook(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1000 + rank)
    params = sum(p.numel() for p in model.parameters())
    t0 = time.monotonic()
    for step in range(args.steps):
        with events.step(step):
            x = torch.randn(args.batch, args.hidden, generator=gen)
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()  # DDP all-reduces the gradients, bucket by bucket, over gloo
            opt.step()
    # the replicas must agree: every rank's parameters are the same after synchronous SGD
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, 0)
    same = bool(torch.equal(flat, ref))
    print(f"rank {rank}/{world}: {args.steps} steps in {time.monotonic() - t0:.3f} s, {params} parameters "
          f"({params * 4} B of gradients per step), loss {loss.item():.6f}, replicas identical: {same}", flush=True)
    dist.destroy_process_group()
    return 0 if same else 3


if __name__ == "__main__":
    raise SystemExit(main())
