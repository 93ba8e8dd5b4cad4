#!/usr/bin/env python3
"""Where a real Horovod start goes under caf-hvd run: per phase, for one or more builds.

usage: bench/horovod_start.py [--rounds N] [--np N] NAME=PATH/TO/caf-hvd [NAME=PATH ...]

Each rank (/usr/bin/python3, real Horovod from scripts/setup-horovod.sh) stamps the time
before `import torch, horovod.torch`, after it, after hvd.init(), after one allreduce
and after hvd.shutdown(). Per run this prints, over the ranks:
  - import: the slowest rank's import (the import floor of bench/launch.py is this, in
    four parallel processes);
  - init after the last import: from the slowest rank's import to the last rank's
    return from hvd.init() (Horovod's rendezvous through caf-hvd's server, Gloo's
    connects, the controller's start);
  - allreduce + shutdown: from there to the last rank's end;
  - outside the stamps: the whole job's wall time less the span from the first rank's
    first stamp to the last rank's last one: the interpreters' start and exit (an exit
    with torch loaded takes hundreds of ms) and whatever the launcher adds.
The floor row is four (--np) parallel processes that stamp around the same import and
exit, started by a shell: its "outside the stamps" is the interpreters' own, so a build's
excess over it is the launcher's own share. The "bare" row is the least a launcher can
do for this program: a Python script that starts Horovod's own RendezvousServer with
Horovod's host assignment, sets horovodrun's environment for each rank and starts them
(no ssh, no NIC discovery, no checks); its "whole job less its own start" is the time
from its first rank's start to its last rank's end (without its interpreter and imports
before, and its server's stop after), so it is the job under a launcher that costs
nothing. Builds, the floor and the bare launcher run
interleaved round by round; medians and minima in ms."""

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

from bench_env import named_build

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROGRAM = r"""
import time, os
t0 = time.time()
import torch, horovod.torch as hvd
t1 = time.time()
hvd.init()
t2 = time.time()
hvd.allreduce(torch.ones(1), name='x')
hvd.shutdown()
t3 = time.time()
print(f"stamps {t0:.6f} {t1:.6f} {t2:.6f} {t3:.6f}", flush=True)
"""

FLOOR = r"""
import time
t0 = time.time()
import torch, horovod.torch
t1 = time.time()
print(f"stamps {t0:.6f} {t1:.6f} {t1:.6f} {t1:.6f}", flush=True)
"""


# The least launcher: Horovod's own rendezvous server and horovodrun's environment for
# every rank, started at once. Prints when its first rank starts and when its last ends
# (stopping the server after that takes up to its 0.5 s poll interval).
BARE = r"""
import os, subprocess, sys, time
from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
from horovod.runner.http.http_server import RendezvousServer
np, program = int(sys.argv[1]), sys.argv[2]
plan = get_host_assignments(parse_hosts(f"localhost:{np}"), np)
server = RendezvousServer()
port = server.start()
server.init(plan)
common = dict(os.environ, HOROVOD_GLOO_RENDEZVOUS_ADDR="127.0.0.1",
              HOROVOD_GLOO_RENDEZVOUS_PORT=str(port), HOROVOD_CONTROLLER="gloo",
              HOROVOD_CPU_OPERATIONS="gloo", HOROVOD_GLOO_IFACE="lo", NCCL_SOCKET_IFNAME="lo")
print(f"first rank at {time.time():.6f}", flush=True)
ranks = [subprocess.Popen(["/usr/bin/python3", "-c", program], env=dict(
    common, HOROVOD_HOSTNAME=s.hostname, HOROVOD_RANK=str(s.rank), HOROVOD_SIZE=str(s.size),
    HOROVOD_LOCAL_RANK=str(s.local_rank), HOROVOD_LOCAL_SIZE=str(s.local_size),
    HOROVOD_CROSS_RANK=str(s.cross_rank), HOROVOD_CROSS_SIZE=str(s.cross_size)))
    for s in plan]
codes = [r.wait() for r in ranks]
print(f"last rank ended at {time.time():.6f}", flush=True)
server.stop()
sys.exit(max(codes))
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("builds", nargs="+", metavar="NAME=PATH", type=named_build)
    a = ap.parse_args()
    builds = a.builds
    site = subprocess.run([os.path.join(ROOT, "scripts", "setup-horovod.sh")],
                          capture_output=True, text=True)
    if site.returncode != 0:
        sys.exit(f"setup-horovod.sh failed: {site.stderr[-1000:]}")
    env = dict(os.environ, PYTHONPATH=site.stdout.strip().splitlines()[-1])
    phases = ("import", "init after the last import", "allreduce + shutdown",
              "outside the stamps", "whole job")
    floor = " ".join(["/usr/bin/python3 -c \"$0\" &"] * a.np) + " wait"
    runs = [("floor", ["sh", "-c", floor, FLOOR]),
            ("bare", ["/usr/bin/python3", "-c", BARE, str(a.np), PROGRAM])]
    runs += [(name, [path, "run", "-np", str(a.np), "--quiet", "--", "/usr/bin/python3", "-c",
                     PROGRAM]) for name, path in builds]
    res = {name: {p: [] for p in phases} for name, _ in runs}
    bare_free = []  # the bare launcher's whole job less its time before the first rank
    for _ in range(a.rounds):
        for name, cmd in runs:
            t0 = time.time()
            r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
            t1 = time.time()
            rows = [list(map(float, m.groups())) for m in
                    re.finditer(r"stamps ([\d.]+) ([\d.]+) ([\d.]+) ([\d.]+)", r.stdout)]
            if r.returncode != 0 or len(rows) != a.np:
                sys.exit(f"{name}: exit {r.returncode}, {len(rows)} ranks reported:\n"
                         f"{r.stdout[-1000:]}\n{r.stderr[-1000:]}")
            first = min(x[0] for x in rows)
            last_import = max(x[1] for x in rows)
            init_end = max(x[2] for x in rows)
            end = max(x[3] for x in rows)
            got = res[name]
            got["import"].append(max(x[1] - x[0] for x in rows) * 1000)
            got["init after the last import"].append((init_end - last_import) * 1000)
            got["allreduce + shutdown"].append((end - init_end) * 1000)
            got["outside the stamps"].append(((t1 - t0) - (end - first)) * 1000)
            got["whole job"].append((t1 - t0) * 1000)
            if name == "bare":
                first_rank = float(re.search(r"first rank at ([\d.]+)", r.stdout).group(1))
                ended = float(re.search(r"last rank ended at ([\d.]+)", r.stdout).group(1))
                bare_free.append((ended - first_rank) * 1000)
    print(f"real Horovod start, {a.np} ranks, {a.rounds} interleaved rounds (ms: median / min)\n")
    print("| phase | " + " | ".join(name for name, _ in runs) + " |")
    print("|---|" + "---|" * len(runs))
    for p in phases:
        cells = [f"{statistics.median(res[n][p]):.0f} / {min(res[n][p]):.0f}" for n, _ in runs]
        print(f"| {p} | " + " | ".join(cells) + " |")
    out = "outside the stamps"
    floor_out = statistics.median(res["floor"][out])
    floor_job = statistics.median(res["floor"]["whole job"])
    print(f"| whole job less the bare launcher's own start and stop | | "
          f"{statistics.median(bare_free):.0f} / {min(bare_free):.0f} |" + " |" * len(builds))
    print()
    least = statistics.median(bare_free)
    print(f"a launcher that costs nothing (the bare one from its first rank's start to its "
          f"last rank's end): "
          f"{least / floor_job:.3f}x the floor's whole job")
    for name, _ in [("bare", None)] + builds:
        job = statistics.median(res[name]["whole job"])
        print(f"{name}: whole job {job / floor_job:.3f}x the floor's; the launcher's own share "
              f"(outside the stamps, less the floor's): "
              f"{statistics.median(res[name][out]) - floor_out:+.0f} ms")


if __name__ == "__main__":
    main()
