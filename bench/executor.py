#!/usr/bin/python3
"""Executor round trips: `execute(lambda w: None)` and a call returning 1 MiB, through
caf_hvd.Executor on 1, 4 and 8 local workers and on 2 node agents x 4 workers (mutual
TLS, loopback), side by side with multiprocessing.Pool(n).map of the same function on
the same machine (the floor: pickling through pipes, no launcher in between).

usage: bench/executor.py [--calls N] [--build DIR]

Prints the median and p90 per call (ms) as a Markdown table. Needs Debian's
python3-cloudpickle (run with /usr/bin/python3)."""

import argparse
import multiprocessing
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_env import ROOT  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, "python"))

from caf_hvd import Executor  # noqa: E402
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--build", default=None)
    a = ap.parse_args()
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
