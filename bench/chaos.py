#!/usr/bin/env python3
"""Chaos soak: elastic jobs of `caf-hvd-allreduce --elastic` on network-namespace hosts
(tests/cluster/netns.py), each with random faults at random times, each judged.

usage: bench/chaos.py [--jobs N] [--hosts H] [--steps S] [--seed X] [--build DIR]
                      [--fault-seconds T] [--hang-seconds B] [--log FILE]

Faults (per job, one every 0.3-1.2 s during the first T seconds): SIGKILL or SIGSTOP
(SIGCONT 0.5-3 s later) of a rank; SIGKILL of a node agent (restarted under the same name
1-3 s later) or SIGSTOP of one (SIGCONT 1-4 s later); a host added to or removed from the
discovery output; a degraded link for 1-4 s (this kernel has no netem: a token bucket of
200 kbit/s with a 2 KiB queue, so the link delays and drops); a host's link cut for 1-4 s.
Node agents, driver and ranks use mutual TLS (the test harness's cluster).

Each job is judged:
  hang    no end within --hang-seconds;
  lost    exit 0, yet a generation resumed below the last step committed before it
          (the training state went back);
  wrong   exit 0 without "elastic run done: S steps, checksum S(S+1)/2", or any rank
          reporting a wrong sum or checksum;
  orphan  a process of the job (a rank, caf-hvd-exec, a driver) left on any host 5 s
          after the driver's end;
  failed  a non-zero exit with one of the job's explained endings (every host of the
          previous generation gone, every host blacklisted, the elastic timeout, the
          reset limit); "failed, host lost at the end" when the training finished but a
          host of the final generation was lost before its rank's exit was seen;
          "failed, unexplained" otherwise (counted, printed).
  ok      exit 0 and none of the above.
Prints one line per job, then a summary; exits 1 if any job hung, lost state, computed a
wrong result or left an orphan."""

import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_env import BUILD, cmdline, end_collected, report_job, start_collected  # noqa: E402
ALLREDUCE = os.environ.get("CAF_HVD_ALLREDUCE",
                           os.path.join(BUILD, "apps", "caf-hvd-allreduce"))
import netns  # noqa: E402
from harness import CAF_HVD  # noqa: E402

PORT = 24780
EXPLAINED = [r"no host of generation \d+ is left to carry the job's state",
             r"every host is blacklisted", r"elastic timeout \(.*\) expired",
             r"reaches the reset limit", r"start timeout \(.*\) expired"]


class Soak:
    def __init__(self, args):
        self.a = args
        self.rng = random.Random(args.seed)
        self.hosts = netns.Hosts(args.hosts)
        # The driver runs on the bridge itself, so no host fault cuts it off.
        self.bridge_ns = self.hosts.namespaces[0]
        netns.sh("ip", "-n", self.bridge_ns, "addr", "add", "10.213.0.254/24", "dev", "br0")
        self.agents = [None] * args.hosts
        for i in range(args.hosts):
            self.start_agent(i)
        self.work = tempfile.mkdtemp(prefix="caf-hvd-chaos-")
        self.listing = os.path.join(self.work, "hosts")
        self.script = os.path.join(self.work, "discover.sh")
        with open(self.script, "w") as f:
            f.write(f"#!/bin/sh\ncat {self.listing}\n")
        os.chmod(self.script, 0o700)
        self.timers = []
        self.lock = threading.Lock()
        self.restart_lock = threading.Lock()
        self.down = set()

    # -- hosts ----------------------------------------------------------------------------

    def start_agent(self, i):
        for attempt in range(20):  # the port may still be held by the killed agent's socket
            try:
                self.agents[i] = self.hosts.start_node(i, CAF_HVD, PORT)
                return
            except RuntimeError:
                time.sleep(0.25)
        raise RuntimeError(f"node agent on host {i} did not restart")

    def ns_pids(self, i):
        out = netns.sh("ip", "netns", "pids", self.hosts.hosts[i]["ns"], check=False).stdout
        return [int(p) for p in out.split()]

    def rank_pids(self, i):
        return [p for p in self.ns_pids(i) if cmdline(p).startswith(ALLREDUCE)]

    def publish(self, members):
        with open(self.listing + ".tmp", "w") as f:
            for i in sorted(members):
                f.write(f"{self.hosts.hosts[i]['good_addr']}:{PORT}:{self.slots[i]}\n")
        os.replace(self.listing + ".tmp", self.listing)

    def later(self, seconds, fn):
        t = threading.Timer(seconds, fn)
        t.daemon = True
        with self.lock:
            self.timers.append((t, fn))
        t.start()

    # -- faults ---------------------------------------------------------------------------

    def fault(self):
        r = self.rng
        i = r.randrange(self.a.hosts)
        h = self.hosts.hosts[i]
        kind = r.choice(["rank_kill", "rank_stop", "agent_kill", "agent_stop", "host_add",
                         "host_remove", "slow_link", "link_cut"])
        if kind in ("rank_kill", "rank_stop"):
            pids = self.rank_pids(i)
            if not pids:
                return None
            pid = r.choice(pids)
            if kind == "rank_kill":
                os.kill(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGSTOP)
                self.later(r.uniform(0.5, 3), lambda: self._cont(pid))
        elif kind == "agent_kill":
            if i in self.down:
                return None
            self.down.add(i)
            self.agents[i].kill()
            self.agents[i].wait()
            self.later(r.uniform(1, 3), lambda: self._restart(i))
        elif kind == "agent_stop":
            if i in self.down:
                return None
            pid = self.agents[i].pid
            os.kill(pid, signal.SIGSTOP)
            self.later(r.uniform(1, 4), lambda: self._cont(pid))
        elif kind == "host_add":
            if i in self.members:
                return None
            self.members.add(i)
            self.publish(self.members)
        elif kind == "host_remove":
            if i not in self.members or len(self.members) == 1:
                return None
            self.members.discard(i)
            self.publish(self.members)
        elif kind == "slow_link":
            netns.sh("ip", "netns", "exec", h["ns"], "tc", "qdisc", "replace", "dev", h["good"],
                     "root", "tbf", "rate", "200kbit", "burst", "4kbit", "limit", "2kb",
                     check=False)
            self.later(r.uniform(1, 4), lambda: self._unslow(i))
        elif kind == "link_cut":
            netns.sh("ip", "-n", h["ns"], "link", "set", h["good"], "down")
            self.later(r.uniform(1, 4), lambda: self._uncut(i))
        return f"{kind}@h{i}"

    def _cont(self, pid):
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass

    def _restart(self, i):
        with self.restart_lock:  # a timer and settle() may both get here
            if i in self.down:
                self.start_agent(i)
                self.down.discard(i)

    def _unslow(self, i):
        h = self.hosts.hosts[i]
        netns.sh("ip", "netns", "exec", h["ns"], "tc", "qdisc", "del", "dev", h["good"], "root",
                 check=False)

    def _uncut(self, i):
        h = self.hosts.hosts[i]
        netns.sh("ip", "-n", h["ns"], "link", "set", h["good"], "up", check=False)

    def settle(self):
        """Undoes every pending fault at once (before judging orphans and the next job)."""
        with self.lock:
            timers, self.timers = self.timers, []
        for t, fn in timers:
            t.cancel()
            fn()
        for i in range(self.a.hosts):
            self._uncut(i)
            self._unslow(i)
            for pid in self.ns_pids(i):
                self._cont(pid)
            if self.agents[i].poll() is not None:
                self.down.add(i)
                self._restart(i)

    # -- one job --------------------------------------------------------------------------

    def job(self, n):
        r = self.rng
        self.down = set()
        self.slots = {i: r.choice([1, 2]) for i in range(self.a.hosts)}
        self.members = set(r.sample(range(self.a.hosts), r.randint(2, self.a.hosts)))
        self.publish(self.members)
        steps = self.a.steps
        cmd = ["ip", "netns", "exec", self.bridge_ns, CAF_HVD, "driver",
               "--host-discovery-script", self.script, "--discovery-interval", "0.2",
               "--min-np", "1", "--max-np", str(2 * self.a.hosts), "--elastic-timeout", "10",
               "--start-timeout", "15", "--kill-grace-seconds", "1",
               # 3 s, not the default 10: agent pauses and link cuts of 1-4 s must
               # still cost hosts, so the loss paths stay exercised
               "--link-timeout", "3", "--", ALLREDUCE,
               "--elastic", "--steps", str(steps), "--step-ms", "20"]
        t0 = time.monotonic()
        p, out, err, readers = start_collected(cmd)
        faults = []
        while p.poll() is None and time.monotonic() - t0 < self.a.fault_seconds:
            time.sleep(r.uniform(0.3, 1.2))
            if p.poll() is None:
                f = self.fault()
                if f:
                    faults.append(f)
        hung = end_collected(p, readers, t0 + self.a.hang_seconds)
        self.settle()
        time.sleep(5)  # the agents' teardown of the job's ranks (grace 1 s, then SIGKILL)
        left = []
        for i in range(self.a.hosts):
            for pid in self.ns_pids(i):
                c = cmdline(pid)
                if c.startswith(ALLREDUCE) or "caf-hvd-exec" in c:
                    left.append(f"h{i}:{pid}:{c[:60]}")
        for pid in netns.sh("ip", "netns", "pids", self.bridge_ns, check=False).stdout.split():
            left.append(f"bridge:{pid}:{cmdline(int(pid))[:60]}")
        for item in left:  # leave nothing for the next job
            try:
                os.kill(int(item.split(":")[1]), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        return self.judge(n, p.returncode, "".join(out), "".join(err), hung, left, faults,
                          time.monotonic() - t0)

    def judge(self, n, rc, out, err, hung, left, faults, seconds):
        steps = self.a.steps
        verdicts = []
        if hung:
            verdicts.append("hang")
        last = 0
        lost = None
        for line in out.splitlines():
            m = re.search(r"\bstep (\d+) size", line)
            if m:
                last = max(last, int(m.group(1)))
            m = re.search(r"resumes at step (\d+)", line)
            if m and int(m.group(1)) < last - 1:
                lost = f"resumed at step {m.group(1)} after step {last}"
        if rc == 0 and lost:
            verdicts.append("lost")
        done = f"elastic run done: {steps} steps, checksum {steps * (steps + 1) // 2}"
        bad = re.search(r"does not match|expected the world size|state from rank 0 is at", out)
        if rc == 0 and (done not in out or bad):
            verdicts.append("wrong")
        if left:
            verdicts.append("orphan")
        if not verdicts:
            if rc == 0:
                verdicts.append("ok")
            elif any(re.search(x, err) for x in EXPLAINED):
                verdicts.append("failed")
            elif re.search(r"was lost after a rank of the final generation had finished", err):
                # A rank of the final generation finished (so, the steps being collective,
                # did every rank's loop), but a host was lost before its ranks' exits were
                # seen: the job fails, saying so.
                verdicts.append("failed, host lost at the end")
            else:
                verdicts.append("failed, unexplained")
        why = ""
        if rc != 0 or hung:
            errors = [x for x in err.splitlines() if "error:" in x or "job failed:" in x]
            rest = err.strip().splitlines()[-1:] or ["?"]
            why = (errors[-1] if errors else rest[0])[:200]
        gens = len(re.findall(r"generation \d+: rank 0 of", out))
        report_job(n, verdicts, rc, seconds, f"{gens} generation(s)", faults, lost, why, left,
                   self.a.log, out, err)
        return verdicts

    def close(self):
        self.settle()
        self.hosts.close()
        shutil.rmtree(self.work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--fault-seconds", type=float, default=4.0)
    ap.add_argument("--hang-seconds", type=float, default=120.0)
    ap.add_argument("--log", default=None, help="append every job's output to this file")
    ap.add_argument("--build", default=None)
    a = ap.parse_args()
    if a.seed is None:
        a.seed = random.randrange(1 << 30)
    why = netns.available()
    if why:
        print(f"chaos: skipped: {why}")
        return 0
    print(f"chaos: {a.jobs} jobs on {a.hosts} namespace hosts, seed {a.seed}", flush=True)
    soak = Soak(a)
    counts = {}
    t0 = time.monotonic()
    try:
        for n in range(1, a.jobs + 1):
            for v in soak.job(n):
                counts[v] = counts.get(v, 0) + 1
    finally:
        soak.close()
    print(f"chaos: {a.jobs} jobs in {time.monotonic() - t0:.0f} s (seed {a.seed}): " +
          ", ".join(f"{counts.get(k, 0)} {k}" for k in
                    ("ok", "failed", "failed, host lost at the end", "failed, unexplained",
                     "hang", "lost", "wrong", "orphan")))
    bad = sum(counts.get(k, 0) for k in ("hang", "lost", "wrong", "orphan"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
