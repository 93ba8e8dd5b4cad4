"""A small elastic program for lifecycle tests (stdlib only), following a real Horovod
worker's protocol: the first join takes rank and size from the environment, a re-join
(when the generation changes) asks rank_and_size; exits 0 after --seconds. With
--checkpoint-on-term, a slot that is told it left the job traps SIGTERM (as a program
that checkpoints would) and keeps running, so only SIGKILL ends it."""

import argparse
import os
import signal
import time
import urllib.request


def get(path, timeout=120):
    addr = os.environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"]
    port = os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"]
    with urllib.request.urlopen(f"http://{addr}:{port}{path}", timeout=timeout) as r:
        return r.read().decode()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--checkpoint-on-term", action="store_true")
    a = ap.parse_args()
    slot = f"{os.environ['HOROVOD_HOSTNAME']}:{os.environ['HOROVOD_LOCAL_RANK']}"
    end = time.monotonic() + a.seconds
    first = first_gen = True
    while True:
        if first:
            rank, size = int(os.environ["HOROVOD_RANK"]), int(os.environ["HOROVOD_SIZE"])
            first = False
        else:
            rank, size = (int(x) for x in get(f"/rank_and_size/{slot}").split(",")[:2])
        if rank < 0:
            print(f"slot {slot} left the job", flush=True)
            if a.checkpoint_on_term:
                signal.signal(signal.SIGTERM, lambda *_: print(f"slot {slot} checkpoints on "
                                                               "SIGTERM", flush=True))
                while True:
                    time.sleep(0.1)
            return
        if first_gen:
            gen, first_gen = int(os.environ["CAF_HVD_GENERATION"]), False  # started in it
        else:
            gen = int(get("/elastic/update").split()[1])
        print(f"slot {slot} joined generation {gen} as rank {rank} of {size} (MASTER_PORT "
              f"{os.environ.get('MASTER_PORT')}, agent store "
              f"{os.environ.get('TORCHELASTIC_USE_AGENT_STORE', 'unset')})", flush=True)
        while time.monotonic() < end:
            now = int(get(f"/elastic/update?after={gen}&wait_ms=200").split()[1])
            if now > gen:
                break
        else:
            return


if __name__ == "__main__":
    main()
