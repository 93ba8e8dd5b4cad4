#!/usr/bin/env python3
"""horovod.ray's elastic example (examples/ray/basic_ray_elastic.py in Horovod) as its
users write it, with only the imports changed, on a small model and made-up data (no
downloads). Its __main__ block is Horovod's: create_settings, a TestDiscovery that
takes cluster nodes away and gives them back every --change-frequency-s seconds,
override_discovery=False, start(), run() with callbacks.

    CAF_HVD_CLUSTER=head:7100 python3 examples/ray_elastic.py --epochs 12

It needs a cluster of at least two node agents (caf-hvd node ... --join) and Horovod
on the workers' PYTHONPATH. Rank 0 logs each epoch as it commits it through ray_logger; the
callback here prints `epoch E world_size W loss L`, and the end `finished N epochs on
W worker(s)`. With --forceful, a removed host's ranks are killed instead of leaving at
their next commit (the job restores the last commit and goes on)."""

import argparse
import time

import torch

import horovod.torch as hvd
from caf_hvd import ray_logger
from caf_hvd import TestDiscovery

parser = argparse.ArgumentParser(description="Elastic training on caf-hvd's ElasticRayExecutor")
parser.add_argument("--epochs", type=int, default=20, help="number of epochs to train")
parser.add_argument("--lr", type=float, default=0.01, help="learning rate")
parser.add_argument("--batches-per-epoch", type=int, default=20)
parser.add_argument("--epoch-seconds", type=float, default=0,
                    help="the least time an epoch takes (a bigger model's pace)")
parser.add_argument("--forceful", action="store_true",
                    help="removes a node's ranks at once (killed) instead of at a commit")
parser.add_argument("--change-frequency-s", type=int, default=20,
                    help="seconds between the discovery's host changes")
parser.add_argument("--max-hosts", type=int, default=5,
                    help="TestDiscovery's max_hosts (with as many nodes, it alternates: "
                         "one host leaves, then it comes back)")
args = parser.parse_args()


def run():
    hvd.init()
    torch.manual_seed(42)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr),
                                         named_parameters=model.named_parameters())
    data = torch.randn(256, 16, generator=torch.Generator().manual_seed(0))
    target = data.sum(dim=1, keepdim=True)

    @hvd.elastic.run
    def train(state):
        while state.epoch < args.epochs:
            began = time.monotonic()
            loss = None
            for batch in range(args.batches_per_epoch):
                i = (batch * hvd.size() + hvd.rank()) % 16
                x, y = data[i * 16:(i + 1) * 16], target[i * 16:(i + 1) * 16]
                optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                optimizer.step()
            time.sleep(max(0.0, args.epoch_seconds - (time.monotonic() - began)))
            if hvd.rank() == 0:  # before the commit, which may end this run (kept anyway)
                ray_logger.log({"epoch": state.epoch, "world_size": hvd.size(),
                                "loss": float(loss)})
            state.epoch += 1
            state.commit()  # saves the state, then host changes take effect
        return state.epoch

    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, epoch=0)
    return train(state)


class progress_callback:
    """Prints what rank 0 logs, in the order it logged it."""

    def __call__(self, info):
        print(f"epoch {info['epoch']} world_size {info['world_size']} loss {info['loss']:.4f}",
              flush=True)


if __name__ == '__main__':
    from caf_hvd import ElasticRayExecutor
    settings = ElasticRayExecutor.create_settings(verbose=1)
    settings.discovery = TestDiscovery(
        min_hosts=2,
        max_hosts=args.max_hosts,
        change_frequency_s=args.change_frequency_s,
        use_gpu=False,
        cpus_per_slot=1,
        _graceful=not args.forceful,
        verbose=False)
    executor = ElasticRayExecutor(
        settings, use_gpu=False, cpus_per_slot=1, override_discovery=False)
    executor.start()
    results = executor.run(lambda: run(), callbacks=[progress_callback()])
    print(f"finished {results[0]} epochs on {len(results)} worker(s)", flush=True)
