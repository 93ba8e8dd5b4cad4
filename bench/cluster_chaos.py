#!/usr/bin/env python3
"""Cluster chaos: many jobs on one cluster while its own parts restart (issue 50).

H network-namespace hosts (tests/cluster/netns.py), each a node agent with its own node
certificate, `--slots S` and a `--state-dir`; host 0's agent holds the table, the others
join it. Jobs come one after another, C at a time, each placed by the table (no host
list): elastic ones (`caf-hvd-allreduce --elastic`, 20 ms steps, `--min-np 1`) and static
ones (`-np 2`, a few seconds, then an allreduce check). Meanwhile, one fault every 2-5 s,
chosen by the seed:

  table_restart   the table's agent SIGTERMed or SIGKILLed, started again 0.5-2 s later
                  with the same state directory (its holds, waiting line and drains);
                  the bench times how long until every member is alive in its table
  agent_restart   a member's agent SIGTERMed or SIGKILLed, started again 0.5-2 s later
                  (with --drain-grace S, a SIGTERMed agent first drains: its elastic jobs
                  leave it, and it exits once its ranks are gone or after S s, as the
                  package's unit does; without it the agent stops its ranks at once)
  drain           an administrator's drain of a node, undrained 2-6 s later
  driver_kill     SIGKILL of a running job's driver (the job ends; its slots must not)

Each job is judged:
  ok        exit 0 and its result checked (elastic: "elastic run done: S steps,
            checksum S(S+1)/2" and no step lost; static: "all sums correct")
  killed    the bench killed its driver (a fault, not a failure)
  failed    a non-zero exit whose cause the faults explain: a static job's rank or host
            lost when its node's agent restarted, an elastic job that lost every host of
            its generation at once, a static job that could not be placed in time (the
            cause is printed)
  lost      anything else: a hang, a wrong result, a step gone back, or a failure no fault
            explains (a job that had a host left and failed anyway)
A blacklisting of a node by a job counts as "healthy node blacklisted" unless that node's
agent restarted in the 20 s before it. At the end (faults stopped, every node undrained
and its agent up, every job ended) the bench waits for the cluster to settle and prints,
per node, the slots its agent reports held against the ranks alive there, and whether the
table still holds slots or lists jobs: any difference is a leak.

usage: bench/cluster_chaos.py [--jobs 50] [--hosts 4] [--slots 3] [--concurrent 3]
                              [--seed 1] [--drain-grace S] [--build DIR] [--log FILE]
Exits 1 if any job was lost, any slot leaked or any healthy node was blacklisted."""

import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_env import BUILD, cmdline, end_collected, start_collected  # noqa: E402
ALLREDUCE = os.environ.get("CAF_HVD_ALLREDUCE",
                           os.path.join(BUILD, "apps", "caf-hvd-allreduce"))
import netns  # noqa: E402
from harness import CAF_HVD, issue  # noqa: E402

PORT = 24780
# A failure is explained only by a restart of the agent of a node the job's ranks ran on
# (the job's event log says which), while the job ran: a static job loses a rank with
# its node, an elastic job only when every host of its generation goes at once.
ELASTIC_EXPLAINED = [r"no host of generation \d+ is left to carry the job's state",
                     r"every host is blacklisted"]


class Chaos:
    def __init__(self, a):
        self.a = a
        self.rng = random.Random(a.seed)       # the jobs
        self.frng = random.Random(a.seed + 1)  # the faults (their own thread)
        self.h = netns.Hosts(a.hosts)
        self.names = [x["name"] for x in self.h.hosts]
        self.head = self.h.hosts[0]["good_addr"]
        self.work = tempfile.mkdtemp(prefix="caf-hvd-cluster-chaos-")
        self.state = [os.path.join(self.work, f"state-{i}") for i in range(a.hosts)]
        for d in self.state:
            os.makedirs(d)
        self.driver_dir = issue("driver", "alice")
        self.admin_dir = issue("admin", "root-admin")
        self.certs = [issue("node", n) for n in self.names]
        self.agents = [None] * a.hosts
        self.logs = [[] for _ in range(a.hosts)]
        self.lock = threading.Lock()
        self.restarts = {i: [] for i in range(a.hosts)}  # wall times of agent restarts
        self.graceful_failures = []  # elastic jobs failed after SIGTERM restarts only
        self.table_times = []                            # restart-to-full-table, s
        self.drained = set()
        self.timers = []
        for i in range(a.hosts):
            self.start_agent(i)
        self.wait_full_table(60)

    # -- the cluster -------------------------------------------------------------------

    def start_agent(self, i):
        args = ["--cluster-dir", self.certs[i], "--link-timeout", "3", "--slots",
                str(self.a.slots), "--state-dir", self.state[i]]
        if self.a.drain_grace:
            args += ["--drain-grace", str(self.a.drain_grace)]
        if i != 0:
            args += ["--join", f"{self.head}:{PORT}"]
        for _ in range(40):  # the port may still be held by the stopped agent's socket
            try:
                p = self.h.start_node(i, CAF_HVD, port=PORT, extra=args)
                break
            except RuntimeError:
                time.sleep(0.25)
        else:
            raise RuntimeError(f"the agent of {self.names[i]} did not start again")
        self.agents[i] = p
        lines = self.logs[i]
        threading.Thread(target=lambda: lines.extend(iter(p.stdout.readline, "")),
                         daemon=True).start()

    def stop_agent(self, i, sig):
        p = self.agents[i]
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            pass
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()

    def cli(self, verb, *args, creds=None, timeout=30):
        return self.h.run(0, [CAF_HVD, verb, *args, "--cluster", f"{self.head}:{PORT}",
                              "--cluster-dir", creds or self.driver_dir], timeout=timeout)

    def view(self, verb):
        """`caf-hvd status|jobs --json` as JSON, or None when the table does not answer."""
        try:
            rc, out, _ = self.cli(verb, "--json", timeout=15)
        except AssertionError:
            return None
        return json.loads(out) if rc == 0 else None

    def table(self):
        return self.view("status")

    def full(self, t):
        return t is not None and all(
            any(n["name"] == name and n["state"] in ("alive", "drained", "draining")
                for n in t["nodes"]) for name in self.names)

    def wait_full_table(self, seconds):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.full(self.table()):
                return True
            time.sleep(0.2)
        return False

    # -- faults ------------------------------------------------------------------------

    def later(self, seconds, fn):
        t = threading.Timer(seconds, fn)
        t.daemon = True
        with self.lock:
            self.timers.append((t, fn))
        t.start()

    def restart(self, i, sig, pause):
        with self.lock:  # (before the stop: a job may blacklist the node as it stops)
            self.restarts[i].append(time.time())
        self.stop_agent(i, sig)
        time.sleep(pause)
        t0 = time.monotonic()
        self.start_agent(i)
        if i == 0:
            if self.wait_full_table(60):
                self.table_times.append(time.monotonic() - t0)

    def undrain(self, i):
        with self.lock:
            if i not in self.drained:
                return
            self.drained.discard(i)
        self.cli("undrain", self.names[i], creds=self.admin_dir)

    def fault(self, running, note):
        """Chooses a fault and does it; `note(text)` is called first (the jobs it may hit are
        told before it happens). Returns the text, or None when none applied."""
        r = self.frng
        kind = r.choice(["table_restart", "agent_restart", "agent_restart", "drain",
                         "driver_kill"])
        sig = r.choice([signal.SIGTERM, signal.SIGKILL])
        pause = r.uniform(0.5, 2)
        if kind in ("table_restart", "agent_restart"):
            i = 0 if kind == "table_restart" else r.randrange(1, self.a.hosts)
            text = f"{kind}({self.names[i]},{sig.name})"
            note(text)
            self.restart(i, sig, pause)
            return text
        if kind == "drain":
            i = r.randrange(self.a.hosts)
            with self.lock:
                if i in self.drained:
                    return None
                self.drained.add(i)
            text = f"drain({self.names[i]})"
            note(text)
            rc, _, err = self.cli("drain", self.names[i], creds=self.admin_dir)
            if rc != 0:
                with self.lock:
                    self.drained.discard(i)
                return f"drain({self.names[i]}) refused: {err.strip()[:80]}"
            self.later(r.uniform(2, 6), lambda: self.undrain(i))
            return text
        live = [j for j in running if j["p"].poll() is None]
        if not live:
            return None
        j = r.choice(live)
        text = f"driver_kill(job {j['n']})"
        note(text)
        j["killed"] = True
        os.killpg(j["p"].pid, signal.SIGKILL)
        return text

    def settle(self):
        with self.lock:
            timers, self.timers = self.timers, []
        for t, fn in timers:
            t.cancel()
            fn()
        for i in range(self.a.hosts):
            if self.agents[i].poll() is not None:
                self.start_agent(i)

    # -- jobs --------------------------------------------------------------------------

    def start_job(self, n):
        r = self.rng
        events = os.path.join(self.work, f"events-{n}.jsonl")
        common = [CAF_HVD, "driver", "--cluster-dir", self.driver_dir, "--cluster",
                  f"{self.head}:{PORT}", "--events", events, "--kill-grace-seconds", "1",
                  "--start-timeout", "60"]
        if r.random() < 0.7:
            steps = r.randrange(300, 800)
            cmd = common + ["--min-np", "1", "--max-np", str(r.choice([2, 3, 4])),
                            "--elastic-timeout", "20", "--", ALLREDUCE, "--elastic",
                            "--steps", str(steps), "--step-ms", "20"]
            kind = "elastic"
        else:
            steps = 0
            cmd = common + ["-np", "2", "--", "sh", "-c",
                            f"sleep {r.uniform(1, 5):.1f} && exec {ALLREDUCE}"]
            kind = "static"
        p, out, err, readers = start_collected(["ip", "netns", "exec", self.h.hosts[0]["ns"],
                                                *cmd])
        self.h.procs.append(p)
        return dict(n=n, kind=kind, steps=steps, p=p, out=out, err=err, readers=readers,
                    t0=time.monotonic(), wall0=time.time(), events=events, killed=False,
                    faults=[])

    def judge(self, j):
        hung = end_collected(j["p"], j["readers"], j["t0"] + self.a.hang_seconds)
        rc, out, err = j["p"].returncode, "".join(j["out"]), "".join(j["err"])
        seconds = time.monotonic() - j["t0"]
        try:
            with open(j["events"]) as f:
                evs = [json.loads(x) for x in f if x.strip()]
        except (OSError, ValueError):
            evs = []
        nodes = {e["context"].get("host") for e in evs if e.get("name") == "rank.started"}
        restarted = [f for f in j["faults"] if "restart(" in f
                     and f.split("(", 1)[1].split(",")[0] in nodes]
        why = ""
        if j["killed"]:
            verdict = "killed"
        elif hung:
            verdict, why = "lost", f"no end within {self.a.hang_seconds} s"
        elif j["kind"] == "elastic":
            steps = j["steps"]
            done = f"elastic run done: {steps} steps, checksum {steps * (steps + 1) // 2}"
            last, back = 0, None
            for line in out.splitlines():
                m = re.search(r"\bstep (\d+) size", line)
                if m:
                    last = max(last, int(m.group(1)))
                m = re.search(r"resumes at step (\d+)", line)
                if m and int(m.group(1)) < last - 1:
                    back = f"resumed at step {m.group(1)} after step {last}"
            if rc == 0 and done in out and not back:
                verdict = "ok"
            elif rc == 0:
                verdict, why = "lost", back or "exit 0 without the right result"
            elif restarted and any(re.search(x, err) for x in ELASTIC_EXPLAINED):
                verdict = "failed"
                if self.a.drain_grace and not any("SIGKILL" in f for f in restarted):
                    self.graceful_failures.append(j["n"])
            else:
                verdict = "lost"
        else:
            if rc == 0 and "all sums correct" in out:
                verdict = "ok"
            elif rc == 0:
                verdict, why = "lost", "exit 0 without 'all sums correct'"
            elif restarted:
                verdict = "failed"
            else:
                verdict = "lost"
        healthy_bl = []
        for e in evs:
            if e.get("name") != "host.blacklisted":
                continue
            host = e["context"].get("host")
            i = self.names.index(host) if host in self.names else -1
            if not (i >= 0 and any(e["timestamp"] - 20 <= t <= e["timestamp"] + 1
                                   for t in self.restarts[i])):
                healthy_bl.append(host)
        if rc != 0 and not why:
            errors = [x for x in err.splitlines() if "error:" in x or "summary: exit" in x]
            why = (errors[0] if errors else (err.strip().splitlines() or ["?"])[-1])[:220]
        line = (f"job {j['n']:3d}: {j['kind']:7s} {verdict:7s} exit {rc:4d} {seconds:5.1f} s, "
                f"faults: {', '.join(j['faults']) or '-'}")
        if why and verdict != "ok" and verdict != "killed":
            line += f"\n          {why}"
        if healthy_bl:
            line += f"\n          blacklisted healthy node(s): {', '.join(healthy_bl)}"
        print(line, flush=True)
        if self.a.log:
            with open(self.a.log, "a") as f:
                f.write(f"==== job {j['n']}: {verdict} {j['faults']}\n{out}\n---- stderr\n"
                        f"{err}\n")
        return verdict, healthy_bl

    def faults(self, running, stop, t_start):
        """One fault every 2-5 s until `stop` is set; each is noted on the jobs it hit."""
        while not stop.wait(self.frng.uniform(2, 5)):
            with self.lock:
                live = [j for j in running if j["p"].poll() is None]
            at = time.monotonic() - t_start

            def note(text, live=live):
                for j in live:
                    j["faults"].append(text)
            f = self.fault(live, note)
            if f:
                print(f"  fault at {at:6.1f} s: {f}", flush=True)

    def run(self):
        pending = list(range(1, self.a.jobs + 1))
        running, verdicts, healthy = [], {}, []
        t_start = time.monotonic()
        stop = threading.Event()
        injector = threading.Thread(target=self.faults, args=(running, stop, t_start),
                                    daemon=True)
        injector.start()
        try:
            while pending or running:
                while pending and len(running) < self.a.concurrent:
                    j = self.start_job(pending.pop(0))
                    with self.lock:
                        running.append(j)
                    if not pending:
                        stop.set()  # the last job runs without new faults once it started
                for j in [j for j in list(running) if j["p"].poll() is not None
                          or time.monotonic() - j["t0"] > self.a.hang_seconds]:
                    with self.lock:
                        running.remove(j)
                    v, bl = self.judge(j)
                    verdicts[j["n"]] = v
                    healthy += bl
                time.sleep(0.2)
        finally:
            stop.set()
            injector.join(120)
        return verdicts, healthy, time.monotonic() - t_start

    def leaks(self):
        """After every job ended: per node, slots the agent reports held and ranks alive;
        the table's running, starting and waiting jobs."""
        self.settle()
        deadline = time.monotonic() + 30
        while True:
            t, v = self.table(), self.view("jobs")
            ranks = {}
            for i, h in enumerate(self.h.hosts):
                pids = netns.sh("ip", "netns", "pids", h["ns"], check=False).stdout.split()
                ranks[self.names[i]] = sum(1 for x in pids
                                           if ALLREDUCE in cmdline(int(x))
                                           or "caf-hvd-exec" in cmdline(int(x)))
            held = {n["name"]: n["slots_used"] for n in (t or {}).get("nodes", [])}
            listed = {n["name"]: len(n["jobs"]) for n in (t or {}).get("nodes", [])}
            table_jobs = [f"{x['job']}: {x['state']}" for x in v["jobs"]] if v else None
            clean = (t is not None and self.full(t) and not any(held.values())
                     and not any(listed.values()) and not any(ranks.values())
                     and table_jobs == [])
            if clean or time.monotonic() > deadline:
                return clean, held, ranks, listed, table_jobs, t
            time.sleep(1)

    def close(self):
        with self.lock:
            timers, self.timers = self.timers, []
        for t, _ in timers:
            t.cancel()
        self.h.close()
        shutil.rmtree(self.work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--slots", type=int, default=3)
    ap.add_argument("--concurrent", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--hang-seconds", type=float, default=180)
    ap.add_argument("--drain-grace", type=int, default=0,
                    help="agents drain for up to S s on SIGTERM (0: they stop ranks at once)")
    ap.add_argument("--build", default=None)
    ap.add_argument("--log", default=None, help="append every job's output here")
    a = ap.parse_args()
    why = netns.available()
    if why:
        sys.exit(f"cluster_chaos: {why}")
    if a.hosts < 2:
        sys.exit("cluster_chaos: --hosts must be at least 2 (a table and a member)")
    c = Chaos(a)
    try:
        verdicts, healthy, seconds = c.run()
        clean, held, ranks, listed, table_jobs, t = c.leaks()
    finally:
        c.close()
    counts = {k: list(verdicts.values()).count(k) for k in ("ok", "failed", "killed", "lost")}
    print(f"\n{a.jobs} jobs in {seconds:.0f} s (seed {a.seed}, {a.hosts} hosts x {a.slots} "
          f"slots, {a.concurrent} at a time): " + ", ".join(f"{v} {k}" for k, v in
                                                            counts.items()))
    print("at the end, per node: slots its agent holds / ranks alive / jobs it lists")
    for n in c.names:
        print(f"  {n}: {held.get(n, '?')} / {ranks.get(n, '?')} / {listed.get(n, '?')}")
    print(f"the table's jobs: {table_jobs}")
    if c.table_times:
        tt = sorted(c.table_times)
        print(f"table restart to full table: median {statistics.median(tt):.2f} s, max "
              f"{tt[-1]:.2f} s over {len(tt)} restarts")
    if a.drain_grace:
        print(f"elastic jobs failed although every restart of their nodes was a SIGTERM with "
              f"--drain-grace {a.drain_grace}: {len(c.graceful_failures)} "
              f"{c.graceful_failures or ''}")
    print(f"healthy nodes blacklisted: {len(healthy)} {sorted(set(healthy)) or ''}")
    bad = counts["lost"] > 0 or not clean or healthy
    print("cluster_chaos: " + ("FAILED" if bad else "goal met: 0 lost, 0 leaked slots, "
                               "0 healthy nodes blacklisted"))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
