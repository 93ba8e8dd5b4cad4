#!/usr/bin/env python3
"""Elastic recovery time: from a rank's SIGKILL to the first allreduce of the next
generation, on this machine.

usage: bench/elastic.py [--runs N] [--build DIR] [--no-torch]

caf-hvd: node agents on loopback (one per host, 1 slot each, mutual TLS), a driver with a
discovery script, caf-hvd-allreduce --elastic (one allreduce per 10 ms step). The last
rank is killed once step 20 is done; the time is taken from just before the kill to the
first step that the new generation's rank 0 reports (every rank stamps wall-clock ms).
  - "spare": one more host than --max-np, so a new process on the spare host replaces
    the failed host's rank and the world size is kept (what torchrun's restart does);
  - "shrink": no spare; the survivors go on with one rank fewer.
torchrun (when python3-torch is installed): --standalone --max_restarts 1, best-case
--monitor_interval 0.1, bench/torch_elastic.py (gloo all_reduce every 10 ms); the same
kill, timed to the first all_reduce after the restart.
Prints medians and min-max (ms) as a Markdown table."""

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_env import ROOT  # noqa: E402
from harness import Cluster, pid_with_env  # noqa: E402

STEP = re.compile(r"step (\d+) size (\d+) sum \d+ t=(\d+)")
GEN = re.compile(r"generation (\d+): rank 0 of (\d+) on \S+ resumes at step \d+ t=\d+")


def read_until(p, pattern, timeout, lines):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        lines.append(line)
        m = pattern.search(line)
        if m:
            return m
    raise RuntimeError(f"no {pattern.pattern!r}:\n{''.join(lines)[-1500:]}")


def kill_after_step(p, pattern, step_group, victim_of, timeout, lines):
    """Reads until a line of `pattern` reports step 20 or later, then SIGKILLs the process
    victim_of() names; returns the kill's wall-clock time in ms."""
    while int(read_until(p, pattern, timeout, lines).group(step_group)) < 20:
        pass
    victim = victim_of()
    if victim is None:
        raise RuntimeError("the rank to kill was not found")
    t_kill = time.time() * 1000
    os.kill(victim, signal.SIGKILL)
    return t_kill


def caf_hvd_recovery(c, allreduce, script, listing, ports, n, spare):
    with open(listing, "w") as f:
        for port in ports[:n + (1 if spare else 0)]:
            f.write(f"127.0.0.1:{port}:1\n")
    p = c.start(["driver", "--host-discovery-script", script, "--min-np", "1", "--max-np",
                 str(n), "--", allreduce, "--elastic", "--steps", "1000000", "--step-ms", "10"])
    lines = []
    try:
        t_kill = kill_after_step(
            p, STEP, 1, lambda: pid_with_env(allreduce, prefix=True, HOROVOD_RANK=n - 1,
                                             HOROVOD_ELASTIC=1), 30, lines)
        g = read_until(p, GEN, 30, lines)
        if int(g.group(1)) < 2:
            raise RuntimeError("no new generation")
        size = int(g.group(2))
        m = read_until(p, STEP, 30, lines)
        return int(m.group(3)) - t_kill, size
    finally:
        p.send_signal(signal.SIGINT)
        try:
            p.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()


def torchrun_recovery(torchrun, n):
    prog = os.path.join(ROOT, "bench", "torch_elastic.py")
    cmd = [torchrun, "--standalone", "--redirects", "1", "--tee", "2", "--nproc_per_node",
           str(n), "--max_restarts", "1", "--monitor_interval", "0.1", prog]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    lines = []
    pat = re.compile(r"restart (\d+) step (\d+) t=(\d+)")
    try:
        t_kill = kill_after_step(
            p, pat, 2, lambda: pid_with_env("torch_elastic.py", RANK=n - 1,
                                            TORCHELASTIC_RESTART_COUNT=0, CAF_HVD_BENCH=1),
            120, lines)
        while True:
            m = read_until(p, pat, 120, lines)
            if int(m.group(1)) >= 1:
                return int(m.group(3)) - t_kill
    finally:
        try:
            os.killpg(p.pid, signal.SIGTERM)
            p.communicate(timeout=20)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()


def row(name, n, xs, extra=""):
    print(f"| {name} | {n} | {statistics.median(xs):.0f} | {min(xs):.0f} - {max(xs):.0f} "
          f"| {extra} |")


def recovery_table(runs, build, with_torch=True, heading="##"):
    """Runs every configuration `runs` times, alternating, and prints the table."""
    allreduce = os.path.join(build, "apps", "caf-hvd-allreduce")
    torchrun = shutil.which("torchrun")
    have_torch = with_torch and torchrun and subprocess.run(
        ["/usr/bin/python3", "-c", "import torch.distributed"], capture_output=True).returncode == 0
    os.environ["CAF_HVD_BENCH"] = "1"
    work = tempfile.mkdtemp(prefix="caf-hvd-bench-elastic-")
    c = Cluster()
    try:
        listing, script = os.path.join(work, "hosts"), os.path.join(work, "discover.sh")
        with open(script, "w") as f:
            f.write(f"#!/bin/sh\ncat {listing}\n")
        os.chmod(script, 0o700)
        ports = [c.node(f"h{i}") for i in range(5)]
        print(f"{heading} elastic recovery, {runs} runs (ms from SIGKILL to the first allreduce "
              "of the next generation: median | min - max)\n")
        print("| launcher | ranks at failure | median | min - max | new world size |")
        print("|---|---|---|---|---|")
        results = {}
        for n in (2, 4):
            res = {"spare": [], "shrink": [], "torchrun": []}
            sizes = {"spare": set(), "shrink": set()}
            for _ in range(runs):
                for mode in ("spare", "shrink"):
                    ms, size = caf_hvd_recovery(c, allreduce, script, listing, ports, n,
                                                mode == "spare")
                    res[mode].append(ms)
                    sizes[mode].add(size)
                if have_torch:
                    res["torchrun"].append(torchrun_recovery(torchrun, n))
            row("caf-hvd driver, spare host", n, res["spare"], ",".join(map(str, sizes["spare"])))
            row("caf-hvd driver, survivors only", n, res["shrink"],
                ",".join(map(str, sizes["shrink"])))
            if have_torch:
                row("torchrun --max_restarts 1 --monitor_interval 0.1", n, res["torchrun"],
                    str(n))
            sys.stdout.flush()
            results[n] = res
        if have_torch:
            print()
            for n, res in results.items():
                t = statistics.median(res["torchrun"])
                print(f"- {n} ranks: torchrun / caf-hvd = {t / statistics.median(res['spare']):.1f}x"
                      f" (spare host), {t / statistics.median(res['shrink']):.1f}x "
                      "(survivors only)")
        else:
            print("\n(torchrun skipped: python3-torch is not installed; scripts/setup-torch.sh)")
    finally:
        c.close()
        shutil.rmtree(work, True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--no-torch", action="store_true")
    a = ap.parse_args()
    recovery_table(a.runs, a.build, not a.no_torch)


if __name__ == "__main__":
    main()
