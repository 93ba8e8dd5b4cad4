#!/usr/bin/env python3
"""The cluster's membership at scale: K node agents on loopback (one process each, mutual
TLS, --slots S) join one that holds the table; then

- `caf-hvd status`: wall time from its process start to its last line of output (the
  node table of K rows), median of R runs;
- a placement of K*S ranks (`caf-hvd driver --cluster ... -np K*S --verbose`): the time
  from the driver's request to the table's answer (decided, and the slots held for the
  job), as the driver reports it, median of R runs (each job is stopped right after its
  placement: its ranks are not the point);
- how long the K agents took to be alive in the table, started in waves of W (each wave
  once the previous one is in the table).

usage: bench/cluster.py [--agents 256] [--slots 4] [--runs 5] [--wave 16] [--build DIR]"""

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_env  # noqa: E402,F401
from harness import CAF_HVD, free_port  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", type=int, default=256)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--wave", type=int, default=16, help="agents started at once")
    ap.add_argument("--build")
    a = ap.parse_args()
    exe = os.path.join(a.build, "apps", "caf-hvd") if a.build else CAF_HVD
    env = dict(os.environ)
    procs = []
    try:
        head = free_port()
        procs.append(subprocess.Popen([exe, "node", "--name", "n0", "--port", str(head),
                                       "--slots", str(a.slots)], stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, text=True, env=env))
        procs[0].stdout.readline()
        cluster = f"127.0.0.1:{head}"

        def wait_alive(n):
            deadline = time.monotonic() + 300
            while True:
                r = subprocess.run([exe, "status", "--cluster", cluster], capture_output=True,
                                   text=True, env=env)
                if f" {n} nodes alive" in r.stdout:
                    return
                if time.monotonic() > deadline:
                    raise SystemExit(f"not all {n} agents joined within 300 s: "
                                     f"{r.stdout.splitlines()[0] if r.stdout else r.stderr}")
                time.sleep(0.1)
        # In waves: K agent processes starting at once on a 2-core machine starve the
        # holder's handshakes (each start costs about 50 ms of CPU; real agents are on
        # machines of their own).
        t0 = time.perf_counter()
        for first in range(1, a.agents, a.wave):
            for i in range(first, min(a.agents, first + a.wave)):
                procs.append(subprocess.Popen(
                    [exe, "node", "--name", f"n{i}", "--port", "0", "--slots", str(a.slots),
                     "--join", f"127.0.0.1:{head}"], stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL, env=env))
            wait_alive(min(a.agents, first + a.wave))
        started = time.perf_counter() - t0
        all_in = started
        status_ms = []
        for _ in range(a.runs):
            t = time.perf_counter()
            r = subprocess.run([exe, "status", "--cluster", cluster], capture_output=True,
                               text=True, env=env)
            status_ms.append((time.perf_counter() - t) * 1000)
            assert r.returncode == 0 and len(r.stdout.splitlines()) >= a.agents + 2, r.stderr
        place_ms = []
        np = a.agents * a.slots
        for _ in range(a.runs):
            p = subprocess.Popen([exe, "driver", "--cluster", cluster, "-np", str(np),
                                  "--verbose", "--", "true"], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True, env=env)
            for line in p.stderr:
                m = re.search(r"the table answered in ([\d.]+) ms", line)
                if m:
                    place_ms.append(float(m.group(1)))
                    break
                if "error" in line:
                    raise SystemExit(line)
            p.send_signal(signal.SIGINT)
            p.wait()
            # the table lets the job's hold go when the driver is gone
            time.sleep(0.5)
        print(f"| agents | slots | all joined (waves of {a.wave}) | "
              f"status (median of {a.runs}) | {np}-rank placement (median of {a.runs}) |")
        print("|---|---|---|---|---|")
        print(f"| {a.agents} | {np} | {all_in:.1f} s | "
              f"{statistics.median(status_ms):.1f} ms (min {min(status_ms):.1f}) | "
              f"{statistics.median(place_ms):.1f} ms (min {min(place_ms):.1f}) |")
    finally:
        for p in procs:
            p.send_signal(signal.SIGKILL)
        for p in procs:
            p.wait()


if __name__ == "__main__":
    main()
