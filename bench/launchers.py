#!/usr/bin/env python3
"""Time from `caf-hvd driver` to the first rank running: over agents already running
versus `--launcher ssh` (Debian's sshd in network-namespace hosts, agents started per
job), 3 hosts x 1 slot, median of --runs. Needs root (ip netns) and openssh-server
(scripts/setup-launchers.sh ssh).

usage: bench/launchers.py [--runs 10] [--build DIR]"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_env  # noqa: E402,F401
import harness  # noqa: E402,F401  (sets up the cluster credentials)
import netns  # noqa: E402

CAF_HVD = os.path.abspath(os.environ["CAF_HVD"])
SHOW = ["sh", "-c", "echo T $(date +%s%N)"]


def first_rank_ms(h, args):
    t0 = time.time_ns()
    rc, out, err = h.run(0, [CAF_HVD, "driver", "--quiet", *args, "--", *SHOW])
    total = (time.time_ns() - t0) / 1e6
    if rc != 0:
        raise RuntimeError(err)
    starts = [int(l.split("T ")[1]) for l in out.splitlines() if "T " in l]
    return (min(starts) - t0) / 1e6, total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--build", default=None)
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="caf-hvd-bench-ssh-")
    h = netns.Hosts(3)
    try:
        os.makedirs("/run/sshd", exist_ok=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", f"{d}/id"],
                       check=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", f"{d}/host_key"],
                       check=True)
        shutil.copy(f"{d}/id.pub", f"{d}/authorized_keys")
        for i, host in enumerate(h.hosts):
            conf = f"{d}/sshd_{i}.conf"
            with open(conf, "w") as f:
                f.write(f"ListenAddress {host['good_addr']}\nHostKey {d}/host_key\n"
                        "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                        f"UsePAM no\nAuthorizedKeysFile {d}/authorized_keys\nStrictModes no\n"
                        "PidFile none\n")
            p = subprocess.Popen(["ip", "netns", "exec", host["ns"], "/usr/sbin/sshd", "-D", "-e",
                                  "-f", conf], stderr=subprocess.DEVNULL, start_new_session=True)
            h.procs.append(p)
        time.sleep(0.5)
        spec = ",".join(f"{x['good_addr']}:1" for x in h.hosts)
        ssh = ["--launcher", "ssh", "-i", f"{d}/id", "--ssh-option",
               f"UserKnownHostsFile={d}/known_hosts", "-np", "3", "-H", spec]
        first_rank_ms(h, ssh)  # known_hosts filled, caches warm
        with_ssh = [first_rank_ms(h, ssh) for _ in range(a.runs)]
        bare = []
        for _ in range(a.runs):  # one bare session, for scale: ssh itself
            t0 = time.perf_counter()
            h.run(0, ["ssh", "-o", "BatchMode=yes", "-i", f"{d}/id", "-o",
                      f"UserKnownHostsFile={d}/known_hosts", h.hosts[1]["good_addr"], "true"])
            bare.append((time.perf_counter() - t0) * 1000)
        for i in range(3):
            h.start_node(i, CAF_HVD, extra=["--bind", h.hosts[i]["good_addr"]])
        running = ["-np", "3", "-H", ",".join(f"{x['good_addr']}:24780:1" for x in h.hosts)]
        first_rank_ms(h, running)
        with_agents = [first_rank_ms(h, running) for _ in range(a.runs)]
        print("| 3 hosts x 1 slot | first rank running, ms (median, min-max) | whole job `true`, ms |")
        print("|---|---|---|")
        for name, xs in (("agents already running", with_agents),
                         ("`--launcher ssh` (agents started per job)", with_ssh)):
            firsts = [x[0] for x in xs]
            print(f"| {name} | {statistics.median(firsts):.0f} ({min(firsts):.0f}-"
                  f"{max(firsts):.0f}) | {statistics.median(x[1] for x in xs):.0f} |")
        print(f"| (one bare `ssh host true`, for scale) | - | {statistics.median(bare):.0f} |")
    finally:
        h.close()
        shutil.rmtree(d, True)


if __name__ == "__main__":
    main()
