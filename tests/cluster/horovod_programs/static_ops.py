"""A small static Horovod (PyTorch) program for tests/cluster/run_horovod_tests.py.

Calls hvd.init(), checks that Horovod's own view of the job (rank, size, local and
cross rank and size) equals the HOROVOD_* environment the launcher gave this process,
then runs allreduce (sum, average), an in-place async allreduce, allgather (a different
row count per rank) and broadcast, and checks every result. Prints one line

    place rank R size N local LR/LS cross CR/CS host H

after init and, when everything holds,

    OK rank R size N sum [...] avg [...] inplace X gather [...] bcast X

Any wrong value raises (the rank exits 1). With --exit-rank R --exit-code C, rank R
calls sys.exit(C) right after init and the other ranks sleep instead of running
collectives: a launcher must end the job with C, naming rank R, without waiting for
them."""

import argparse
import os
import socket
import sys
import time

import torch
import horovod.torch as hvd

KEYS = ("rank", "size", "local_rank", "local_size", "cross_rank", "cross_size")


def check(what, got, want):
    if got != want:
        raise AssertionError(f"rank {hvd.rank()}: {what}: got {got!r}, want {want!r}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--exit-rank", type=int, default=None)
    p.add_argument("--exit-code", type=int, default=3)
    a = p.parse_args()

    hvd.init()
    env = {k: int(os.environ[f"HOROVOD_{k.upper()}"]) for k in KEYS}
    got = {k: getattr(hvd, k)() for k in KEYS}
    r, n = got["rank"], got["size"]
    print(f"place rank {r} size {n} local {got['local_rank']}/{got['local_size']} "
          f"cross {got['cross_rank']}/{got['cross_size']} "
          f"host {os.environ.get('HOROVOD_HOSTNAME', socket.gethostname())}", flush=True)
    check("Horovod's place vs HOROVOD_* environment", got, env)

    if a.exit_rank is not None:
        if r == a.exit_rank:
            sys.exit(a.exit_code)
        time.sleep(120)  # the launcher stops us when the other rank fails
        return

    base = torch.arange(4, dtype=torch.float32)
    mine = base + r
    total = base * n + n * (n - 1) / 2  # sum over ranks of base + rank
    s = hvd.allreduce(mine, op=hvd.Sum, name="static_ops.sum")
    check("allreduce sum", s.tolist(), total.tolist())
    avg = hvd.allreduce(mine, op=hvd.Average, name="static_ops.avg")
    check("allreduce average", avg.tolist(), (total / n).tolist())

    x = torch.full((3,), float(r + 1))
    handle = hvd.allreduce_async_(x, op=hvd.Sum, name="static_ops.inplace")
    out = hvd.synchronize(handle)
    check("in-place async allreduce", x.tolist(), [n * (n + 1) / 2] * 3)
    check("in-place async allreduce returns its tensor", out.data_ptr(), x.data_ptr())

    g = hvd.allgather(torch.full((r + 1, 2), float(r)), name="static_ops.gather")
    want = torch.cat([torch.full((q + 1, 2), float(q)) for q in range(n)])
    check("allgather", g.tolist(), want.tolist())

    b = torch.full((2,), float(r) * 10)
    hvd.broadcast_(b, root_rank=n - 1, name="static_ops.bcast")
    check("broadcast from the last rank", b.tolist(), [float(n - 1) * 10] * 2)

    print(f"OK rank {r} size {n} sum {s.tolist()} avg {avg.tolist()} inplace {x[0].item()} "
          f"gather {g[:, 0].tolist()} bcast {b[0].item()}", flush=True)


if __name__ == "__main__":
    main()
