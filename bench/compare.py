#!/usr/bin/env python3
"""caf-hvd side by side with mpirun (Open MPI) and torchrun, on this machine, in one
invocation, launchers alternated run by run.

usage: bench/compare.py [--runs N] [--build DIR] [--sections 1,2,3,4,5] [--np 1,2,4,8]

1. launch overhead: /bin/true on N = 1, 2, 4, 8 ranks. torchrun runs with --no_python
   and Debian's required --redirects 1 --tee 2, once with its default monitor interval
   and once with --monitor_interval 0.1 (its best case).
2. a torch program (init_process_group("gloo") + one all_reduce, bench/torch_allreduce.py)
   under caf-hvd and torchrun's best case.
3. failure detection: rank 1 exits 3 after 1 s while the others sleep; time from that
   rank's exit to the launcher's exit, and the exit code and cause each launcher reports.
4. elastic recovery: a rank killed mid-loop, time to the next group's first allreduce,
   caf-hvd's elastic driver vs torchrun --max_restarts 1 (bench/elastic.py).
5. section 2's program with Debian 13's torch 2.6 (built without libuv) in the chroot of
   scripts/setup-torch-chroot.sh (built the first time, minutes): caf-hvd run
   --torch-store off (the guide's answer for such a torch, docs/torch.md) vs torchrun from the chroot
   (with USE_LIBUV=0), when torchrun runs there at all; else the reason it does not.

Needs openmpi-bin and python3-torch (scripts/setup-torch.sh)."""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = "/usr/bin/python3"


def timed(cmd, env=None):
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    return (time.perf_counter() - t0) * 1000, r


def alternate(configs, runs, env):
    """Runs every command of `configs` once per round, `runs` rounds; ms per name."""
    res = {k: [] for k in configs}
    for _ in range(runs):
        for k, cmd in configs.items():
            ms, r = timed(cmd, env)
            if r.returncode != 0:
                sys.exit(f"{k} failed: {r.stderr[-800:]}")
            res[k].append(ms)
    return res


def summary(xs):
    return f"{statistics.median(xs):9.1f} | {min(xs):8.1f} - {max(xs):8.1f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--sections", default="1,2,3,4,5", help="which sections to run, e.g. 2,4")
    ap.add_argument("--np", default="1,2,4,8", help="rank counts for sections 1 and 2")
    a = ap.parse_args()
    caf = os.path.join(a.build, "apps", "caf-hvd")
    mpirun, torchrun = shutil.which("mpirun"), shutil.which("torchrun")
    sections = {int(x) for x in a.sections.split(",")}
    if (sections & {1, 3} and not mpirun) or (sections & {1, 2, 3, 4} and not torchrun):
        sys.exit("needs mpirun (apt-get install openmpi-bin) and torchrun (scripts/setup-torch.sh)")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    tr = [torchrun, "--standalone", "--redirects", "1", "--tee", "2"]

    counts = [int(x) for x in a.np.split(",")]
    if 1 in sections:
        launch_overhead(a, caf, mpirun, tr, env, counts)
    if 2 in sections:
        torch_program(a, caf, tr, env, counts)
    if 3 in sections:
        failure_detection(a, caf, mpirun, tr, env)
    if 4 in sections:
        print()
        os.environ["CAF_HVD"] = caf
        sys.path.insert(0, os.path.join(ROOT, "bench"))
        import elastic  # noqa: E402  (uses CAF_HVD)
        elastic.recovery_table(a.runs, a.build, heading="## 4.")
    if 5 in sections:
        torch_26_program(a, caf, env, counts)


def launch_overhead(a, caf, mpirun, tr, env, counts):
    print(f"## 1. launch overhead, /bin/true, {a.runs} runs (ms: median | min - max)\n")
    print("| launcher | N | median | min - max | vs caf-hvd |")
    print("|---|---|---|---|---|")
    for n in counts:
        configs = {
            "caf-hvd run": [caf, "run", "-np", str(n), "--", "/bin/true"],
            "mpirun": [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(n),
                       "/bin/true"],
            "torchrun (default monitor)": tr + ["--nproc_per_node", str(n), "--no_python",
                                                "/bin/true"],
            "torchrun --monitor_interval 0.1": tr + ["--nproc_per_node", str(n),
                                                     "--monitor_interval", "0.1", "--no_python",
                                                     "/bin/true"],
        }
        res = alternate(configs, a.runs, env)
        base = statistics.median(res["caf-hvd run"])
        for k in configs:
            print(f"| {k} | {n} | {summary(res[k])} | "
                  f"{statistics.median(res[k]) / base:.1f}x |", flush=True)



def torch_program(a, caf, tr, env, counts):
    print(f"\n## 2. torch program: init_process_group(gloo) + one all_reduce, {a.runs} runs (ms)\n")
    print("| launcher | N | median | min - max | torchrun / caf-hvd |")
    print("|---|---|---|---|---|")
    prog = os.path.join(ROOT, "bench", "torch_allreduce.py")
    for n in counts:
        configs = {
            "caf-hvd run": [caf, "run", "-np", str(n), "--", PY, prog],
            "torchrun --monitor_interval 0.1": tr + ["--nproc_per_node", str(n),
                                                     "--monitor_interval", "0.1", prog],
        }
        res = alternate(configs, a.runs, env)
        ratio = statistics.median(res["torchrun --monitor_interval 0.1"]) / statistics.median(
            res["caf-hvd run"])
        for k in configs:
            print(f"| {k} | {n} | {summary(res[k])} | {ratio:.2f}x |", flush=True)



def torch_26_program(a, caf, env, counts):
    print(f"\n## 5. torch 2.6 (Debian 13, chroot): init_process_group(gloo) + one all_reduce, "
          f"{a.runs} runs (ms)\n")
    setup = subprocess.run([os.path.join(ROOT, "scripts", "setup-torch-chroot.sh")],
                           capture_output=True, text=True)
    if setup.returncode != 0:
        print(f"not measured: the chroot could not be built: {setup.stderr.strip()[-500:]}")
        return
    tree = setup.stdout.strip().splitlines()[-1]
    bench = os.path.join(ROOT, "bench")
    in_tree = [os.path.join(ROOT, "scripts", "in-torch-chroot.sh"), tree, "-b", bench, "--"]
    prog = os.path.join(bench, "torch_allreduce.py")
    tr = in_tree + ["/usr/bin/torchrun", "--standalone", "--redirects", "1", "--tee", "2",
                    "--monitor_interval", "0.1"]
    tr_env = dict(env, USE_LIBUV="0")
    probe = subprocess.run(tr + ["--nproc_per_node", "1", prog], capture_output=True,
                           text=True, env=tr_env)
    torchrun_runs = probe.returncode == 0
    print("| launcher | N | median | min - max | torchrun / caf-hvd |")
    print("|---|---|---|---|---|")
    for n in counts:
        configs = {"caf-hvd run --torch-store off": [caf, "run", "-np", str(n), "--torch-store",
                                                     "off", "--", *in_tree, "/usr/bin/python3",
                                                     prog]}
        if torchrun_runs:
            configs["torchrun --monitor_interval 0.1"] = tr + ["--nproc_per_node", str(n), prog]
        res = {k: [] for k in configs}  # alternated as in section 2, torchrun's env apart
        for _ in range(a.runs):
            for k, cmd in configs.items():
                ms, r = timed(cmd, tr_env if k.startswith("torchrun") else env)
                if r.returncode != 0:
                    sys.exit(f"{k} failed: {r.stderr[-800:]}")
                res[k].append(ms)
        base = statistics.median(res["caf-hvd run --torch-store off"])
        for k in configs:
            ratio = f"{statistics.median(res[k]) / base:.2f}x" if torchrun_runs else "-"
            print(f"| {k} | {n} | {summary(res[k])} | {ratio} |", flush=True)
    if not torchrun_runs:
        errors = [l.strip() for l in (probe.stdout + probe.stderr).splitlines() if "Error" in l]
        print(f"\ntorchrun from the chroot does not run (USE_LIBUV=0, --standalone, exit "
              f"{probe.returncode}): {errors[0] if errors else probe.stderr.strip()[-300:]}")


def failure_detection(a, caf, mpirun, tr, env):
    print(f"\n## 3. failure detection: rank 1 of 4 exits 3 after 1 s, {a.runs} runs\n")
    script = ('r=${RANK:-${OMPI_COMM_WORLD_RANK:-0}}; if [ "$r" = 1 ]; then sleep 1; '
              'echo "STAMP=$(date +%s.%N)" >&2; exit 3; fi; exec sleep 30')
    configs = {
        "caf-hvd run": [caf, "run", "-np", "4", "--", "sh", "-c", script],
        "mpirun": [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "4", "sh", "-c",
                   script],
        "torchrun --monitor_interval 0.1": tr + ["--nproc_per_node", "4", "--monitor_interval",
                                                 "0.1", "--no_python", "sh", "-c", script],
    }
    res = {k: [] for k in configs}
    codes, causes = {}, {}
    for _ in range(a.runs):
        for k, cmd in configs.items():
            _, r = timed(cmd, env)
            done = time.time()
            stamp = re.search(r"STAMP=([\d.]+)", r.stderr)
            if not stamp:
                sys.exit(f"{k}: no stamp in {r.stderr[-500:]}")
            res[k].append((done - float(stamp.group(1))) * 1000)
            codes.setdefault(k, set()).add(r.returncode)
            lines = [l for l in r.stderr.splitlines() if l.strip() and "STAMP" not in l]
            cause = next((l for l in lines if re.search(r"fail|exit", l, re.I)),
                         lines[-1] if lines else "")
            causes[k] = cause.strip()[:160]
    print("| launcher | detection to exit (ms) median | min - max | exit code | reported cause |")
    print("|---|---|---|---|---|")
    for k in configs:
        xs = res[k]
        print(f"| {k} | {statistics.median(xs):.1f} | {min(xs):.1f} - {max(xs):.1f} | "
              f"{sorted(codes[k])} | `{causes[k]}` |", flush=True)


if __name__ == "__main__":
    main()
