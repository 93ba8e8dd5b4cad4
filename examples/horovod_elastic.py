#!/usr/bin/env python3
"""An elastic Horovod program as Horovod's documentation writes one (hvd.elastic.run,
TorchState, a commit every few steps), unchanged under caf-hvd:

    caf-hvd driver --host-discovery-script ./hosts.sh --min-np 1 --max-np 8 -- \
        python3 examples/horovod_elastic.py

Hosts may join, leave or fail while it trains: the ranks restore the last commit and go
on with the new set of ranks. Rank 0 prints `step S size N` after each step and
`resumed at S` whenever a (re)started run begins; at the end every rank checks that the
replicas agree (an allgather of a weights checksum) and that it stopped at the last
step, and exits 1 if not. STEPS (default 60), COMMIT (5) and STEP_MS (100) tune it."""

import os
import sys
import time

import torch

import horovod.torch as hvd

STEPS = int(os.environ.get("STEPS", "60"))
COMMIT = int(os.environ.get("COMMIT", "5"))
STEP_S = int(os.environ.get("STEP_MS", "100")) / 1000.0

hvd.init()
torch.manual_seed(1234)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
true_w = torch.arange(1.0, 9.0).unsqueeze(1)


@hvd.elastic.run
def train(state):
    if hvd.rank() == 0:
        print(f"resumed at {state.step} with {hvd.size()} ranks", flush=True)
    while state.step < STEPS:
        gen = torch.Generator().manual_seed(state.step * 1000 + hvd.rank())
        x = torch.randn(32, 8, generator=gen)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), x @ true_w).backward()
        optimizer.step()
        state.step += 1
        if hvd.rank() == 0:
            print(f"step {state.step} size {hvd.size()}", flush=True)
        if state.step % COMMIT == 0:
            state.commit()  # also where a host change is taken up
        time.sleep(STEP_S)
    return state.step


state = hvd.elastic.TorchState(model=model, optimizer=optimizer, step=0)
last = train(state)
checksum = torch.cat([p.detach().flatten() for p in model.parameters()]).sum().reshape(1)
every = hvd.allgather(checksum)
problems = []
if last != STEPS:
    problems.append(f"stopped at step {last}, not {STEPS}")
if not torch.allclose(every, every[0].expand_as(every)):
    problems.append(f"replicas differ: {every.tolist()}")
print(f"done: rank {hvd.rank()} of {hvd.size()} at step {last}"
      f"{' FAILED: ' + '; '.join(problems) if problems else ' ok'}", flush=True)
sys.exit(1 if problems else 0)
