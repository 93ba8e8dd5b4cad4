#!/usr/bin/env python3
"""Launch cost of two (or more) caf-hvd builds, interleaved round by round.

usage: bench/launch_ab.py [--rounds N] NAME=PATH/TO/caf-hvd [NAME=PATH ...]

Every round runs, one after the other: the shell floors (a shell that starts N /bin/true
and waits, N = 1, 4, 8), then for each build `caf-hvd --version` (the binary's own start)
and `caf-hvd run -np N --quiet -- /bin/true`. This machine's speed drifts by several ms
between minutes, so builds are compared within each round, not set after set
(bench/launch.py runs one build's whole table at a time). Prints median, first quartile
and minimum of the whole-process wall time in ms, and each run row's distance from the
floor of its N."""

import argparse
import statistics
import subprocess
import sys
import time

from bench_env import named_build


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("builds", nargs="+", metavar="NAME=PATH", type=named_build)
    a = ap.parse_args()
    builds = a.builds
    cmds = [(f"floor {n}", n, ["sh", "-c", " ".join(["/bin/true &"] * n) + " wait"])
            for n in (1, 4, 8)]
    for name, path in builds:
        cmds.append((f"{name} --version", None, [path, "--version"]))
        for n in (1, 4, 8):
            cmds.append((f"{name} run -np {n}", n,
                         [path, "run", "-np", str(n), "--quiet", "--", "/bin/true"]))
    samples = {name: [] for name, _, _ in cmds}
    for _ in range(a.rounds):
        for name, _, cmd in cmds:
            t0 = time.perf_counter()
            r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            samples[name].append((time.perf_counter() - t0) * 1000)
            if r.returncode != 0:
                sys.exit(f"{' '.join(cmd)} failed with {r.returncode}: "
                         f"{r.stderr.decode()[-500:]}")
    floors = {n: statistics.median(samples[f"floor {n}"]) for n in (1, 4, 8)}
    print(f"launch cost, {a.rounds} interleaved rounds (ms)\n")
    print("| what | median | first quartile | min | median - floor |")
    print("|---|---|---|---|---|")
    for name, n, _ in cmds:
        v = sorted(samples[name])
        above = "" if n is None or name.startswith("floor") else f"{statistics.median(v) - floors[n]:+.1f}"
        print(f"| {name} | {statistics.median(v):.1f} | {v[len(v) // 4]:.1f} | {v[0]:.1f} | {above} |")


if __name__ == "__main__":
    main()
