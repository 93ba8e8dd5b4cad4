#!/usr/bin/env python3
"""horovod.ray's RayExecutor, stateless and stateful, with only the import changed:

    PYTHONPATH=python:HOROVOD_SITE /usr/bin/python3 examples/ray_executor.py [--workers 2]
    ... examples/ray_executor.py --hosts host1:2,host2:2 --cluster-dir DIR   # over agents

Stateless: executor.run(fn) calls fn on every worker and returns the values in rank
order. Stateful: executor.start(executable_cls=Trainer) builds one Trainer per worker,
each executor.execute(...) call runs on every worker's instance, which keeps its state
(model, optimizer, epoch) between calls. The program checks what it gets back (ranks in
order, equal weights on every worker after training, the epoch count every instance
kept) and exits 1 when a check fails."""

import argparse
import sys

from caf_hvd import RayExecutor  # was: from horovod.ray import RayExecutor


def whoami():
    import horovod.torch as hvd

    hvd.init()
    return hvd.rank(), hvd.size()


class Trainer:
    """One per worker; Horovod's ranks train one model together."""

    def __init__(self, lr):
        import torch

        import horovod.torch as hvd

        hvd.init()
        self.hvd, self.torch = hvd, torch
        torch.manual_seed(hvd.rank())  # different starts: the broadcast makes them equal
        self.model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(self.model.parameters(), lr=lr)
        self.opt = hvd.DistributedOptimizer(opt, named_parameters=self.model.named_parameters())
        hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
        gen = torch.Generator().manual_seed(10 + hvd.rank())
        self.x = torch.randn(64, 4, generator=gen)
        self.y = self.x.sum(dim=1, keepdim=True)
        self.epochs = 0

    def train_epoch(self):
        for _ in range(10):
            self.opt.zero_grad()
            loss = self.torch.nn.functional.mse_loss(self.model(self.x), self.y)
            loss.backward()
            self.opt.step()
        self.epochs += 1
        return loss.item()

    def state(self):
        weights = [round(v, 6) for v in self.model.weight.detach().flatten().tolist()]
        return self.epochs, weights


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--hosts", default=None)
    ap.add_argument("--cluster-dir", default=None)
    a = ap.parse_args()
    extra = {"hosts": a.hosts, "cluster_dir": a.cluster_dir} if a.hosts else {}
    settings = RayExecutor.create_settings(timeout_s=30)
    problems = []

    # stateless: a function on every worker, values in rank order
    executor = RayExecutor(settings, num_workers=a.workers, **extra)
    executor.start()
    got = executor.run(whoami)
    executor.shutdown()
    if got != [(r, a.workers) for r in range(a.workers)]:
        problems.append(f"run(whoami) gave {got}")

    # stateful: one Trainer per worker, kept between calls
    executor = RayExecutor(settings, num_workers=a.workers, **extra)
    executor.start(executable_cls=Trainer, executable_kwargs={"lr": 0.05})
    losses = [executor.execute(lambda t: t.train_epoch()) for _ in range(5)]
    states = executor.execute(lambda t: t.state())
    executor.shutdown()
    if any(epochs != 5 for epochs, _ in states):
        problems.append(f"the instances counted {[e for e, _ in states]} epochs, not 5 each")
    if any(w != states[0][1] for _, w in states):
        problems.append(f"the workers' weights differ: {[w for _, w in states]}")
    if not losses[-1][0] < losses[0][0]:
        problems.append(f"the loss did not fall: {losses[0][0]} -> {losses[-1][0]}")

    print(f"ranks {got}; losses of rank 0 {[round(l[0], 4) for l in losses]}; "
          f"{'FAILED: ' + '; '.join(problems) if problems else 'ok'}", flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
