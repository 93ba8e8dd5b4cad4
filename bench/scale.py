#!/usr/bin/env python3
"""Control-plane scale: K local node agents (mutual TLS, loopback, 8 slots each) and a
driver job of K x 8 ranks of /bin/true, next to `caf-hvd run -np K*8` (the process-start
floor on this machine, no agents) and, when installed, `mpirun -np K*8 --oversubscribe
/bin/true`.

usage: bench/scale.py [--agents 8,32,64,128] [--slots 8] [--runs 3] [--insecure] [--build DIR]

Per size: the median total wall time of the job, the phases from the driver's closing
summary (connect, nic, launch, run, in ms), the driver's peak RSS and one agent's, and
whether every run succeeded. Prints a Markdown table."""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_env  # noqa: E402,F401
from harness import CAF_HVD, Cluster  # noqa: E402

PHASES = re.compile(r"time\s+[\d.]+ ms \((.*) ms\)")


def timed_run(args):
    """Runs a command; returns (seconds, exit code, stderr, peak RSS in MiB)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err = p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return time.perf_counter() - t0, p.returncode, err, usage.ru_maxrss / 1024


def phases(err):
    m = PHASES.search(err)
    out = {}
    if m:
        for part in m.group(1).split(","):
            name, _, ms = part.strip().rpartition(" ")
            out[name] = float(ms)
    return out


def vm_hwm_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", default="8,32,64,128")
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--insecure", action="store_true", help="agents and driver without TLS")
    ap.add_argument("--build", default=None)
    a = ap.parse_args()
    mpirun = shutil.which("mpirun")
    print("| agents x slots | ranks | driver job s (median) | ok | connect | nic | launch | run "
          "(ms, median) | driver RSS MiB | agent RSS MiB | `caf-hvd run -np` s | mpirun s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for k in (int(x) for x in a.agents.split(",")):
        ranks = k * a.slots
        c = Cluster()
        try:
            for i in range(k):
                c.node(f"s{i}", slots=a.slots, extra=["--insecure"] if a.insecure else [])
            hosts = ",".join(c.spec(f"s{i}", a.slots) for i in range(k))
            totals, oks, ph, rss = [], 0, {}, []
            for _ in range(a.runs):
                secs, code, err, peak = timed_run(
                    [CAF_HVD, "driver", "-H", hosts, "-np", str(ranks), "--start-timeout", "120"]
                    + (["--insecure"] if a.insecure else []) + ["--", "/bin/true"])
                totals.append(secs)
                rss.append(peak)
                if code == 0:
                    oks += 1
                else:
                    sys.stderr.write(f"{k} agents: exit {code}: {err[-400:]}\n")
                for name, ms in phases(err).items():
                    ph.setdefault(name, []).append(ms)
            agent_rss = vm_hwm_mib(c.nodes["s0"][0].pid)
        finally:
            c.close()
        local = [timed_run([CAF_HVD, "run", "-np", str(ranks), "--quiet", "--", "/bin/true"])[0]
                 for _ in range(a.runs)]
        mpi = "-"
        if mpirun:
            mpi = f"{statistics.median(timed_run([mpirun, '-np', str(ranks), '--oversubscribe', '/bin/true'])[0] for _ in range(a.runs)):.2f}"
        med = {n: statistics.median(v) for n, v in ph.items()}
        print(f"| {k} x {a.slots} | {ranks} | {statistics.median(totals):.2f} | {oks}/{a.runs} | "
              f"{med.get('connect', 0):.0f} | {med.get('nic', 0):.0f} | {med.get('launch', 0):.0f} | "
              f"{med.get('run', 0):.0f} | {max(rss):.0f} | {agent_rss:.0f} | "
              f"{statistics.median(local):.2f} | {mpi} |", flush=True)


if __name__ == "__main__":
    main()
