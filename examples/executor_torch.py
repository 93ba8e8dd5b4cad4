#!/usr/bin/python3
"""A horovod.ray-style program on caf-hvd: a torch data-parallel trainer class (gloo),
started once per rank by caf_hvd.Executor and driven epoch by epoch with `execute`.
Each rank trains on its own shard; gradients are averaged with all_reduce, so every
rank must hold the same weights after every epoch, which the program checks.

    PYTHONPATH=python /usr/bin/python3 examples/executor_torch.py --workers 4
    PYTHONPATH=python /usr/bin/python3 examples/executor_torch.py \\
        --hosts h1:2,h2:2 --cluster-dir ~/.caf-hvd/cluster
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "python"))
from caf_hvd import Executor  # noqa: E402


class Trainer:
    """Built inside each rank after caf-hvd set RANK, WORLD_SIZE, MASTER_ADDR/PORT."""

    def __init__(self, lr, samples_per_rank):
        import torch
        import torch.distributed as dist
        dist.init_process_group("gloo")  # env://, served by caf-hvd's torch store
        self.torch, self.dist = torch, dist
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(0)  # the same initial weights on every rank
        self.model = torch.nn.Linear(8, 1)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=lr)
        g = torch.Generator().manual_seed(1000 + self.rank)  # this rank's shard
        self.x = torch.randn(samples_per_rank, 8, generator=g)
        true_w = torch.arange(1.0, 9.0).unsqueeze(1)
        self.y = self.x @ true_w + 0.5
        self.epoch = 0

    def train_epoch(self):
        self.opt.zero_grad()
        loss = ((self.model(self.x) - self.y) ** 2).mean()
        loss.backward()
        for p in self.model.parameters():  # average the gradients over all ranks
            self.dist.all_reduce(p.grad)
            p.grad /= self.size
        self.opt.step()
        self.epoch += 1
        return float(loss)

    def weights(self):
        return [round(float(v), 6) for p in self.model.parameters() for v in p.flatten()]

    def place(self):
        return (self.rank, os.environ.get("HOROVOD_HOSTNAME"), os.environ.get("LOCAL_RANK"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--hosts", help="node agents, as caf-hvd driver -H takes them")
    ap.add_argument("--cluster-dir")
    ap.add_argument("--epochs", type=int, default=20)
    a = ap.parse_args()
    workers = a.workers
    if a.hosts and "--workers" not in sys.argv:
        workers = sum(int(h.rsplit(":", 1)[1]) for h in a.hosts.split(","))
    with Executor(num_workers=workers, hosts=a.hosts, cluster_dir=a.cluster_dir) as ex:
        ex.start(executable_cls=Trainer, executable_kwargs={"lr": 0.05, "samples_per_rank": 64})
        print("ranks:", ex.execute(lambda t: t.place()))
        for epoch in range(a.epochs):
            losses = ex.execute(lambda t: t.train_epoch())
            if epoch % 5 == 0 or epoch == a.epochs - 1:
                print(f"epoch {epoch}: loss per rank {[round(x, 4) for x in losses]}")
        weights = ex.execute(lambda t: t.weights())
        epochs = ex.execute(lambda t: t.epoch)
    if any(w != weights[0] for w in weights) or set(epochs) != {a.epochs}:
        print(f"FAILED: the ranks disagree: weights {weights}, epochs {epochs}")
        return 1
    print(f"all {workers} ranks hold the same weights after {a.epochs} epochs: "
          f"{weights[0][:3]}...")
    return 0


if __name__ == "__main__":
    sys.exit(main())
