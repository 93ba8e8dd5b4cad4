#!/usr/bin/env python3
"""Stalls of real Horovod's collectives when several node agents share a machine.

usage: bench/horovod_stalls.py [--rounds N] [--iterations N] [--horovodrun]
                               [--workload init|process-sets]
                               NAME=PATH/TO/caf-hvd [NAME=PATH ...]

Each round starts two node agents of each build (2 slots each, on 127.0.0.1) and a
`caf-hvd driver -np 4` over them, so each agent runs 2 of the 4 ranks, as in the
real-Horovod suite's test_2 (Horovod's test_torch.py on 2 agents x 2). Every rank
(/usr/bin/python3, Horovod from scripts/setup-horovod.sh) repeats --iterations times
what each test of test_torch.py does: hvd.init(), one allreduce of 17x17 floats,
hvd.barrier(), hvd.shutdown(). With --workload process-sets, an iteration is what
test_horovod_allreduce_grad_process_sets does (even and odd process sets added, an
allreduce with its gradient in each, both removed) and what the next test,
test_horovod_allreduce_inplace, does, each followed by the suite's tearDown (the pair
where ranks 1 and 3 once failed); every result is checked, and a wrong sum or an error
fails the job. Per build this prints over the rounds: the job's wall time (median, min,
max), the median and the slowest iteration (rank 0's clock), and how many iterations
stalled: took over 1 s (init; an idle iteration takes 0.2-0.4 s here) or over 5 s
(process-sets; an idle iteration takes about 2 s).
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

# Each workload defines iteration(); TIMED runs it --iterations times and prints rank 0's
# times.
HEADER = r"""
import itertools, os, time, numpy as np, torch, horovod.torch as hvd
os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"  # as test_torch.py sets it
"""
TIMED = r"""
took = []
for i in range(int(os.environ["STALLS_ITERATIONS"])):
    t0 = time.monotonic()
    iteration()
    took.append(time.monotonic() - t0)
if os.environ.get("HOROVOD_RANK") == "0":
    print("iterations " + " ".join(f"{t:.4f}" for t in took), flush=True)
"""

INIT = r"""
def iteration():
    hvd.init()
    hvd.allreduce(torch.ones(17, 17), name="x")
    hvd.barrier()
    hvd.shutdown()
"""

PROCESS_SETS = r"""
def teardown():  # test_torch.py's tearDown
    hvd.barrier()
    hvd.shutdown()


def grad_process_sets():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    even = [r for r in range(size) if r % 2 == 0]
    odd = [r for r in range(size) if r % 2 == 1]
    even_set, odd_set = hvd.add_process_set(even), hvd.add_process_set(odd)
    for dtype, dim in itertools.product([torch.FloatTensor, torch.DoubleTensor], [1, 2, 3]):
        torch.manual_seed(1234)
        even_t = torch.FloatTensor(*([17] * dim)).random_(-100, 100)
        odd_t = torch.FloatTensor(*([17] * dim)).random_(-100, 100)
        t, ps, n = ((even_t, even_set, len(even)) if rank in even else (odd_t, odd_set, len(odd)))
        t = t.type(dtype)
        t.requires_grad_()
        hvd.allreduce(t, average=False, process_set=ps).backward(torch.ones([17] * dim).type(dtype))
        err = np.linalg.norm(np.ones([17] * dim) * n - t.grad.data.numpy())
        assert err < 1e-8, f"rank {rank}: process set gradient off by {err}"
    hvd.remove_process_set(odd_set)
    hvd.remove_process_set(even_set)


def allreduce_inplace():
    hvd.init()
    size = hvd.size()
    for dtype, dim in itertools.product([torch.IntTensor, torch.LongTensor, torch.FloatTensor,
                                         torch.DoubleTensor, torch.HalfTensor], [1, 2, 3]):
        torch.manual_seed(1234)
        t = torch.FloatTensor(*([17] * dim)).random_(-100, 100)
        want, t = (t * size).type(dtype), t.type(dtype)
        hvd.allreduce_(t, average=False)
        assert torch.allclose(t.float(), want.float(), 0), \
            f"rank {hvd.rank()}: wrong in-place sum ({dtype}, {dim} dims)"


def iteration():
    for test in (grad_process_sets, allreduce_inplace):
        test()
        teardown()
"""
# workload -> (program, what an iteration does, seconds over which an iteration stalled)
WORKLOADS = {"init": (INIT, "init, allreduce, barrier, shutdown", 1),
             "process-sets": (PROCESS_SETS, "test_torch.py's process-set test and the next, "
                                            "each with its tearDown", 5)}


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
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="init",
                    help="what each iteration does (default: init)")
    ap.add_argument("builds", nargs="+", type=named_build)
    args = ap.parse_args()
    # the harness makes the tests' cluster credentials with the caf-hvd it finds here
    os.environ["CAF_HVD"] = os.path.abspath(args.builds[0][1])
    program = os.path.join("/tmp", f"caf-hvd-stalls-{os.getpid()}.py")
    with open(program, "w") as f:
        f.write(HEADER + WORKLOADS[args.workload][0] + TIMED)
    stall = WORKLOADS[args.workload][2]
    runs = list(args.builds) + ([("horovodrun", None)] if args.horovodrun else [])
    got = {name: [] for name, _ in runs}
    try:
        for r in range(args.rounds):
            for name, build in runs:
                wall, its = one_job(build, program, args.iterations, build is None)
                got[name].append((wall, its))
                print(f"round {r + 1} {name}: {wall:.1f} s, slowest iteration "
                      f"{max(its):.2f} s, {sum(t > stall for t in its)} over {stall} s", flush=True)
    finally:
        os.unlink(program)
    print(f"\n{args.rounds} rounds of {args.iterations} iterations "
          f"({WORKLOADS[args.workload][1]}) by 4 ranks on 2 hosts x 2 of this machine:")
    print("| launcher | job wall, s (median, min-max) | iteration median, s | slowest, s "
          f"| iterations over {stall} s |")
    print("|---|---|---|---|---|")
    for name, _ in runs:
        walls = [w for w, _ in got[name]]
        its = [t for _, i in got[name] for t in i]
        print(f"| {name} | {statistics.median(walls):.1f} ({min(walls):.1f}-{max(walls):.1f}) "
              f"| {statistics.median(its):.2f} | {max(its):.2f} | "
              f"{sum(t > stall for t in its)} of {len(its)} |")


if __name__ == "__main__":
    sys.exit(main())
