#!/usr/bin/env python3
"""Gloo under caf-hvd: connectFullMesh time through the rendezvous server against
Gloo's FileStore, and allreduce bandwidth next to loopback TCP throughput (iperf3).

usage: bench/collectives.py [--runs N] [--build DIR]"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def job(build, np, args):
    cmd = [os.path.join(build, "apps", "caf-hvd"), "run", "-np", str(np), "--",
           os.path.join(build, "apps", "caf-hvd-allreduce")] + args
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-2000:]}")
    return [json.loads(l.split(":", 1)[1]) for l in r.stdout.splitlines()
            if l.startswith("[0]<stdout>:{")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    a = ap.parse_args()

    print(f"connectFullMesh of the global context, slowest rank, ranks released together; "
          f"median [min-max] of {a.runs} runs (ms)\n")
    print("| ranks | rendezvous server (HTTP, long-poll) | Gloo FileStore |")
    print("|-------|-------------------------------------|----------------|")
    for np in (2, 4, 8):
        res = {"http": [], "file": []}
        for _ in range(a.runs):
            for store in ("http", "file"):  # alternate run by run
                start = int(time.time() * 1000) + 400
                args = ["--connect-bench", "--start-at", str(start)]
                with tempfile.TemporaryDirectory() as d:
                    if store == "file":
                        args += ["--file-store", d]
                    res[store].append(job(a.build, np, args)[0]["connect_ms"])
        cell = lambda xs: f"{statistics.median(xs):.1f} [{min(xs):.1f}-{max(xs):.1f}]"
        print(f"| {np:>5} | {cell(res['http']):>35} | {cell(res['file']):>14} |", flush=True)

    print("\nallreduce (ring, float32), median iteration of rank 0; busbw = algbw*2(n-1)/n\n")
    print("| ranks | size | latency (us) | algbw (GB/s) | busbw (GB/s) |")
    print("|-------|------|--------------|--------------|--------------|")
    for np in (2, 4):
        for size, iters in (("1M", 50), ("16M", 10), ("64M", 5)):
            rows = job(a.build, np, ["--bench", "--sizes", size, "--iters", str(iters)])
            r = rows[0]
            print(f"| {np:>5} | {size:>4} | {r['latency_us']:>12.0f} | {r['algbw_gbps']:>12.3f} | "
                  f"{r['busbw_gbps']:>12.3f} |", flush=True)

    if shutil.which("iperf3"):
        srv = subprocess.Popen(["iperf3", "-s", "-1", "-B", "127.0.0.1", "-p", "5301"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        out = subprocess.run(["iperf3", "-c", "127.0.0.1", "-p", "5301", "-t", "3", "-f", "g"],
                             capture_output=True, text=True).stdout
        srv.wait(timeout=10)
        m = re.findall(r"([\d.]+) Gbits/sec.*receiver", out)
        if m:
            print(f"\nloopback TCP reference (iperf3 -c 127.0.0.1 -t 3, one stream): "
                  f"{float(m[-1]) / 8:.2f} GB/s")
    else:
        print("\n(iperf3 not installed: apt-get install iperf3 for the loopback reference)")


if __name__ == "__main__":
    main()
