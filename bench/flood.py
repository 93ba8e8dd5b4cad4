#!/usr/bin/env python3
"""A node agent under a connection flood: N clients connect to its TLS port and send
nothing (a port scan, a misbehaving client). How fast does the agent take them in, what
does it cost the agent, and how long until a driver gets a job through it?

usage: bench/flood.py [--connections 600] [--runs 3] [--build DIR]

Per run: the seconds until the agent holds every flood connection (its descriptor count,
sampled every 10 ms), the agent's CPU seconds during the first 5 s (the idle connections'
handshake deadline), and the wall time of `caf-hvd driver -np 1 ... -- true` started
right after the flood, with how many handshake attempts it needed. Prints a Markdown row
per run and the medians."""

import argparse
import os
import re
import socket
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_env  # noqa: E402,F401
from harness import Cluster  # noqa: E402


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def descriptors(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def one_run(n):
    c = Cluster()
    socks = []
    try:
        port = c.node("flooded")
        pid = c.nodes["flooded"][0].pid
        base = descriptors(pid)
        cpu0 = cpu_seconds(pid)
        t0 = time.monotonic()
        socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
        p = c.start(["driver", "-np", "1", "-H", c.spec("flooded", 1), "--verbose",
                     "--start-timeout", "60", "--", "true"])
        accepted = through = None
        while time.monotonic() - t0 < 5:
            if accepted is None and descriptors(pid) - base >= n:
                accepted = time.monotonic() - t0
            if through is None and p.poll() is not None:
                through = time.monotonic() - t0
            time.sleep(0.01)
        cpu = cpu_seconds(pid) - cpu0
        _, err = p.communicate(timeout=120)
        through = through or time.monotonic() - t0
        if p.returncode != 0:
            raise SystemExit(f"the driver failed (exit {p.returncode}):\n{err}")
        attempts = 1 + len(re.findall(r"handshake with .* timed out; trying again", err))
        return accepted, cpu, through, attempts
    finally:
        for s in socks:
            s.close()
        c.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--connections", type=int, default=600)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--build", help="build directory (default: build/)")
    a = ap.parse_args()
    print(f"| run | all {a.connections} taken in, s | agent CPU in the first 5 s, s | "
          "driver's job done after, s | handshake attempts |")
    print("|---|---|---|---|---|")
    rows = []
    for i in range(a.runs):
        accepted, cpu, through, attempts = one_run(a.connections)
        rows.append((accepted, cpu, through, attempts))
        shown = "not within 5 s" if accepted is None else f"{accepted:.2f}"
        print(f"| {i + 1} | {shown} | {cpu:.2f} | {through:.2f} | {attempts} |", flush=True)
    taken = [r[0] for r in rows if r[0] is not None]
    print(f"| median | {statistics.median(taken):.2f} ({len(taken)} of {len(rows)} runs) "
          if taken else "| median | not within 5 s ", end="")
    print(f"| {statistics.median(r[1] for r in rows):.2f} | "
          f"{statistics.median(r[2] for r in rows):.2f} | "
          f"{statistics.median(r[3] for r in rows)} |")


if __name__ == "__main__":
    main()
