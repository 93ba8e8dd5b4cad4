#!/usr/bin/python3
"""The wire guard's cost (runtime/network/basp_guard.hpp), side by side in one run with it
on and off (CAF_HVD_WIRE_GUARD=off, for this benchmark only): caf_hvd.Executor with 4
workers on 2 node agents x 2 over mutual TLS, a no-op `execute` (median and p90 ms) and a
64 MiB payload sent to every worker (MiB/s through the agents, the guard reading each
frame's header and its payload's first bytes). Rounds alternate on/off so drift on this
shared machine falls on both.

usage: bench/wire_guard.py [--calls N] [--rounds R]   (needs Debian's python3-cloudpickle)"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_env import ROOT  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, "python"))

from caf_hvd import Executor  # noqa: E402
from harness import Cluster  # noqa: E402

BIG = b"x" * (64 << 20)


def noop(_=None):
    return None


def one_round(guard, calls):
    if guard:
        os.environ.pop("CAF_HVD_WIRE_GUARD", None)
    else:
        os.environ["CAF_HVD_WIRE_GUARD"] = "off"
    c = Cluster()
    try:
        c.node("g1")
        c.node("g2")
        with Executor(num_workers=4, hosts=f"{c.spec('g1', 2)},{c.spec('g2', 2)}") as ex:
            ex.start()
            for _ in range(20):
                ex.execute(noop)
            samples = []
            for _ in range(calls):
                t = time.perf_counter()
                ex.execute(noop)
                samples.append((time.perf_counter() - t) * 1000)
            big = BIG
            ex.execute(lambda _=None: len(big))  # warm-up
            t = time.perf_counter()
            for _ in range(3):
                assert ex.execute(lambda _=None: len(big)) == [len(BIG)] * 4
            mibs = 3 * 4 * 64 / (time.perf_counter() - t)
    finally:
        c.close()
        os.environ.pop("CAF_HVD_WIRE_GUARD", None)
    return samples, mibs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--build", help="the build directory (default: build/)")
    a = ap.parse_args()
    got = {True: ([], []), False: ([], [])}
    for _ in range(a.rounds):
        for guard in (True, False):
            samples, mibs = one_round(guard, a.calls)
            got[guard][0].extend(samples)
            got[guard][1].append(mibs)
    print("| wire guard | no-op execute, median ms | p90 ms | 64 MiB to 4 workers, MiB/s |")
    print("|---|---|---|---|")
    for guard in (True, False):
        s = sorted(got[guard][0])
        print(f"| {'on' if guard else 'off'} | {statistics.median(s):.3f} | "
              f"{s[int(len(s) * 0.9) - 1]:.3f} | {statistics.median(got[guard][1]):.0f} |")


if __name__ == "__main__":
    main()
