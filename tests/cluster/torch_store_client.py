"""Rank programs for the torch store tests: a torch 2.x TCPStore client written from
torch's wire format (VALIDATE with the magic, PING, then SET=1, GET=3, ADD=4, CHECK=5,
WAIT=6; keys carry torch's "/" prefix), and modes that use it inside a caf-hvd job.

usage: torch_store_client.py mixed | garbage [SECONDS] | generations | flood DIR ALLREDUCE"""

import os
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request

MAGIC = 0x3C85F7CE


class Store2:
    """A torch >= 2.5 client: what TCPStore sends on connect and per query."""

    def __init__(self, host, port, timeout=30):
        self.s = socket.create_connection((host, port), timeout=timeout)
        self.s.sendall(struct.pack("<BI", 0, MAGIC) + struct.pack("<BI", 13, os.getpid()))
        (nonce,) = struct.unpack("<I", self.recv(4))
        assert nonce == os.getpid(), f"PING answered {nonce}, not {os.getpid()}"

    def recv(self, n):
        out = b""
        while len(out) < n:
            chunk = self.s.recv(n - len(out))
            if not chunk:
                raise ConnectionError("the store closed the connection")
            out += chunk
        return out

    @staticmethod
    def string(b):
        return struct.pack("<Q", len(b)) + b

    def set(self, key, value):
        self.s.sendall(bytes([1]) + self.string(key.encode()) + self.string(value))

    def wait(self, keys):
        self.s.sendall(bytes([6]) + struct.pack("<Q", len(keys))
                       + b"".join(self.string(k.encode()) for k in keys))
        assert self.recv(1) == b"\x00"

    def get(self, key):
        self.wait([key])  # as torch's client does before every GET
        self.s.sendall(bytes([3]) + self.string(key.encode()))
        (n,) = struct.unpack("<Q", self.recv(8))
        return self.recv(n)

    def add(self, key, delta):
        self.s.sendall(bytes([4]) + self.string(key.encode()) + struct.pack("<q", delta))
        return struct.unpack("<q", self.recv(8))[0]

    def check(self, keys):
        self.s.sendall(bytes([5]) + struct.pack("<Q", len(keys))
                       + b"".join(self.string(k.encode()) for k in keys))
        return self.recv(1) == b"\x00"


def master():
    return os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])


def mixed():
    """Rank 0 is Debian's torch (1.13) TCPStore client, rank 1 the 2.x client; they
    exchange a key each way through the job's store."""
    rank = int(os.environ["RANK"])
    assert os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    if rank == 0:
        import datetime
        import torch
        import torch.distributed as dist
        store = dist.TCPStore(*master(), 2, False, datetime.timedelta(seconds=30))
        store.set("from113", f"torch {torch.__version__}")
        got = store.get("from2x").decode()  # waits for rank 1
        print(f"rank 0 (torch {torch.__version__}) got: {got}", flush=True)
    else:
        store = Store2(*master())
        store.add("init/", 1)  # as a torch client with world_size does
        got = store.get("/from113").decode()
        store.set("/from2x", b"the 2.x wire client")
        print(f"rank 1 (2.x wire client) got: {got}", flush=True)


def garbage(hold):
    """Speaks the 2.x handshake, then a query type no torch has (99)."""
    s = Store2(*master())
    s.s.sendall(bytes([99]))
    try:
        closed = s.s.recv(1) == b""
    except OSError:
        closed = True
    print(f"store closed the connection: {closed}", flush=True)
    time.sleep(hold)  # a real client would now wait out its own timeout
    sys.exit(3)


def rendezvous(path):
    addr = os.environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"]
    port = os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"]
    with urllib.request.urlopen(f"http://{addr}:{port}{path}", timeout=60) as r:
        return r.read().decode()


def generations():
    """Elastic: each generation's store starts empty. Gen 1 leaves a key behind; every
    member of generation 2 (the survivor and the new rank) must not see it."""
    host = os.environ["HOROVOD_HOSTNAME"]
    slot = f"{host}:{os.environ['HOROVOD_LOCAL_RANK']}"
    count = os.environ["TORCHELASTIC_RESTART_COUNT"]
    gen = 0
    while True:
        if gen == 0:  # started with a released plan in its environment, as Horovod is
            rank, size = os.environ["HOROVOD_RANK"], os.environ["HOROVOD_SIZE"]
            gen = int(os.environ["CAF_HVD_GENERATION"])
        else:  # a re-join asks for its place
            rank, size = rendezvous(f"/rank_and_size/{slot}").split(",")[:2]
            gen = int(rendezvous("/elastic/update").split("\n")[0].split()[1])
        store = Store2(*master())
        # Members of one generation race each other; only earlier generations' keys
        # must be gone.
        stale = any(store.check([f"/set-in-generation-{g}"]) for g in range(1, gen))
        print(f"slot {slot} restart_count {count} generation {gen} rank {rank}/{size} "
              f"sees stale key: {stale}", flush=True)
        store.set(f"/set-in-generation-{gen}", b"x")
        assert store.check([f"/set-in-generation-{gen}"])
        if int(size) >= 2:
            return
        # Alone: wait for the next generation, then join it.
        while int(rendezvous(f"/elastic/update?after={gen}&wait_ms=1000").split()[1]) <= gen:
            pass


def flood(flag_dir, allreduce):
    """Rank 1 floods the job's servers: 64 MiB torch store SETs until the store closes it
    (the job's budget), 8 MiB rendezvous PUTs into an ad-hoc scope until they are
    refused, and 100 idle connections to each server, held while the job goes on. Rank 0
    waits for that. Then both ranks read the store with a fresh client and run
    caf-hvd-allreduce, whose Gloo rendezvous goes through the same server."""
    rank = int(os.environ["RANK"])
    addr = os.environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"]
    port = int(os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"])
    flag = os.path.join(flag_dir, "flooded")
    idle = []
    if rank == 1:
        s = Store2(*master())
        sets = 0
        big = b"x" * (64 << 20)
        try:
            while sets < 100:
                s.set(f"/flood{sets}", big)
                s.check([f"/flood{sets}"])  # SET has no reply: a round trip shows it was kept
                sets += 1
        except (ConnectionError, OSError):
            pass
        puts, code = 0, None
        while puts < 1000 and code is None:
            req = urllib.request.Request(f"http://{addr}:{port}/junk/{puts}",
                                         data=b"y" * (8 << 20), method="PUT")
            try:
                urllib.request.urlopen(req, timeout=30).read()
                puts += 1
            except urllib.error.HTTPError as e:
                code = e.code
        idle = [socket.create_connection((addr, port)) for _ in range(100)]
        idle += [socket.create_connection(master()) for _ in range(100)]
        print(f"flood: {sets} store SETs of 64 MiB kept, then the store closed the client; "
              f"{puts} rendezvous PUTs of 8 MiB, then {code}", flush=True)
        open(flag, "w").close()
    else:
        deadline = time.monotonic() + 120
        while not os.path.exists(flag):
            if time.monotonic() > deadline:
                sys.exit("rank 0: the flood did not finish")
            time.sleep(0.05)
    fresh = Store2(*master())
    print(f"rank {rank}: a fresh store client sees the flood's first key: "
          f"{fresh.check(['/flood0'])}", flush=True)
    sys.exit(subprocess.run([allreduce, "--sizes", "4K,64K"]).returncode)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "mixed":
        mixed()
    elif mode == "garbage":
        garbage(float(sys.argv[2]) if len(sys.argv) > 2 else 0)
    elif mode == "generations":
        generations()
    elif mode == "flood":
        flood(sys.argv[2], sys.argv[3])
    else:
        sys.exit(f"unknown mode {mode}")
