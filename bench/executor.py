#!/usr/bin/python3
"""Executor round trips: `execute(lambda w: None)` and a call returning 1 MiB, through
caf_hvd.Executor on 1, 4 and 8 local workers and on 2 node agents x 4 workers (mutual
TLS, loopback), side by side with multiprocessing.Pool(n).map of the same function on
the same machine (the floor: pickling through pipes, no launcher in between).

Then caf_hvd.train.HorovodTrainer.fit() of a loop that only reports (N epochs, 4
local workers) against the same loop under Executor.run, its reports sent with
caf_hvd.log: both from start to shutdown, median of --repeats runs.

usage: bench/executor.py [--calls N] [--epochs N] [--repeats N] [--part all|calls|trainer]

Prints the median and p90 per call (ms) as a Markdown table, then the trainer's table.
Needs Debian's python3-cloudpickle (run with /usr/bin/python3)."""

import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_env import ROOT  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, "python"))

import caf_hvd  # noqa: E402
from caf_hvd import Executor  # noqa: E402
from caf_hvd import train  # noqa: E402
from caf_hvd.train import RunConfig, ScalingConfig  # noqa: E402
from caf_hvd.train.horovod import HorovodTrainer  # noqa: E402
from harness import Cluster  # noqa: E402

MIB = b"x" * (1 << 20)


def noop(_=None):
    return None


def one_mib(_=None):
    return MIB


def timed(fn, calls):
    for _ in range(max(3, calls // 10)):  # warm-up
        fn()
    out = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return out


def row(name, samples):
    samples = sorted(samples)
    p90 = samples[int(len(samples) * 0.9) - 1]
    return f"| {name} | {statistics.median(samples):.3f} | {p90:.3f} |"


def trainer_loop(config):
    for epoch in range(config["epochs"]):
        train.report({"epoch": epoch, "loss": 1.0 / (epoch + 1)})


def logging_loop(config):
    for epoch in range(config["epochs"]):
        caf_hvd.log({"epoch": epoch, "loss": 1.0 / (epoch + 1)})


def trainer_overhead(epochs, repeats, workers=4):
    """Seconds from start to shutdown: HorovodTrainer.fit() and Executor.run of the same
    reporting loop (the executor's callback keeps rank 0's records, as fit() does)."""
    config = {"epochs": epochs}
    fits, runs = [], []
    with tempfile.TemporaryDirectory() as storage:
        for i in range(repeats):
            t = time.perf_counter()
            result = HorovodTrainer(trainer_loop, train_loop_config=config,
                                    scaling_config=ScalingConfig(num_workers=workers),
                                    run_config=RunConfig(name=f"bench{i}",
                                                         storage_path=storage)).fit()
            fits.append(time.perf_counter() - t)
            assert len(result.metrics_history) == epochs, result.metrics_history
            kept = []
            t = time.perf_counter()
            with Executor(num_workers=workers) as ex:
                ex.start()
                ex.run(logging_loop, args=(config,),
                       callbacks=[lambda r: kept.append(r) if r["rank"] == 0 else None])
            runs.append(time.perf_counter() - t)
            assert len(kept) == epochs, len(kept)
    return statistics.median(fits), statistics.median(runs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--epochs", type=int, action="append")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--part", choices=("all", "calls", "trainer"), default="all")
    ap.add_argument("--build", default=None)
    a = ap.parse_args()
    if a.part in ("all", "calls"):
        calls(a)
    if a.part in ("all", "trainer"):
        print()
        print("| reporting loop, 4 local workers | Executor.run s | HorovodTrainer.fit s | "
              "fit overhead per epoch ms |")
        print("|---|---|---|---|")
        for epochs in a.epochs or [10, 100, 1000]:
            fit, run = trainer_overhead(epochs, a.repeats)
            print(f"| {epochs} epochs | {run:.3f} | {fit:.3f} | "
                  f"{(fit - run) * 1000 / epochs:.2f} |", flush=True)


def calls(a):
    print("| setup | median ms | p90 ms |")
    print("|---|---|---|")
    for n in (1, 4, 8):
        with multiprocessing.Pool(n) as pool:
            print(row(f"Pool({n}).map no-op", timed(lambda: pool.map(noop, range(n)), a.calls)))
            print(row(f"Pool({n}).map 1 MiB", timed(lambda: pool.map(one_mib, range(n)),
                                                   a.calls // 4)))
        with Executor(num_workers=n) as ex:
            ex.start()
            print(row(f"Executor {n} local, execute no-op",
                      timed(lambda: ex.execute(noop), a.calls)))
            print(row(f"Executor {n} local, execute 1 MiB",
                      timed(lambda: ex.execute(one_mib), a.calls // 4)))
    c = Cluster()
    try:
        c.node("b1")
        c.node("b2")
        with Executor(num_workers=8, hosts=f"{c.spec('b1', 4)},{c.spec('b2', 4)}") as ex:
            ex.start()
            print(row("Executor 2 agents x 4 (mutual TLS), execute no-op",
                      timed(lambda: ex.execute(noop), a.calls)))
            print(row("Executor 2 agents x 4 (mutual TLS), execute 1 MiB",
                      timed(lambda: ex.execute(one_mib), a.calls // 4)))
    finally:
        c.close()


if __name__ == "__main__":
    main()
