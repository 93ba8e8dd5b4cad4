#!/usr/bin/env python3
"""Real Horovod elastic training under horovodrun's elastic driver and under caf-hvd, on
this machine: recovery after a SIGKILL and growth when a host appears.

usage: bench/horovod_elastic.py [--runs N] [--build DIR] [--only horovodrun|caf-hvd]
                                [--gloo-timeout S]

The program is tests/cluster/horovod_programs/elastic_train.py (hvd.elastic.run,
TorchState, DistributedOptimizer) with real Horovod 0.28.1 (scripts/setup-horovod.sh),
TRAIN_COMMIT=5 (commit every 5 steps), TRAIN_STEP_MS=100 and more steps than the
measurement needs; the job is stopped once the figure is taken (SIGINT to the launcher,
then SIGKILL to its process group and to every process that carries the run's marker in
its environment: horovodrun's workers run in sessions of their own). Both launchers get
the same discovery script (`cat` of a file this script rewrites atomically; it also logs
the time of each call) and 1 slot per host.

- horovodrun: `python3 -m horovod.runner.launch --gloo --network-interfaces lo -np N
  --min-np 1 --max-np 3 --host-discovery-script S`; the hosts are `localhost`,
  `127.0.0.1` and this machine's hostname, three names Horovod takes as local (they
  resolve to an address of a local interface), so no ssh. Without --network-interfaces
  an elastic job waits for a second host to compare interfaces. horovodrun waits 1 s
  after each call of the discovery script returned (DISCOVER_HOSTS_FREQUENCY_SECS, not
  configurable), and each call starts a Python interpreter (safe_shell_exec's 'spawn'
  middleman), so its period is longer: the breakdown shows it.
- caf-hvd: three node agents on loopback (`caf-hvd node --name ha|hb|hc`, mutual TLS
  with a throw-away cluster), `caf-hvd driver --host-discovery-script S --min-np 1
  --max-np 3 --discovery-interval 1`, discovery lines `127.0.0.1:PORT:1`. If the
  driver's default interval is not 1 s, growth is also measured with the default.

Figures (the launcher's stdout and stderr are read line by line and every line is
stamped on arrival, monotonic clock):
  recovery: 3 hosts; once rank 0 printed `step S size 3` with S >= 12 and S % 5 == 2,
    the rank-2 process is SIGKILLed (its host is not rank 0's); the time from just before
    the kill to the first `committed S` line after rank 0 printed a step (or its resume
    line) at size 2. Both launchers blacklist the failed host, so the job shrinks to 2.
  growth: 2 hosts; 0-3 s (uniformly random, seeded, the same delay for every launcher in
    a run) after the same step the third host is added to the discovery output (os.replace
    of the file), so that where the change falls in the discovery schedule and in the
    commit cycle is random rather than tied to the job's start-up (both schedules start
    with the job). The time from just after the replace to the first `committed S` after
    a step at size 3.
The breakdown (medians) splits them. Recovery: when the launcher reported the failure
(horovodrun: "Process N exit with status code 137." on stdout; caf-hvd: "host H is
blacklisted" on stderr), when the last survivor's Horovod reported its error ("Horovod
background loop uncaught exception": a survivor that does not read from the killed rank
waits in Gloo until HOROVOD_GLOO_TIMEOUT_SECONDS, 30 s by default, under either launcher;
--gloo-timeout S shortens it for the recovery runs), when rank 0 printed its resume line
at size 2, and that moment after the error (the launcher's re-rendezvous). Growth: when
the discovery script first ran after the change, rank 0's resume line at size 3, the
first commit at size 3 counted from that discovery run (the launcher's own part), and the
median period of the discovery calls. The commit after a resume comes 5 steps (>= 500 ms)
later for both launchers: the program restores the last commit and commits every 5 steps.
Runs alternate launcher by launcher (the order flips every run)."""

import argparse
import os
import queue
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_env import ROOT  # noqa: E402

TRAIN = os.path.join(ROOT, "tests", "cluster", "horovod_programs", "elastic_train.py")
PYTHON = "/usr/bin/python3"
STEPS = 100000
COMMIT = 5
STEP_MS = 100
TRIGGER = 12  # act once rank 0 printed step 12 (2 steps after a commit) or a later such step
GROWTH_DELAY_S = 3.0  # growth: the host appears 0-3 s (uniform) after the trigger step
GROWTH_SEED = 1
START_TIMEOUT = 180
EVENT_TIMEOUT = 120
STOP_TIMEOUT = 20
HOROVODRUN_DISCOVERY_S = 1.0  # horovod/runner/elastic/driver.py DISCOVER_HOSTS_FREQUENCY_SECS

# Every process this script starts has MARK=TOKEN in its environment (and the processes of
# one launcher run RUN_MARK=...): leftovers are found by it and killed by pid.
MARK = "CAF_HVD_BENCH_HVD_ELASTIC"
RUN_MARK = "CAF_HVD_BENCH_HVD_ELASTIC_RUN"
TOKEN = uuid.uuid4().hex
os.environ[MARK] = TOKEN
os.environ["CAF_HVD_BENCH"] = "1"

LINE = re.compile(r"\[(\d+)\]<(stdout|stderr)>:(.*)$")
RESUME = re.compile(r"^resume: rank (\d+) of (\d+) on (\S+) at step (\d+)$")
STEP = re.compile(r"^step (\d+) size (\d+)$")
COMMITTED = re.compile(r"^committed (\d+)$")
HVD_FAILURE = re.compile(r"^Process \d+ exit with status code (\d+)\.")
CAF_FAILURE = re.compile(r"host \S+ is blacklisted")
RANK_ERROR = re.compile(r"Horovod background loop uncaught exception")


# -- processes ---------------------------------------------------------------------------

def procs_with_env(cmd_prefix=None, **env):
    """Pids (not this process) whose environment has every KEY=VALUE of env and whose
    command line starts with cmd_prefix (if given)."""
    want = {k.encode(): str(v).encode() for k, v in env.items()}
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if cmd_prefix is not None:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
                if not cmd.startswith(cmd_prefix):
                    continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                have = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        if all(have.get(k) == v for k, v in want.items()):
            out.append(int(entry))
    return out


def kill_marked(**env):
    """SIGKILLs every process with these environment values and waits until they are gone
    (zombies of other parents count as gone); returns how many there were."""
    pids = procs_with_env(**env)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                        alive.append(pid)
            except OSError:
                pass
        if not alive:
            break
        time.sleep(0.05)
    return len(pids)


class Launch:
    """A launcher process in its own session; its stdout and stderr lines are stamped
    (time.monotonic()) as they arrive, by one thread per stream."""

    def __init__(self, argv, env):
        self.argv = argv
        self.run_token = env[RUN_MARK]
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, bufsize=1, env=env, start_new_session=True)
        self.q = queue.Queue()
        self.log = []
        self.ended = 0
        self.threads = [threading.Thread(target=self._read, args=(s, n), daemon=True)
                        for s, n in ((self.p.stdout, "out"), (self.p.stderr, "err"))]
        for t in self.threads:
            t.start()

    def _read(self, stream, name):
        for line in stream:
            self.q.put((time.monotonic(), name, line.rstrip("\n")))
        self.q.put((time.monotonic(), name, None))

    def next(self, deadline):
        """The next (t, stream, line), or None at the deadline or when both streams ended."""
        while True:
            if self.ended == 2:
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                e = self.q.get(timeout=left)
            except queue.Empty:
                return None
            self.log.append(e)
            if e[2] is None:
                self.ended += 1
            else:
                return e

    def tail(self, n=40):
        return "\n".join(f"{e[1]}: {e[2]}" for e in self.log[-n:] if e[2] is not None)

    def stop(self):
        """SIGINT to the launcher, then SIGKILL to its process group and to every process
        of this run (horovodrun's workers run in sessions of their own; caf-hvd's ranks are
        children of the node agents); returns the launcher's exit code."""
        if self.p.poll() is None:
            try:
                self.p.send_signal(signal.SIGINT)
                self.p.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.p.wait()
        kill_marked(**{RUN_MARK: self.run_token})
        for t in self.threads:
            t.join(timeout=5)
        while True:  # keep what arrived during the stop, for error messages
            try:
                e = self.q.get_nowait()
            except queue.Empty:
                break
            self.log.append(e)
        return self.p.returncode


# -- one measurement -----------------------------------------------------------------------

class Job:
    """Follows rank 0's lines of the training program in a launcher's output."""

    def __init__(self, launch, failure_re):
        self.l = launch
        self.failure_re = failure_re
        self.resumes = {}  # rank -> (size, host) of its last resume line
        self.commits = []  # rank 0's `committed S` lines: (t, S)
        self.steps = []    # rank 0's `step S size N` lines: (t, S, N)

    def wait(self, what, pred, timeout):
        """Reads lines until pred(t, kind, match) returns a value, and returns it."""
        deadline = time.monotonic() + timeout
        while True:
            e = self.l.next(deadline)
            if e is None:
                code = self.l.p.poll()
                raise RuntimeError(f"no {what} within {timeout} s"
                                   f"{'' if code is None else f' (launcher exited {code})'}:\n"
                                   f"{self.l.tail()}")
            t, stream, line = e
            m = LINE.search(line)
            if m and m.group(2) == "stderr" and RANK_ERROR.search(m.group(3)):
                v = pred(t, "rank error", line)
                if v is not None:
                    return v
                continue
            if m and m.group(2) == "stdout":
                body = m.group(3)
                r = RESUME.match(body)
                if r:
                    self.resumes[int(r.group(1))] = (int(r.group(2)), r.group(3))
                    if r.group(1) == "0":
                        v = pred(t, "resume", r)
                        if v is not None:
                            return v
                    continue
                s = STEP.match(body)
                if s:
                    self.steps.append((t, int(s.group(1)), int(s.group(2))))
                    v = pred(t, "step", s)
                    if v is not None:
                        return v
                    continue
                c = COMMITTED.match(body)
                if c:
                    self.commits.append((t, int(c.group(1))))
                    v = pred(t, "commit", c)
                    if v is not None:
                        return v
                continue
            if self.failure_re.search(line):
                v = pred(t, "failure", line)
                if v is not None:
                    return v

    def wait_trigger(self, size):
        """Until rank 0 printed `step S size <size>` with S >= TRIGGER, S % 5 == 2."""
        def pred(t, kind, m):
            if kind == "step" and int(m.group(2)) == size and int(m.group(1)) >= TRIGGER \
                    and int(m.group(1)) % COMMIT == TRIGGER % COMMIT:
                return t
        return self.wait(f"step >= {TRIGGER} at size {size}", pred, START_TIMEOUT)

    def wait_commit_at(self, size):
        """Until the first commit after rank 0 printed a step or its resume at `size`;
        returns (t_commit, {what: t} for: the launcher reported the failure, the last
        survivor's Horovod reported its error (before the resume), rank 0 resumed)."""
        seen = {}

        def pred(t, kind, m):
            if kind == "failure":
                seen.setdefault("failure", t)
            elif kind == "rank error" and "size" not in seen:
                seen["rank error"] = t
            elif kind == "resume" and int(m.group(2)) == size:
                seen.setdefault("resume", t)
                seen.setdefault("size", t)
            elif kind == "step" and int(m.group(2)) == size:
                seen.setdefault("size", t)
            elif kind == "commit" and "size" in seen:
                return t
        t = self.wait(f"commit at size {size}", pred, EVENT_TIMEOUT)
        return t, seen


class Bench:
    def __init__(self, site, work, gloo_timeout=None):
        self.site = site
        self.work = work
        self.gloo_timeout = gloo_timeout
        self.hosts_file = os.path.join(work, "hosts")
        self.calls_file = os.path.join(work, "calls")
        self.events_file = os.path.join(work, "events.jsonl")
        self.import_ms = None
        self.script = os.path.join(work, "discover.sh")
        with open(self.script, "w") as f:
            f.write(f"#!/bin/sh\ndate +%s.%N >> {self.calls_file}\ncat {self.hosts_file}\n")
        os.chmod(self.script, 0o700)
        # horovodrun: three names of this machine
        self.hvd_hosts = ["localhost", "127.0.0.1", socket.gethostname()]
        if len(set(self.hvd_hosts)) != 3:
            raise RuntimeError(f"need three distinct local host names, have {self.hvd_hosts}")
        self.cluster = None
        self.caf_ports = None

    def start_agents(self):
        from harness import Cluster  # creates the throw-away cluster (needs the binary)
        self.cluster = Cluster()
        self.caf_ports = [self.cluster.node(n) for n in ("ha", "hb", "hc")]

    def close(self):
        if self.cluster:
            self.cluster.close()

    def set_hosts(self, lines):
        tmp = self.hosts_file + ".tmp"
        with open(tmp, "w") as f:
            f.write("".join(line + "\n" for line in lines))
        os.replace(tmp, self.hosts_file)

    def discovery_calls(self):
        try:
            with open(self.calls_file) as f:
                return [float(x) for x in f.read().split()]
        except OSError:
            return []

    def env(self, run_token, gloo_timeout):
        e = dict(os.environ)
        e.update({"PYTHONPATH": self.site, "TRAIN_STEPS": str(STEPS),
                  "TRAIN_COMMIT": str(COMMIT), "TRAIN_STEP_MS": str(STEP_MS),
                  "PYTHONUNBUFFERED": "1", RUN_MARK: run_token})
        if gloo_timeout:
            e["HOROVOD_GLOO_TIMEOUT_SECONDS"] = str(gloo_timeout)
        return e

    def horovodrun_argv(self, np):
        return [PYTHON, "-m", "horovod.runner.launch", "--gloo", "--network-interfaces", "lo",
                "-np", str(np), "--min-np", "1", "--max-np", "3",
                "--host-discovery-script", self.script, PYTHON, TRAIN]

    def caf_argv(self, run_token, interval, gloo_timeout, cold=False):
        caf = os.environ["CAF_HVD"]
        argv = [caf, "driver", "--host-discovery-script", self.script, "--min-np", "1",
                "--max-np", "3", "--events", self.events_file]
        if cold:
            argv.append("--cold-joins")
        if interval is not None:
            argv += ["--discovery-interval", str(interval)]
        env = [("PYTHONPATH", self.site), ("TRAIN_STEPS", STEPS), ("TRAIN_COMMIT", COMMIT),
               ("TRAIN_STEP_MS", STEP_MS), (RUN_MARK, run_token)]
        if gloo_timeout:
            env.append(("HOROVOD_GLOO_TIMEOUT_SECONDS", gloo_timeout))
        for k, v in env:
            argv += ["--env", f"{k}={v}"]
        return argv + ["--", PYTHON, TRAIN]

    def launch(self, launcher, np, interval=1, gloo_timeout=None, cold=False):
        token = uuid.uuid4().hex
        if launcher == "horovodrun":
            argv, failure = self.horovodrun_argv(np), HVD_FAILURE
        else:
            argv, failure = self.caf_argv(token, interval, gloo_timeout, cold), CAF_FAILURE
        for f in (self.calls_file, self.events_file):
            if os.path.exists(f):
                os.unlink(f)
        return Job(Launch(argv, self.env(token, gloo_timeout)), failure)

    def host_lines(self, launcher, n):
        if launcher == "horovodrun":
            return [f"{h}:1" for h in self.hvd_hosts[:n]]
        return [f"127.0.0.1:{p}:1" for p in self.caf_ports[:n]]

    def recovery(self, launcher):
        """ms from the SIGKILL of rank 2 (of 3) to the first commit at size 2, and the
        breakdown (failure reported, resume at size 2) in ms after the kill."""
        self.set_hosts(self.host_lines(launcher, 3))
        job = self.launch(launcher, 3, gloo_timeout=self.gloo_timeout)
        try:
            job.wait_trigger(3)
            size, host = job.resumes.get(2, (None, None))
            if size != 3:
                raise RuntimeError(f"rank 2 has not resumed at size 3: {job.resumes}")
            pids = procs_with_env(f"{PYTHON} {TRAIN}", HOROVOD_HOSTNAME=host,
                                  **{RUN_MARK: job.l.run_token})
            if len(pids) != 1:
                raise RuntimeError(f"expected one rank on host {host}, found pids {pids}")
            t_kill = time.monotonic()
            os.kill(pids[0], signal.SIGKILL)
            t, seen = job.wait_commit_at(2)
            ms = lambda x: None if x is None else (x - t_kill) * 1000  # noqa: E731
            err, res = seen.get("rank error"), seen.get("resume")
            return ms(t), {"launcher reported it": ms(seen.get("failure")),
                           "last survivor's Horovod error": ms(err),
                           "rank 0 resumed at 2": ms(res),
                           "(resumed after that error)": (res - err) * 1000
                           if err and res else None}
        finally:
            job.l.stop()

    def growth(self, launcher, delay, interval=1, cold=False):  # noqa: C901
        """ms from the third host's appearance in the discovery output (`delay` s after the
        trigger step) to the first commit at size 3, and the breakdown."""
        self.set_hosts(self.host_lines(launcher, 2))
        job = self.launch(launcher, 2, interval, cold=cold)
        try:
            job.wait_trigger(2)
            time.sleep(delay)
            self.set_hosts(self.host_lines(launcher, 3))
            t_add, wall_add = time.monotonic(), time.time()
            t, seen = job.wait_commit_at(3)
            after = [c for c in self.discovery_calls() if c >= wall_add]
            ran = (after[0] - wall_add) * 1000 if after else None
            ms = (t - t_add) * 1000
            # The survivors' pause: the longest gap between rank 0's consecutive step lines
            # from the host's appearance to the first commit at size 3, less the
            # program's own gap between steps (the median before the host appeared). Step
            # lines, not commit lines: the commit at which the ranks act on the notice
            # saves and then raises HostsUpdatedInterrupt, so it prints no `committed`.
            before = [st for st, _, _ in job.steps if st < t_add]
            steady = statistics.median([b - a for a, b in zip(before, before[1:])]) \
                if len(before) >= 3 else None
            window = before[-1:] + [st for st, _, _ in job.steps if t_add <= st <= t]
            gap = max((b - a for a, b in zip(window, window[1:])), default=None)
            resumed = seen.get("resume")
            own = (t - resumed) * 1000 if resumed else None  # the new size's first 5 steps
            # the newcomer's imports are the program's under any launcher (warm joins run
            # them while the survivors train, the others while they wait)
            program = (own or 0) + self.import_ms
            parts = {
                "discovery script ran": ran,
                "rank 0 resumed at 3": (resumed - t_add) * 1000 if resumed else None,
                "(first commit at 3 after that run)": ms - ran if ran is not None else None,
                "(period of discovery calls)": self.discovery_period(),
                "survivors' pause": (gap - steady) * 1000
                if gap is not None and steady is not None else None,
                "program's share": program,
                "launcher's share": ms - program}
            if launcher == "caf-hvd":
                parts["loss window"] = self.loss_window()
            return ms, parts
        finally:
            job.l.stop()

    def loss_window(self):
        """caf-hvd: ms from the newest generation's release to the moment every rank of
        it had finished hvd.init()'s rendezvous (its event log: generation.released, then
        rank.rendezvous of scope cross with connected true for each of its slots)."""
        import json
        try:
            with open(self.events_file) as f:
                log = [json.loads(x) for x in f if x.strip()]
        except (OSError, ValueError):
            return None
        released = [e for e in log if e["name"] == "generation.released"]
        if len(released) < 2:
            return None
        g = released[-1]["context"]["generation"]
        begin = [e for e in log if e["name"] == "generation.begin"
                 and e["context"]["generation"] == g]
        # hvd.init()'s last rendezvous is of scope cross_<k>
        done = [e["timestamp"] for e in log if e["name"] == "rank.rendezvous"
                and e["context"]["generation"] == g and e["context"]["connected"]
                and e["context"].get("scope") == "cross"]
        if not begin or len(done) < begin[0]["context"]["size"]:
            return None
        return (max(done) - released[-1]["timestamp"]) * 1000

    def measure_import(self, runs=3):
        """ms the program takes to import torch and horovod.torch (median of `runs`
        fresh interpreters): what a newcomer costs the survivors when it starts only after
        they re-joined."""
        xs = []
        for _ in range(runs):
            t0 = time.monotonic()
            subprocess.run([PYTHON, "-c", "import torch, horovod.torch"], check=True,
                           env={**os.environ, "PYTHONPATH": self.site})
            xs.append((time.monotonic() - t0) * 1000)
        self.import_ms = statistics.median(xs)
        return self.import_ms

    def discovery_period(self):
        calls = self.discovery_calls()
        gaps = [b - a for a, b in zip(calls, calls[1:])]
        return statistics.median(gaps) * 1000 if gaps else None


def caf_default_interval():
    """caf-hvd driver's default --discovery-interval, from its --help."""
    r = subprocess.run([os.environ["CAF_HVD"], "driver", "--help"], capture_output=True,
                       text=True)
    m = re.search(r"--discovery-interval arg \(=([0-9.]+)\)", r.stdout + r.stderr)
    return float(m.group(1)) if m else None


def fmt(x):
    return "-" if x is None else f"{x:.0f}"


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"),
                    help="caf-hvd's build directory (default: build/)")
    ap.add_argument("--only", choices=("horovodrun", "caf-hvd"),
                    help="measure one launcher only")
    ap.add_argument("--gloo-timeout", type=int, default=None, metavar="S",
                    help="HOROVOD_GLOO_TIMEOUT_SECONDS for the ranks of the recovery runs "
                         "(default: unset, Horovod's 30 s; growth always runs with the "
                         "default: under horovodrun the old ranks wait that long in Gloo's "
                         "rendezvous for the new process to start)")
    a = ap.parse_args()
    launchers = [a.only] if a.only else ["horovodrun", "caf-hvd"]
    command = "python3 bench/horovod_elastic.py " + " ".join(sys.argv[1:])

    r = subprocess.run([os.path.join(ROOT, "scripts", "setup-horovod.sh")],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"scripts/setup-horovod.sh failed ({r.returncode}):\n{r.stderr[-3000:]}")
    site = r.stdout.strip().splitlines()[-1]
    if "caf-hvd" in launchers and not os.access(os.environ["CAF_HVD"], os.X_OK):
        sys.exit(f"no caf-hvd binary at {os.environ['CAF_HVD']} (--build DIR, or "
                 "--only horovodrun)")

    work = tempfile.mkdtemp(prefix="caf-hvd-bench-hvd-elastic-")
    bench = Bench(site, work, a.gloo_timeout)
    default_interval = None
    # (scenario, label, launcher, measure) in the order of the table
    configs = []
    for scenario in ("recovery", "growth"):
        for launcher in launchers:
            measure = bench.recovery if scenario == "recovery" else bench.growth
            configs.append((scenario, launcher, launcher, measure))
    rows = {}  # (scenario, label) -> [(ms, breakdown)]
    try:
        if "caf-hvd" in launchers:
            bench.start_agents()
            default_interval = caf_default_interval()
            configs.append(("growth", "caf-hvd --cold-joins", "caf-hvd",
                            lambda l, d: bench.growth(l, d, cold=True)))
            if default_interval is not None and default_interval != 1:
                configs.append(("growth", f"caf-hvd, its default --discovery-interval "
                                f"{default_interval:g}", "caf-hvd",
                                lambda l, d: bench.growth(l, d, interval=None)))
        bench.measure_import()
        print(f"## Real Horovod elastic jobs: horovodrun and caf-hvd, {a.runs} runs\n")
        print(f"    {command}\n", flush=True)
        rng = random.Random(GROWTH_SEED)
        for i in range(a.runs):
            # the same random delay for every launcher of a run: where the change falls in
            # the discovery schedule (and in the commit cycle) is not tied to the start-up
            delay = rng.uniform(0, GROWTH_DELAY_S)
            # launchers alternate within each scenario; the order flips every run
            for scenario in ("recovery", "growth"):
                group = [c for c in configs if c[0] == scenario]
                for _, label, launcher, measure in group if i % 2 == 0 else group[::-1]:
                    ms, parts = measure(launcher) if scenario == "recovery" else \
                        measure(launcher, delay)
                    rows.setdefault((scenario, label), []).append((ms, parts))
                    print(f"  run {i + 1}: {scenario} {label}: {ms:.0f} ms ("
                          + ", ".join(f"{k} {fmt(v)}" for k, v in parts.items()) + ")",
                          file=sys.stderr, flush=True)
    finally:
        bench.close()
        kill_marked(**{MARK: TOKEN})
        shutil.rmtree(work, True)

    gloo = f"HOROVOD_GLOO_TIMEOUT_SECONDS={a.gloo_timeout} for the recovery runs, unset " \
        "(30 s) for growth" if a.gloo_timeout else \
        "HOROVOD_GLOO_TIMEOUT_SECONDS unset (Horovod's default: 30 s)"
    print(f"Program: tests/cluster/horovod_programs/elastic_train.py (Horovod 0.28.1, "
          f"TorchState, DistributedOptimizer), TRAIN_COMMIT={COMMIT} (a commit every "
          f"{COMMIT} steps), TRAIN_STEP_MS={STEP_MS}, TRAIN_STEPS={STEPS} (the job is "
          f"stopped after the measurement); {gloo}; 1 slot per host, --min-np 1 --max-np 3. "
          f"horovodrun: --gloo --network-interfaces lo, hosts localhost, 127.0.0.1, "
          f"{socket.gethostname()}; it runs the discovery script every "
          f"{HOROVODRUN_DISCOVERY_S:g} s after the previous call returned (fixed in "
          f"Horovod). caf-hvd: 3 node agents on loopback (mutual TLS), "
          f"--discovery-interval 1"
          + (f" (its default is {default_interval:g} s)" if default_interval is not None
             else "") + ".\n")
    print("recovery: ms from the SIGKILL of rank 2 of 3 (right after rank 0 printed step "
          f"{TRIGGER} or a later step 2 after a commit) to rank 0's first `committed` at size "
          "2. growth: ms from the third host's appearance in the discovery output (0 - "
          f"{GROWTH_DELAY_S:g} s after that step, random, the same delay for both launchers "
          "in a run) to rank 0's first `committed` at size 3.\n")
    heads = [f"run {i + 1}" for i in range(a.runs)]
    print("| scenario | launcher | " + " | ".join(heads) + " | median | min - max |")
    print("|---|---|" + "---|" * len(heads) + "---|---|")
    for (scenario, label), xs in rows.items():
        ms = [x[0] for x in xs]
        print(f"| {scenario} | {label} | " + " | ".join(fmt(x) for x in ms)
              + f" | {fmt(med(ms))} | {fmt(min(ms))} - {fmt(max(ms))} |")
    print(f"\nThe program's imports (torch, horovod.torch) take {fmt(bench.import_ms)} ms "
          "(median of 3 fresh interpreters). Growth's program's share: the newcomer's imports "
          "plus the new size's steps up to its first commit (from rank 0's resume); the "
          "launcher's share is the rest. The survivors' pause: the longest gap between rank "
          "0's consecutive step lines from the host's appearance to the first commit at size "
          "3, less the median gap between steps before it (the program's own pace; step "
          "lines, as the commit that acts on the notice prints nothing). caf-hvd's loss "
          "window: from the release of the grown generation to the last of its ranks "
          "finishing hvd.init()'s rendezvous (its event log).\n")
    print("\nBreakdown (medians; ms after the kill, or after the host appeared):\n")
    for (scenario, label), xs in rows.items():
        parts = {}
        for _, p in xs:
            for k, v in p.items():
                parts.setdefault(k, []).append(v)
        print(f"- {scenario}, {label}: "
              + ", ".join(f"{k} {fmt(med(v))}" for k, v in parts.items())
              + f", first commit at the new size {fmt(med([x[0] for x in xs]))}")
    if len(launchers) == 2:
        print()
        for scenario, label in (("recovery", "caf-hvd"), ("growth", "caf-hvd")) + tuple(
                (s, l) for s, l in rows if l.startswith("caf-hvd, its default")):
            c = med([x[0] for x in rows[(scenario, label)]])
            h = med([x[0] for x in rows[(scenario, "horovodrun")]])
            print(f"- {scenario}: {label} / horovodrun = {c / h:.2f} ({fmt(c)} ms against "
                  f"{fmt(h)} ms, medians)")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        kill_marked(**{MARK: TOKEN})
        sys.exit(130)
