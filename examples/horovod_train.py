#!/usr/bin/env python3
"""A Horovod training script as horovodrun runs it, unchanged under caf-hvd:

    caf-hvd run -np 4 -- python3 examples/horovod_train.py
    caf-hvd driver -np 4 -H host1:2,host2:2 -- python3 examples/horovod_train.py

(horovodrun -np 4 python3 examples/horovod_train.py runs the same file.) Every rank
trains a linear model on its own shard of a synthetic regression problem with
hvd.DistributedOptimizer, after hvd.broadcast_parameters from rank 0. At the end every
rank checks that all replicas hold the same weights (an allgather of a checksum), that
the gradients were averaged over every rank (the loss fell on every shard) and that
hvd.size() ranks took part; it exits 1 when any check fails."""

import os
import sys

import torch

import horovod.torch as hvd


def main():
    steps = int(os.environ.get("STEPS", "40"))
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.manual_seed(1000 + rank)  # different initial weights: the broadcast must fix them
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05 * size)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)

    true_w = torch.arange(1.0, 9.0).unsqueeze(1)
    gen = torch.Generator().manual_seed(100 + rank)  # this rank's shard
    x = torch.randn(256, 8, generator=gen)
    y = x @ true_w + 0.5
    first = None
    for step in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        first = loss.item() if first is None else first
    last = torch.nn.functional.mse_loss(model(x), y).item()

    checksum = torch.cat([p.detach().flatten() for p in model.parameters()]).sum().reshape(1)
    every = hvd.allgather(checksum)
    ranks = hvd.allreduce(torch.ones(1), op=hvd.Sum).item()
    problems = []
    if not torch.allclose(every, every[0].expand_as(every)):
        problems.append(f"replicas differ: {every.tolist()}")
    if last >= first / 10:
        problems.append(f"the loss fell only from {first:.3f} to {last:.3f}")
    if int(ranks) != size:
        problems.append(f"{int(ranks)} ranks answered the allreduce, not {size}")
    print(f"rank {rank} of {size}: loss {first:.3f} -> {last:.4f}, weights checksum "
          f"{checksum.item():.6f}{' FAILED: ' + '; '.join(problems) if problems else ' ok'}",
          flush=True)
    hvd.shutdown()
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
