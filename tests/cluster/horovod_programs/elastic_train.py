"""A real Horovod elastic training program, written as Horovod's documentation writes
one (hvd.elastic.run, TorchState, DistributedOptimizer, commit every few steps), with
lines the tests read:

  resume: rank R of N on HOST at step S        every rank, at the start of each run
  step S size N                                rank 0, after each optimizer step
  committed S                                  rank 0, after state.commit() returned
  done: rank R of N at step S params P         every rank, at the end (P: a checksum of
                                               rank 0's parameters, broadcast and compared)

Options (environment, so a launcher command stays plain): TRAIN_STEPS (60), TRAIN_COMMIT
(5), TRAIN_STEP_MS (200), TRAIN_NO_NOTIFY=1 (stop this process's notification service
right after it registered: the launcher cannot reach it), TRAIN_PRINT_KEY=1 (print the
service's secret key as `key: HEX`, so a test can look for it where it must not be),
TRAIN_START_DELAY=HOST:SECONDS (a process started on HOST sleeps that long before
hvd.init(): a newcomer with a slow import), TRAIN_LONG_STEP=HOST:SECONDS:FILE (once FILE
exists, the rank on HOST computes for SECONDS in its next step, silent, printing `long
step on HOST` first: a step far longer than the others)."""

import os
import time

import torch

import horovod.torch as hvd
from horovod.common.elastic import notification_manager

STEPS = int(os.environ.get("TRAIN_STEPS", "60"))
COMMIT = int(os.environ.get("TRAIN_COMMIT", "5"))
STEP_S = int(os.environ.get("TRAIN_STEP_MS", "200")) / 1000.0
HOST = os.environ.get("HOROVOD_HOSTNAME", "?")

delay_host, _, delay = os.environ.get("TRAIN_START_DELAY", "").partition(":")
if delay_host == HOST:
    time.sleep(float(delay))
long_host, _, long_rest = os.environ.get("TRAIN_LONG_STEP", "").partition(":")
long_seconds, _, long_file = long_rest.partition(":")
long_done = False
hvd.init()
torch.manual_seed(1234)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
state = hvd.elastic.TorchState(model=model, optimizer=optimizer, step=0)


def params_checksum():
    return float(sum(p.detach().double().sum() for p in model.parameters()))


@hvd.elastic.run
def train(state):
    global long_done
    service = notification_manager._service
    if os.environ.get("TRAIN_PRINT_KEY") == "1" and service is not None:
        print(f"key: {service._wire._key.hex()}", flush=True)
    if os.environ.get("TRAIN_NO_NOTIFY") == "1" and service is not None:
        service.shutdown()
    print(f"resume: rank {hvd.rank()} of {hvd.size()} on {HOST} at step {state.step}",
          flush=True)
    while state.step < STEPS:
        # Each rank's data depends on its rank and the step: only the averaged gradient
        # keeps the replicas equal.
        x = torch.full((4, 8), float(hvd.rank() + 1)) * (state.step % 7 + 1) / 7.0
        optimizer.zero_grad()
        loss = (model(x) ** 2).mean()
        loss.backward()
        optimizer.step()
        if long_host == HOST and not long_done and os.path.exists(long_file):
            long_done = True
            print(f"long step on {HOST}", flush=True)
            end = time.monotonic() + float(long_seconds)
            n = 0
            while time.monotonic() < end:  # busy: the process uses CPU time, prints nothing
                n += 1
        state.step += 1
        if hvd.rank() == 0:
            print(f"step {state.step} size {hvd.size()}", flush=True)
        if state.step % COMMIT == 0:
            state.commit()
            if hvd.rank() == 0:
                print(f"committed {state.step}", flush=True)
        time.sleep(STEP_S)
    mine = params_checksum()
    root = hvd.broadcast_object(mine, root_rank=0, name="final_params")
    equal = abs(root - mine) <= 1e-9 * max(1.0, abs(root))
    print(f"done: rank {hvd.rank()} of {hvd.size()} at step {state.step} params "
          f"{mine:.12g} {'equal' if equal else 'DIFFERENT from rank 0 ' + repr(root)}",
          flush=True)


train(state)
