#!/usr/bin/env python3
"""Rendezvous server throughput: caf-hvd's server against a faithful minimal equivalent
of Horovod's Python server, side by side, with wrk on loopback.

usage: bench/rendezvous.py [--seconds S] [--build DIR]

For each server, PUT and GET (of an existing 136-byte value, the size of one Gloo
address) at 1, 16 and 64 concurrent connections: requests per second and p99 latency.
"close" opens a new connection per request, as Horovod's HTTP clients do; "keep-alive"
reuses connections (our own store client does)."""

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd):
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, start_new_session=True)
    line = p.stdout.readline()
    if "listening" not in line:
        sys.exit(f"{cmd[0]} did not start: {line!r}")
    return p


def wrk(port, method, conns, seconds, close, script_dir):
    lua = os.path.join(script_dir, f"{method}-{close}.lua")
    with open(lua, "w") as f:
        if method == "PUT":
            f.write('wrk.method = "PUT"\nwrk.body = string.rep("x", 136)\n')
        if close:
            f.write('wrk.headers["Connection"] = "close"\n')
    path = "/bench/key" if method == "PUT" else "/bench/existing"
    cmd = ["wrk", "-t", str(min(2, conns)), "-c", str(conns), "-d", f"{seconds}s", "--latency",
           "-s", lua, f"http://127.0.0.1:{port}{path}"]
    out = subprocess.run(cmd, capture_output=True, text=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    p99 = re.search(r"99%\s+([\d.]+)(us|ms|s)", out)
    scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}[p99.group(2)]
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    err = sum(int(x) for x in errors.groups()) if errors else 0
    return rps, float(p99.group(1)) * scale, err, int(non2xx.group(1)) if non2xx else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    a = ap.parse_args()
    if not shutil.which("wrk"):
        sys.exit("wrk is not installed (apt-get install wrk)")
    server = os.path.join(a.build, "bench", "rendezvous-server")
    # each command for a port taken just before its server starts (wrk's many
    # connections may take a port picked earlier)
    servers = [
        ("caf-hvd (Beast, 1 thread)", lambda port: [server, str(port)]),
        # a job's allowlist: every connection's owner is looked up, as in jobs
        ("caf-hvd, owner lookup", lambda port: [server, str(port), "1", "--allowlist"]),
        ("Horovod-like Python",
         lambda port: [sys.executable, os.path.join(ROOT, "bench", "horovod_like_server.py"),
                       str(port)]),
    ]
    results = {}
    with tempfile.TemporaryDirectory() as d:
        for name, cmd in servers:
            port = free_port()
            p = start(cmd(port))
            try:
                req = urllib.request.Request(f"http://127.0.0.1:{port}/bench/existing",
                                             data=b"x" * 136, method="PUT")
                urllib.request.urlopen(req).read()
                modes = [True, False] if name.startswith("caf-hvd (") else [True]
                for close in modes:
                    for method in ("PUT", "GET"):
                        for conns in (1, 16, 64):
                            r = wrk(port, method, conns, a.seconds, close, d)
                            results[(name, close, method, conns)] = r
                            print(f"| {name:<26} | {'close' if close else 'keep-alive':<10} | "
                                  f"{method:<3} | {conns:>3} | {r[0]:>10.0f} | {r[1]:>9.2f} | "
                                  f"{r[2]:>6} | {r[3]:>6} |", flush=True)
            finally:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait()
    print()
    for method in ("PUT", "GET"):
        for conns in (1, 16, 64):
            ours = results[(servers[0][0], True, method, conns)][0]
            theirs = results[(servers[2][0], True, method, conns)][0]
            checked = results[(servers[1][0], True, method, conns)][0]
            print(f"{method} c={conns}: caf-hvd/Python = {ours / theirs:.1f}x (connection per "
                  f"request); keep-alive: "
                  f"{results[(servers[0][0], False, method, conns)][0] / theirs:.1f}x; "
                  f"owner lookup costs {100 * (1 - checked / ours):.0f}% of close")


if __name__ == "__main__":
    print("| server                     | connection | op  |   c |      req/s |  p99 (ms) | sockerr | non-2xx |")
    print("|----------------------------|------------|-----|-----|------------|-----------|--------|--------|")
    main()
