#!/usr/bin/env python3
"""Launch latency and failure detection of caf-hvd, side by side with mpirun.

usage: bench/launch.py [--runs N] [--caf-hvd PATH] [--no-mpirun]

Prints one table row per configuration: median and min-max wall time of whole jobs
running /bin/true (N = 1, 2, 4, 8), for `caf-hvd run`, `caf-hvd driver` with two local
node agents, and Open MPI's mpirun when it is installed (apt-get install openmpi-bin).
Then the failure-detection latency: from a rank's exit (its own timestamp, printed just
before it exits 3) to the moment the driver has exited."""

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed(cmd, runs):
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        samples.append((time.perf_counter() - t0) * 1000)
        if r.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed with {r.returncode}: {r.stderr.decode()[-500:]}")
    return samples


def row(name, n, samples):
    print(f"| {name:<34} | {n:>2} | {statistics.median(samples):8.1f} | "
          f"{min(samples):7.1f} - {max(samples):7.1f} |", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--caf-hvd", default=os.path.join(ROOT, "build", "apps", "caf-hvd"))
    ap.add_argument("--no-mpirun", action="store_true")
    a = ap.parse_args()
    caf = a.caf_hvd
    mpirun = None if a.no_mpirun else shutil.which("mpirun")

    # Node agents and drivers use mutual TLS, as users run them by default.
    cluster = tempfile.mkdtemp(prefix="caf-hvd-bench-")
    subprocess.run([caf, "cluster", "init", os.path.join(cluster, "c")], check=True,
                   stdout=subprocess.DEVNULL)
    os.environ["CAF_HVD_CLUSTER_DIR"] = os.path.join(cluster, "c")
    nodes = []
    ports = []
    try:
        for name in ("benchA", "benchB"):
            port = free_port()
            p = subprocess.Popen([caf, "node", "--port", str(port), "--name", name, "--bind",
                                  "127.0.0.1"], stdout=subprocess.PIPE, text=True,
                                 start_new_session=True)
            p.stdout.readline()
            nodes.append(p)
            ports.append(port)

        print(f"launch latency, /bin/true, {a.runs} runs each (ms)\n")
        print("| launcher                           |  N |   median |     min - max   |")
        print("|------------------------------------|----|----------|-----------------|")
        for n in (1, 2, 4, 8):
            half = (n + 1) // 2
            spec = f"127.0.0.1:{ports[0]}:{half},127.0.0.1:{ports[1]}:{half}"
            configs = [
                ("caf-hvd run", [caf, "run", "-np", str(n), "--", "/bin/true"]),
                ("caf-hvd driver, 2 node agents", [caf, "driver", "-np", str(n), "-H", spec,
                                                   "--", "/bin/true"]),
            ]
            if mpirun:
                configs.append(("mpirun (Open MPI)", [mpirun, "--allow-run-as-root",
                                                      "--oversubscribe", "-np", str(n),
                                                      "/bin/true"]))
            # Alternate launchers run by run so that machine noise hits all alike.
            results = {name: [] for name, _ in configs}
            for _ in range(a.runs):
                for name, cmd in configs:
                    results[name] += timed(cmd, 1)
            for name, _ in configs:
                row(name, n, results[name])

        print(f"\nfailure detection: rank 1 of 4 exits 3 after 0.3 s, others sleep; "
              f"{a.runs} runs (ms from the rank's exit to the driver's exit)\n")
        script = ('if [ "$HOROVOD_RANK" = 1 ]; then sleep 0.3; date +%s.%N; exit 3; fi; '
                  "exec sleep 30")
        spec = f"127.0.0.1:{ports[0]}:2,127.0.0.1:{ports[1]}:2"
        for name, cmd in (("caf-hvd run", [caf, "run", "-np", "4", "--", "sh", "-c", script]),
                          ("caf-hvd driver, 2 node agents",
                           [caf, "driver", "-np", "4", "-H", spec, "--", "sh", "-c", script])):
            lat = []
            for _ in range(a.runs):
                r = subprocess.run(cmd, capture_output=True, text=True)
                done = time.time()
                if r.returncode != 3:
                    sys.exit(f"expected exit code 3, got {r.returncode}: {r.stderr}")
                stamp = float(r.stdout.strip().split(":", 1)[1])
                lat.append((done - stamp) * 1000)
            print(f"{name}: median {statistics.median(lat):.1f} ms, "
                  f"min-max {min(lat):.1f} - {max(lat):.1f} ms")
    finally:
        for p in nodes:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        shutil.rmtree(cluster, ignore_errors=True)


if __name__ == "__main__":
    main()
