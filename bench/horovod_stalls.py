#!/usr/bin/env python3
"""Stalls of real Horovod's collectives when several node agents share a machine.

usage: bench/horovod_stalls.py [--rounds N] [--iterations N] [--horovodrun]
                               NAME=PATH/TO/caf-hvd [NAME=PATH ...]

Each round starts two node agents of each build (2 slots each, on 127.0.0.1) and a
`caf-hvd driver -np 4` over them, so each agent runs 2 of the 4 ranks, as in the
real-Horovod suite's test_2 (Horovod's test_torch.py on 2 agents x 2). Every rank
(/usr/bin/python3, Horovod from scripts/setup-horovod.sh) repeats --iterations times
what each test of test_torch.py does: hvd.init(), one allreduce of 17x17 floats,
hvd.barrier(), hvd.shutdown(). Per build this prints over the rounds: the job's wall
time (median, min, max), the median and the slowest iteration (rank 0's clock), and
how many iterations took over 1 s, a stall (an idle iteration takes 0.2-0.4 s here).
With --horovodrun, horovodrun runs the same program with the same layout
(`-H localhost:2,127.0.0.1:2`: two host names, cross size 2), through
tests/cluster/horovod_programs/horovodrun_store_fix.py (horovodrun 0.28.1's own
rendezvous server aborts re-inits under load; that file says why). Builds and
horovodrun run interleaved round by round."""

import argparse
import os
import statistics
import sys
import time

from bench_env import ROOT, named_build

PROGRAM = r"""
import os, time, torch, horovod.torch as hvd
os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"  # as test_torch.py sets it
took = []
for i in range(int(os.environ["STALLS_ITERATIONS"])):
    t0 = time.monotonic()
    hvd.init()
    hvd.allreduce(torch.ones(17, 17), name="x")
    hvd.barrier()
    hvd.shutdown()
    took.append(time.monotonic() - t0)
if os.environ.get("HOROVOD_RANK") == "0":
    print("iterations " + " ".join(f"{t:.4f}" for t in took), flush=True)
"""


def one_job(build, program, iterations, horovodrun):
    import harness
    import run_horovod_tests as H
    tag = f"stalls-{os.getpid()}-{time.monotonic_ns()}"
    env = H.horovod_env(H.horovod_site(), tag)
    env["STALLS_ITERATIONS"] = str(iterations)
    c = None
    try:
        if horovodrun:
            args = [H.PYTHON, os.path.join(ROOT, "tests", "cluster", "horovod_programs",
                                           "horovodrun_store_fix.py"),
                    "--gloo", "-np", "4", "-H", "localhost:2,127.0.0.1:2", H.PYTHON, program]
        else:
            harness.CAF_HVD = build  # the agents Cluster starts
            c = harness.Cluster()
            for name in ("stall-a", "stall-b"):
                c.node(name, slots=2, extra=H.LINK)
            args = [build, "driver", *H.LINK, "-np", "4", "-H",
                    f"{c.spec('stall-a', 2)},{c.spec('stall-b', 2)}", "--", H.PYTHON, program]
        t0 = time.monotonic()
        rc, out, err = H.run_cmd(args, env, timeout=600)
        wall = time.monotonic() - t0
    finally:
        if c:
            c.close()
        H.kill_tagged(tag)
    line = next((l for l in out.splitlines() if "iterations " in l), None)
    if rc != 0 or line is None:
        raise SystemExit(f"the job failed (exit {rc}):\n{out[-2000:]}\n{err[-2000:]}")
    return wall, [float(x) for x in line.split("iterations ", 1)[1].split()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=40)
    ap.add_argument("--horovodrun", action="store_true",
                    help="also horovodrun with the same layout")
    ap.add_argument("builds", nargs="+", type=named_build)
    args = ap.parse_args()
    # the harness makes the tests' cluster credentials with the caf-hvd it finds here
    os.environ["CAF_HVD"] = os.path.abspath(args.builds[0][1])
    program = os.path.join("/tmp", f"caf-hvd-stalls-{os.getpid()}.py")
    with open(program, "w") as f:
        f.write(PROGRAM)
    runs = list(args.builds) + ([("horovodrun", None)] if args.horovodrun else [])
    got = {name: [] for name, _ in runs}
    try:
        for r in range(args.rounds):
            for name, build in runs:
                wall, its = one_job(build, program, args.iterations, build is None)
                got[name].append((wall, its))
                print(f"round {r + 1} {name}: {wall:.1f} s, slowest iteration "
                      f"{max(its):.2f} s, {sum(t > 1 for t in its)} over 1 s", flush=True)
    finally:
        os.unlink(program)
    print(f"\n{args.rounds} rounds of {args.iterations} iterations (init, allreduce, barrier, "
          f"shutdown) by 4 ranks on 2 hosts x 2 of this machine:")
    print("| launcher | job wall, s (median, min-max) | iteration median, s | slowest, s "
          "| iterations over 1 s |")
    print("|---|---|---|---|---|")
    for name, _ in runs:
        walls = [w for w, _ in got[name]]
        its = [t for _, i in got[name] for t in i]
        print(f"| {name} | {statistics.median(walls):.1f} ({min(walls):.1f}-{max(walls):.1f}) "
              f"| {statistics.median(its):.2f} | {max(its):.2f} | "
              f"{sum(t > 1 for t in its)} of {len(its)} |")


if __name__ == "__main__":
    sys.exit(main())
