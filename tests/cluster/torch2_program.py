"""Rank programs for the torch 2.x suite, run by real torch (Debian 13's 2.6 in a chroot,
or Debian 12's 1.13 on the host) inside caf-hvd jobs: `allreduce` as users write it (the
default env:// rendezvous); the others open a client of the job's store at MASTER_PORT
themselves, as a torch built without libuv must (docs/torch.md).

usage: torch2_program.py allreduce | queries | mixed | generations"""

import datetime
import os
import sys
import time
import urllib.request

import torch
import torch.distributed as dist


def who():
    return f"rank {os.environ['RANK']}/{os.environ['WORLD_SIZE']} (torch {torch.__version__})"


def allreduce():
    """init_process_group("gloo") with env://, then a sum over all ranks."""
    dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank() + 1), 1.0])
    dist.all_reduce(t)
    print(f"{who()}: all_reduce gave {t.tolist()}", flush=True)
    dist.destroy_process_group()


def served_store():
    """A client of the job's store: the TCPStore env:// would build, minus libuv (which
    torch 1.13 does not know and Debian's 2.6 lacks)."""
    kw = {"use_libuv": False} if "use_libuv" in (dist.TCPStore.__init__.__doc__ or "") else {}
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                         int(os.environ["WORLD_SIZE"]), False, datetime.timedelta(seconds=60),
                         **kw)


def queries():
    """Every query torch 2.6's TCPStore client sends, each rank with its own keys; a wait
    that times out and more queries on that connection; a barrier over the store (rank
    0 waits for every rank's key and counts the keys); then init_process_group on that
    store and an all_reduce."""
    store = served_store()
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    k = f"r{rank}/"
    out = []
    store.set(k + "a", "1")
    out.append(("get", store.get(k + "a")))
    store.wait([k + "a"])
    out.append(("wait", "ok"))
    out.append(("add", store.add(k + "n", 5)))
    out.append(("add", store.add(k + "n", -2)))
    store.append(k + "log", "x")
    store.append(k + "log", "yz")
    out.append(("append", store.get(k + "log")))
    store.multi_set([k + "m1", k + "m2"], ["v1", "v2"])
    out.append(("multi_get", store.multi_get([k + "m1", k + "m2"])))
    out.append(("compare_set", store.compare_set(k + "a", "1", "2")))
    out.append(("compare_set", store.compare_set(k + "a", "1", "3")))
    out.append(("compare_set", store.compare_set(k + "new", "", "fresh")))
    out.append(("check", store.check([k + "a", k + "m1"])))
    out.append(("check", store.check([k + "missing"])))
    out.append(("delete_key", store.delete_key(k + "m1")))
    out.append(("delete_key", store.delete_key(k + "m1")))
    out.append(("check", store.check([k + "m1"])))
    t0 = time.monotonic()
    try:
        store.wait([k + "never"], datetime.timedelta(seconds=1))
        out.append(("wait timeout", "no exception"))
    except Exception as e:  # torch raises DistStoreError (a RuntimeError) on its timeout
        took = time.monotonic() - t0
        out.append(("wait timeout", f"{type(e).__name__}, within its timeout: {0.9 < took < 30}"))
    out.append(("get after timeout", store.get(k + "a")))
    store.set(k + "b", b"\x00\xffbinary")
    out.append(("get", store.get(k + "b")))
    out.append(("add", store.add("all", 1)))
    store.set(f"done/{rank}", "1")
    if rank == 0:
        store.wait([f"done/{r}" for r in range(size)], datetime.timedelta(seconds=60))
        out.append(("num_keys", store.num_keys()))
        store.set("finished", "1")
    store.wait(["finished"], datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=dist.PrefixStore("pg", store), rank=rank,
                            world_size=size)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    out.append(("all_reduce", t.item()))
    dist.destroy_process_group()
    for name, value in out:
        print(f"{name}: {value!r}", flush=True)


def mixed():
    """Ranks of different torch versions in one job: each publishes its version through
    the job's store and reads every other's."""
    store = served_store()
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store.set(f"version/{rank}", torch.__version__)
    store.wait([f"version/{r}" for r in range(size)], datetime.timedelta(seconds=60))
    versions = [store.get(f"version/{r}").decode() for r in range(size)]
    print(f"{who()} sees versions {versions}", flush=True)


def rendezvous(path):
    addr = os.environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"]
    port = os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"]
    with urllib.request.urlopen(f"http://{addr}:{port}{path}", timeout=60) as r:
        return r.read().decode()


def generations():
    """Elastic: every member of a generation opens the job's store and must not see the
    key the previous generation left behind; gen 1's lone rank waits for gen 2 and
    re-joins it (a new client and init_process_group, as torch elastic programs do)."""
    slot = f"{os.environ['HOROVOD_HOSTNAME']}:{os.environ['HOROVOD_LOCAL_RANK']}"
    gen = int(os.environ["CAF_HVD_GENERATION"])
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    while True:
        os.environ["WORLD_SIZE"] = str(size)
        store = served_store()
        stale = [g for g in range(1, gen) if store.check([f"set-in-generation-{g}"])]
        store.set(f"set-in-generation-{gen}", "x")
        dist.init_process_group("gloo", store=store, rank=rank, world_size=size)
        t = torch.tensor([1.0])
        dist.all_reduce(t)
        print(f"slot {slot} generation {gen} rank {rank}/{size} sees keys of earlier "
              f"generations: {stale}; all_reduce {t.item()}", flush=True)
        dist.destroy_process_group()
        if size >= 2:
            return
        while int(rendezvous(f"/elastic/update?after={gen}&wait_ms=1000").split()[1]) <= gen:
            pass
        r, s = rendezvous(f"/rank_and_size/{slot}").split(",")[:2]
        rank, size = int(r), int(s)
        gen = int(rendezvous("/elastic/update").split("\n")[0].split()[1])


if __name__ == "__main__":
    modes = {"allreduce": allreduce, "queries": queries, "mixed": mixed,
             "generations": generations}
    if len(sys.argv) != 2 or sys.argv[1] not in modes:
        sys.exit(__doc__)
    modes[sys.argv[1]]()
