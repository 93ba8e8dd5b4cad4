#!/usr/bin/env python3
"""A small data-parallel training loop on torch.distributed's Gloo backend, started
from the environment (env://) exactly as under torchrun:

    caf-hvd run -np 4 -- python3 examples/torch_ddp_gloo.py
    caf-hvd driver -np 4 -H host1:2,host2:2 -- python3 examples/torch_ddp_gloo.py

Every rank trains a linear model on its own shard of a synthetic regression problem and
averages gradients with all_reduce after each step. At the end all ranks compare their
weights; the program exits 1 if any rank disagrees or the model did not learn."""

import os
import sys

import torch
import torch.distributed as dist


def main():
    steps = int(os.environ.get("STEPS", "50"))
    dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ["LOCAL_RANK"])
    torch.manual_seed(1234)  # same initial weights everywhere
    model = torch.nn.Linear(8, 1)
    true_w = torch.arange(1.0, 9.0).unsqueeze(1)
    gen = torch.Generator().manual_seed(100 + rank)  # a different shard per rank
    x = torch.randn(256, 8, generator=gen)
    y = x @ true_w + 0.5
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad /= world
        opt.step()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    everyone = [torch.zeros_like(flat) for _ in range(world)]
    dist.all_gather(everyone, flat)
    same = all(torch.equal(everyone[0], w) for w in everyone)
    learned = float(loss) < 1.0
    print(f"rank {rank}/{world} (local {local}, group {os.environ.get('GROUP_RANK')}, "
          f"master {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}, "
          f"gloo iface {os.environ.get('GLOO_SOCKET_IFNAME', '-')}): loss {float(loss):.4f}, "
          f"weights {'identical on all ranks' if same else 'DIFFER'}", flush=True)
    dist.destroy_process_group()
    return 0 if same and learned else 1


if __name__ == "__main__":
    sys.exit(main())
