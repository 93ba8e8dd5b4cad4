#!/usr/bin/env python3
"""A torch.distributed gloo loop for the recovery benchmark under torchrun: an
all_reduce every 10 ms; rank 0 prints 'restart R step S t=EPOCH_MS' after each, on stderr
(torchrun's --tee 2 passes only stderr through)."""
import os
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, size = dist.get_rank(), dist.get_world_size()
restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
t = torch.ones(1024)
step = 0
while step < 1_000_000:
    t.fill_(1.0)
    dist.all_reduce(t)
    step += 1
    if rank == 0:
        print(f"restart {restart} step {step} t={int(time.time() * 1000)}", file=sys.stderr,
              flush=True)
    time.sleep(0.01)
