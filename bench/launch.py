#!/usr/bin/env python3
"""Launch latency and failure detection of caf-hvd, side by side with mpirun.

usage: bench/launch.py [--runs N] [--caf-hvd PATH] [--no-mpirun] [--import-floor]

Prints one table row per configuration: median and min-max wall time of whole jobs
running /bin/true (N = 1, 2, 4, 8), for the floor (a shell that starts N /bin/true and
waits), `caf-hvd --version` (the binary's own start), `caf-hvd run`, `caf-hvd driver`
with two local node agents, and Open MPI's mpirun when it is installed (apt-get install
openmpi-bin); each launcher's row says how far it is above the floor of its run.
--import-floor adds a real Horovod start at 4 ranks (import torch and horovod.torch,
hvd.init(), one allreduce, hvd.shutdown()) under caf-hvd run and its floor: four
parallel processes that only import torch and horovod.torch (scripts/setup-horovod.sh
gives the build).
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


def row(name, n, samples, floor=None):
    med = statistics.median(samples)
    above = ("         |        |" if floor is None
             else f" {med - floor:+7.1f} | {med / floor:5.2f}x |")
    print(f"| {name:<34} | {n:>2} | {med:8.1f} | "
          f"{min(samples):7.1f} - {max(samples):7.1f} |{above}", flush=True)


def shell_floor(n):
    """A shell that starts n /bin/true at once and waits: what any launcher must cost."""
    return ["sh", "-c", " ".join(["/bin/true &"] * n) + " wait"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--caf-hvd", default=os.path.join(ROOT, "build", "apps", "caf-hvd"))
    ap.add_argument("--no-mpirun", action="store_true")
    ap.add_argument("--import-floor", action="store_true")
    a = ap.parse_args()
    caf = a.caf_hvd
    mpirun = None if a.no_mpirun else shutil.which("mpirun")

    # Node agents and drivers use mutual TLS, as users run them by default.
    cluster = tempfile.mkdtemp(prefix="caf-hvd-bench-")
    subprocess.run([caf, "cluster", "init", os.path.join(cluster, "c")], check=True,
                   stdout=subprocess.DEVNULL)
    os.environ["CAF_HVD_CLUSTER_DIR"] = os.path.join(cluster, "c")
    os.environ.setdefault("CAF_HVD_RANK_USER", "agent")  # throw-away certificates, as the tests
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
        print("| launcher                           |  N |   median |     min - max   "
              "| - floor |  ratio |")
        print("|------------------------------------|----|----------|-----------------"
              "|---------|--------|")
        for n in (1, 2, 4, 8):
            half = (n + 1) // 2
            spec = f"127.0.0.1:{ports[0]}:{half},127.0.0.1:{ports[1]}:{half}"
            configs = [
                ("floor: sh, N x /bin/true", shell_floor(n)),
                ("caf-hvd --version", [caf, "--version"]),
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
            floor = statistics.median(results["floor: sh, N x /bin/true"])
            for name, _ in configs:
                row(name, n, results[name], None if name.startswith("floor") else floor)
        if a.import_floor:
            import_floor(caf, a.runs)

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


def import_floor(caf, runs):
    """Real Horovod at 4 ranks under caf-hvd run against four parallel imports."""
    site = subprocess.run([os.path.join(ROOT, "scripts", "setup-horovod.sh")],
                          capture_output=True, text=True)
    if site.returncode != 0:
        sys.exit(f"setup-horovod.sh failed: {site.stderr[-1000:]}")
    env = dict(os.environ, PYTHONPATH=site.stdout.strip().splitlines()[-1])
    imports = "import torch, horovod.torch"
    program = (imports + " as hvd; hvd.init(); hvd.allreduce(torch.ones(1), name='x'); "
               "hvd.shutdown()")
    py = "/usr/bin/python3"
    configs = [("floor: 4 parallel imports", ["sh", "-c", " ".join(
                   [f"{py} -c '{imports}' &"] * 4) + " wait"]),
               ("caf-hvd run, hvd.init + allreduce", [caf, "run", "-np", "4", "--quiet", "--",
                                                      py, "-c", program])]
    results = {name: [] for name, _ in configs}
    for _ in range(runs):
        for name, cmd in configs:
            t0 = time.perf_counter()
            r = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            results[name].append((time.perf_counter() - t0) * 1000)
            if r.returncode != 0:
                sys.exit(f"{name} failed with {r.returncode}: {r.stderr.decode()[-800:]}")
    print(f"\nreal Horovod start, 4 ranks, {runs} runs each (ms)\n")
    floor = statistics.median(results[configs[0][0]])
    for name, _ in configs:
        row(name, 4, results[name], None if name.startswith("floor") else floor)


if __name__ == "__main__":
    main()
