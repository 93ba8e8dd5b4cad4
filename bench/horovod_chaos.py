#!/usr/bin/env python3
"""Chaos soak with real Horovod: elastic jobs of the vendored Horovod's elastic program
(tests/cluster/horovod_programs/elastic_train.py: hvd.elastic.run, TorchState,
DistributedOptimizer, a commit every 5 steps) on node agents on loopback, each job with
random faults, each judged.

usage: bench/horovod_chaos.py [--jobs N] [--first K] [--seed X] [--hosts H] [--steps S]
                              [--build DIR] [--log FILE] [--verbose]

Jobs are numbered; job n's faults come from a generator seeded with (seed, n), so a run
of jobs K..K+N-1 (--first K) is the same as those jobs of a longer run: resumable batches.

Per job: H agents (ha, hb, ...; mutual TLS, each restarted under its name and port when
killed), 2..H of them listed with one slot each, then 1-3 faults, each at a random step or
at a generation's release (the job's event log is watched for `generation.released`):
  rank_kill    SIGKILL of a rank process;
  agent_kill   SIGKILL of a node agent (its ranks die with it), restarted 1-3 s later;
  host_add     a listed-out agent joins the discovery output;
  host_remove  a listed host leaves the discovery output;
  rank_stop    SIGSTOP of a rank for 4-6 s (longer than the agents' 3 s link timeout's
               heartbeat and Gloo's patience for a step), then SIGCONT.
Verdicts (decided from the job's output and this script's own fault schedule, never from
caf-hvd's messages):
  hang    no end within --hang-seconds;
  lost    exit 0, yet rank 0 resumed below a step it had committed before;
  wrong   exit 0 without every rank of the final size reporting the last step with
          parameters equal to rank 0's;
  orphan  a process of the job (a rank) left 5 s after the driver's end;
  failed  a non-zero exit: "failed, no host left" when the schedule's destructive faults
          (rank_kill, agent_kill, host_remove) had hit every host that trained before
          them; "failed, loss window" when a fault fired at a release took the job; else
          "failed, unexplained";
  ok      exit 0 and none of the above.
Prints one line per job and a summary; exits 1 on any hang, lost, wrong, orphan or
unexplained failure."""

import argparse
import json
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
from bench_env import ROOT, end_collected, report_job, start_collected  # noqa: E402
from harness import CAF_HVD, free_port, pid_with_env  # noqa: E402

TRAIN = os.path.join(ROOT, "tests", "cluster", "horovod_programs", "elastic_train.py")
PYTHON = "/usr/bin/python3"
NAMES = ["ha", "hb", "hc", "hd", "he", "hf"]
RESUME = re.compile(r"^\[\d+\]<stdout>:resume: rank 0 of (\d+) on (\S+) at step (\d+)$")
COMMITTED = re.compile(r"^\[\d+\]<stdout>:committed (\d+)$")
DONE = re.compile(r"^\[\d+\]<stdout>:done: rank (\d+) of (\d+) at step (\d+) params \S+ (.*)$")


def horovod_site():
    r = subprocess.run([os.path.join(ROOT, "scripts", "setup-horovod.sh")],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"scripts/setup-horovod.sh failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return r.stdout.strip().splitlines()[-1]


class Agents:
    """Node agents on loopback, one port per name for the whole soak."""

    def __init__(self, n):
        self.names = NAMES[:n]
        self.ports = {name: free_port() for name in self.names}
        self.procs = {}
        for name in self.names:
            self.start(name)

    def start(self, name):
        for _ in range(40):  # the killed agent's port may be held for a moment
            p = subprocess.Popen([CAF_HVD, "node", "--port", str(self.ports[name]), "--name",
                                  name, "--bind", "127.0.0.1"], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, start_new_session=True, text=True)
            line = p.stdout.readline()
            if "WARNING: --insecure" in line:
                line = p.stdout.readline()
            if "listening" in line:
                threading.Thread(target=lambda: [None for _ in p.stdout], daemon=True).start()
                self.procs[name] = p
                return
            p.kill()
            p.wait()
            time.sleep(0.25)
        raise RuntimeError(f"node agent {name} did not start")

    def kill(self, name):
        p = self.procs.pop(name, None)
        if p and p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()

    def ensure(self):
        for name in self.names:
            p = self.procs.get(name)
            if p is None or p.poll() is not None:
                self.start(name)

    def close(self):
        for name in list(self.procs):
            self.kill(name)


class Soak:
    def __init__(self, a, site):
        self.a = a
        self.site = site
        self.agents = Agents(a.hosts)
        self.work = tempfile.mkdtemp(prefix="caf-hvd-hvd-chaos-")
        self.listing = os.path.join(self.work, "hosts")
        self.script = os.path.join(self.work, "discover.sh")
        with open(self.script, "w") as f:
            f.write(f"#!/bin/sh\ncat {self.listing}\n")
        os.chmod(self.script, 0o700)

    def publish(self, members):
        with open(self.listing + ".tmp", "w") as f:
            for name in self.agents.names:
                if name in members:
                    f.write(f"127.0.0.1:{self.agents.ports[name]}:1\n")
        os.replace(self.listing + ".tmp", self.listing)

    def rank_pid(self, token, host):
        return pid_with_env(f"{PYTHON} {TRAIN}", prefix=True, CAF_HVD_CHAOS=token,
                            HOROVOD_HOSTNAME=host)

    def released(self, events):
        try:
            with open(events) as f:
                return [json.loads(x)["context"]["generation"] for x in f
                        if '"generation.released"' in x]
        except (OSError, ValueError):
            return []

    def last_release(self, events):
        try:
            with open(events) as f:
                return [json.loads(x)["timestamp"] for x in f
                        if '"generation.released"' in x][-1]
        except (OSError, ValueError, IndexError):
            return time.time()

    def job(self, n):
        r = random.Random(f"{self.a.seed}-{n}")
        self.agents.ensure()
        names = self.agents.names
        members = set(r.sample(names, r.randint(2, len(names))))
        self.publish(members)
        token = f"{os.getpid()}-{n}-{time.monotonic_ns()}"
        events = os.path.join(self.work, f"events-{n}.jsonl")
        env = {"PYTHONPATH": self.site, "TRAIN_STEPS": str(self.a.steps), "TRAIN_COMMIT": "5",
               "TRAIN_STEP_MS": "100", "HOROVOD_GLOO_TIMEOUT_SECONDS": "10",
               "CAF_HVD_CHAOS": token}
        cmd = [CAF_HVD, "driver", "--host-discovery-script", self.script,
               "--discovery-interval", "0.2", "--min-np", "1", "--max-np", str(len(names)),
               "--elastic-timeout", "30", "--start-timeout", "30", "--kill-grace-seconds", "2",
               "--link-timeout", "3", "--events", events] + (["--verbose"] if self.a.verbose else [])
        for k, v in env.items():
            cmd += ["--env", f"{k}={v}"]
        cmd += ["--", PYTHON, TRAIN]
        t0 = time.monotonic()
        p, out, err, readers = start_collected(cmd)
        # the schedule: 1-3 faults, each at a step of rank 0 or at the next release
        # (a fault at a release follows a host change made for it at a step)
        plan = []
        kinds = ["rank_kill", "agent_kill", "host_add", "host_remove", "rank_stop"]
        for _ in range(r.randint(1, 3)):
            step = r.randint(8, self.a.steps - 15)
            if r.random() < 0.3:
                plan.append((("step", step), r.choice(["host_add", "host_remove"])))
                plan.append((("release", step), r.choice(kinds)))
            else:
                plan.append((("step", step), r.choice(kinds)))
        plan.sort(key=lambda x: (x[0][1], x[0][0] == "release"))
        trained = set(members)  # hosts that may hold state (they trained or will)
        hit = set()             # ... of them, those a destructive fault took
        faults, in_window = [], False
        timers = []
        seen_released = 0
        cancelled = set()
        for (when, step), kind in plan:
            if (when, step) in cancelled:
                continue
            # wait for the fault's moment (or the job's end)
            while p.poll() is None and time.monotonic() - t0 < self.a.hang_seconds:
                if when == "step":
                    last = max([int(m.group(1)) for m in map(COMMITTED.match, out) if m] or [0])
                    if last >= step:
                        break
                elif len(self.released(events)) > seen_released:
                    break
                time.sleep(0.02)
            if p.poll() is not None:
                break
            seen_released = len(self.released(events))
            live = [h for h in members if h in self.agents.procs]
            desc = None
            if kind == "host_add" and not set(names) - members:
                kind = "host_remove"  # every host is in: the change is a removal
            if kind == "host_remove" and len(members) == 1:
                kind = "host_add"
            if kind in ("rank_kill", "rank_stop") and live:
                host = r.choice(sorted(live))
                pid = self.rank_pid(token, host)
                if pid:
                    if kind == "rank_kill":
                        os.kill(pid, signal.SIGKILL)
                        hit.add(host)
                    else:
                        os.kill(pid, signal.SIGSTOP)
                        t = threading.Timer(r.uniform(4, 6), lambda pid=pid: _cont(pid))
                        t.start()
                        timers.append(t)
                    desc = f"{kind}@{host}"
            elif kind == "agent_kill" and live:
                host = r.choice(sorted(live))
                self.agents.kill(host)
                hit.add(host)
                t = threading.Timer(r.uniform(1, 3), lambda h=host: self.agents.start(h))
                t.start()
                timers.append(t)
                desc = f"agent_kill@{host}"
            elif kind == "host_add":
                out_of = sorted(set(names) - members)
                if out_of:
                    host = r.choice(out_of)
                    members.add(host)
                    trained.add(host)
                    self.publish(members)
                    desc = f"host_add@{host}"
            elif kind == "host_remove" and len(members) > 1:
                host = r.choice(sorted(members))
                members.discard(host)
                hit.add(host)
                self.publish(members)
                desc = f"host_remove@{host}"
            if desc and when == "release":
                # how long after the release it struck (the event's time, wall clock)
                after = (time.time() - self.last_release(events)) * 1000
                faults.append(f"{desc}@release+{after:.0f}ms")
                in_window = True
            elif desc:
                faults.append(f"{desc}@{step}")
            elif when == "step" and kind in ("host_add", "host_remove"):
                # no change made: the fault meant for its release would wait in vain
                cancelled.add(("release", step))
        hung = end_collected(p, readers, t0 + self.a.hang_seconds)
        for t in timers:
            t.join()
        seconds = time.monotonic() - t0
        time.sleep(5)  # the agents' teardown of the job's ranks
        left = []
        while True:
            pid = pid_with_env(f"{PYTHON} {TRAIN}", prefix=True, CAF_HVD_CHAOS=token)
            if pid is None:
                break
            left.append(pid)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            time.sleep(0.1)
            if len(left) > 50:
                break
        return self.judge(n, p.returncode, out, "".join(err), hung, left, faults,
                          trained <= hit, in_window, seconds)

    def judge(self, n, rc, out, err, hung, left, faults, none_left, in_window, seconds):
        verdicts = []
        if hung:
            verdicts.append("hang")
        committed, lost = 0, None
        for line in out:
            m = COMMITTED.match(line.rstrip("\n"))
            if m:
                committed = max(committed, int(m.group(1)))
            m = RESUME.match(line.rstrip("\n"))
            if m and int(m.group(3)) < committed and not lost:
                lost = f"rank 0 resumed at step {m.group(3)} after committing step {committed}"
        if rc == 0 and lost:
            verdicts.append("lost")
        done = [DONE.match(x.rstrip("\n")) for x in out]
        done = [(int(m.group(1)), int(m.group(2)), int(m.group(3)), m.group(4)) for m in done if m]
        if rc == 0:
            sizes = {d[1] for d in done}
            ok = (len(sizes) == 1 and sorted(d[0] for d in done) == list(range(sizes.pop()))
                  and all(d[2] == self.a.steps and d[3] == "equal" for d in done))
            if not ok:
                verdicts.append("wrong")
        if left:
            verdicts.append("orphan")
        if not verdicts:
            if rc == 0:
                verdicts.append("ok")
            elif none_left:
                verdicts.append("failed, no host left")
            elif in_window:
                verdicts.append("failed, loss window")
            else:
                verdicts.append("failed, unexplained")
        why = ""
        if rc != 0 or hung:
            lines = [x for x in err.splitlines() if x.startswith("caf-hvd: ")]
            why = (lines[-1] if lines else (err.strip().splitlines() or ["?"])[-1])[:220]
        gens = len([x for x in out if RESUME.match(x.rstrip("\n"))])
        report_job(n, verdicts, rc, seconds, f"{gens} resume(s)", faults, lost, why, left,
                   self.a.log, "".join(out), err)
        return verdicts

    def close(self):
        self.agents.close()
        shutil.rmtree(self.work, True)


def _cont(pid):
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


KINDS = ("ok", "failed, no host left", "failed, loss window", "failed, unexplained", "hang",
         "lost", "wrong", "orphan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--first", type=int, default=1, help="number of the first job")
    ap.add_argument("--seed", type=int, default=35)
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--hang-seconds", type=float, default=240.0)
    ap.add_argument("--log", default=None, help="append every job's output to this file")
    ap.add_argument("--verbose", action="store_true", help="drivers with --verbose (to --log)")
    ap.add_argument("--build", default=None)
    a = ap.parse_args()
    if not 3 <= a.hosts <= len(NAMES):
        sys.exit(f"--hosts must be between 3 and {len(NAMES)}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # leave no agent behind
    site = horovod_site()
    print(f"horovod chaos: jobs {a.first}-{a.first + a.jobs - 1} on {a.hosts} agents, seed "
          f"{a.seed}: python3 bench/horovod_chaos.py {' '.join(sys.argv[1:])}", flush=True)
    soak = Soak(a, site)
    counts = {}
    t0 = time.monotonic()
    try:
        for n in range(a.first, a.first + a.jobs):
            for v in soak.job(n):
                counts[v] = counts.get(v, 0) + 1
    finally:
        soak.close()
    print(f"horovod chaos: {a.jobs} jobs in {time.monotonic() - t0:.0f} s (seed {a.seed}): "
          + ", ".join(f"{counts.get(k, 0)} {k}" for k in KINDS))
    bad = sum(counts.get(k, 0) for k in ("hang", "lost", "wrong", "orphan",
                                          "failed, unexplained"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
