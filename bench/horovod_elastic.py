#!/usr/bin/env python3
"""Real Horovod elastic training under horovodrun's elastic driver and under caf-hvd, on
this machine: recovery after a SIGKILL, growth when a host appears, and (join) a node
agent that joins the cluster while the job runs.

usage: bench/horovod_elastic.py [--runs N] [--build DIR] [--only horovodrun|caf-hvd]
                                [--scenarios recovery,growth,join] [--gloo-timeout S]

The program is tests/cluster/horovod_programs/elastic_train.py (hvd.elastic.run,
TorchState, DistributedOptimizer) with real Horovod 0.28.1 (scripts/setup-horovod.sh),
TRAIN_COMMIT=5 (commit every 5 steps), TRAIN_STEP_MS=100 and more steps than the
measurement needs; the job is stopped once the figure is taken (SIGINT to the launcher,
then SIGKILL to its process group and to every process that carries the run's marker in
its environment: horovodrun's workers run in sessions of their own, caf-hvd's ranks are
children of the node agents; join's agents carry the marker too). Both launchers get the
same discovery script (`cat` of a file this script rewrites atomically; it also logs the
time of each call) and 1 slot per host, except caf-hvd in join, which has no script.

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
  join starts its own agents in every run (the same credentials), so that no table
  remembers an earlier run's hc: `caf-hvd node --name ha --slots 1` holds the cluster's
  table, hb and later hc add `--join 127.0.0.1:PORT_OF_HA`; the job is `caf-hvd driver
  --cluster 127.0.0.1:PORT_OF_HA --cluster-dir D --min-np 1 --max-np 3` with no
  discovery script: the driver asks the table for its live nodes every discovery
  interval (its default, 1 s, is used; the header says which it was).

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
  join: 2 hosts; the same delay after the same step, the third host arrives: caf-hvd
    starts hc's agent (`caf-hvd node --name hc --join ...`; ha and hb joined before the
    driver started), horovodrun gets it in the discovery output as in growth. The time
    from just before that Popen (horovodrun: just before the replace) to rank 0's first
    `step S size 3` line: every rank, the newcomer included, has then done one
    synchronous step at size 3. The goal for caf-hvd is the program's own start (a fresh
    interpreter's `import torch; import horovod.torch as hvd; hvd.init()` as a 1-rank
    job with no launcher, from just before its Popen to its print of time.monotonic(),
    one clock for every process of the machine; median of 3, measured once per bench
    run) plus at most 1.5 s: the table prints the join less that.
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
Join, caf-hvd: when hc's agent printed `listening` and when ha's printed that hc joined
its table (both stamped on arrival), then from the driver's --events log (epoch stamps,
made relative with the wall clock read next to the monotonic one at the Popen): the
first `discovery` that lists hc's endpoint, the newcomer's rank.started and rank.parked
(warm joins: it imported and began hvd.init(), and waits at its plan's lot while the
others train), the generation.released of the grown plan (the survivors were told, and
voted at their next commit); then the newcomer's own `resume` line at size 3 and rank
0's. horovodrun: its first discovery call after the change and the same two `resume`
lines. Runs alternate launcher by launcher (the order flips every run); growth and join
share each run's delay."""

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

    def _keep(self, e):
        self.log.append(e)
        if e[2] is None:
            self.ended += 1

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
            self._keep(e)
            if e[2] is not None:
                return e

    def wait_line(self, pattern, timeout):
        """The stamp of the next line that matches `pattern` (a regex)."""
        deadline = time.monotonic() + timeout
        while True:
            e = self.next(deadline)
            if e is None:
                code = self.p.poll()
                raise RuntimeError(f"no line matching {pattern!r} from {' '.join(self.argv[:4])}"
                                   f" within {timeout} s"
                                   f"{'' if code is None else f' (exited {code})'}:\n"
                                   f"{self.tail()}")
            if re.search(pattern, e[2]):
                return e[0]

    def lines(self):
        """Every line so far, (t, stream, line), also those next() has not returned yet
        (their stamps are from their arrival, not from this call)."""
        while True:
            try:
                self._keep(self.q.get_nowait())
            except queue.Empty:
                break
        return [e for e in self.log if e[2] is not None]

    def first(self, pattern, since):
        """The stamp of the first line at or after `since` that matches `pattern`, or None."""
        return next((t for t, _, line in self.lines() if t >= since and re.search(pattern, line)),
                    None)

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
        self.lines()  # keep what arrived during the stop, for error messages
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

    def wait_step_at(self, size):
        """Until rank 0's first `step S size <size>` (every rank, a newcomer too, has then
        done one synchronous step at that size); returns (t_step, t of rank 0's resume line
        at that size or None)."""
        seen = {}

        def pred(t, kind, m):
            if kind == "resume" and int(m.group(2)) == size:
                seen.setdefault("resume", t)
            elif kind == "step" and int(m.group(2)) == size:
                return t
        t = self.wait(f"step at size {size}", pred, EVENT_TIMEOUT)
        return t, seen.get("resume")

    def resumed_on(self, host, size, since):
        """The stamp of the first `resume: ... of <size> on <host>` line at or after `since`
        (any rank: the newcomer's own line, after its hvd.init()), or None."""
        for t, _, line in self.l.lines():
            m = LINE.search(line)
            r = RESUME.match(m.group(3)) if m and m.group(2) == "stdout" else None
            if r and t >= since and int(r.group(2)) == size and r.group(3) == host:
                return t
        return None


class Bench:
    def __init__(self, site, work, gloo_timeout=None):
        self.site = site
        self.work = work
        self.gloo_timeout = gloo_timeout
        self.hosts_file = os.path.join(work, "hosts")
        self.calls_file = os.path.join(work, "calls")
        self.events_file = os.path.join(work, "events.jsonl")
        self.import_ms = None
        self.init_ms = None
        self.script = os.path.join(work, "discover.sh")
        with open(self.script, "w") as f:
            f.write(f"#!/bin/sh\ndate +%s.%N >> {self.calls_file}\ncat {self.hosts_file}\n")
        os.chmod(self.script, 0o700)
        # horovodrun: three names of this machine
        self.hvd_hosts = ["localhost", "127.0.0.1", socket.gethostname()]
        if len(set(self.hvd_hosts)) != 3:
            raise RuntimeError(f"need three distinct local host names, have {self.hvd_hosts}")
        self.cluster = None
        self.cluster_dir = None
        self.caf_ports = None

    def start_agents(self, names=("ha", "hb", "hc")):
        """The discovery-script scenarios' agents (each holds a table of its own, none
        joins another); also the throw-away cluster every caf-hvd process here uses."""
        from harness import Cluster  # creates the throw-away cluster (needs the binary)
        self.cluster = Cluster()
        self.cluster_dir = os.environ["CAF_HVD_CLUSTER_DIR"]
        self.caf_ports = [self.cluster.node(n) for n in names]

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

    def caf_argv(self, run_token, interval, gloo_timeout, cold=False, cluster=None):
        """The driver's command: hosts from the discovery script, or with `cluster`
        (HOST:PORT of the agent that holds the table) the cluster's live nodes."""
        caf = os.environ["CAF_HVD"]
        hosts = ["--cluster", cluster, "--cluster-dir", self.cluster_dir] if cluster else \
            ["--host-discovery-script", self.script]
        argv = [caf, "driver", *hosts, "--min-np", "1", "--max-np", "3",
                "--events", self.events_file]
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

    def launch(self, launcher, np, interval=1, gloo_timeout=None, cold=False, cluster=None,
               token=None):
        token = token or uuid.uuid4().hex
        if launcher == "horovodrun":
            argv, failure = self.horovodrun_argv(np), HVD_FAILURE
        else:
            argv, failure = self.caf_argv(token, interval, gloo_timeout, cold, cluster), \
                CAF_FAILURE
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

    def join(self, launcher, delay):
        """ms from the third host's arrival `delay` s after the trigger step (caf-hvd: just
        before its agent's Popen with --join; horovodrun: just before the discovery file's
        replace) to rank 0's first step at size 3, and the breakdown (ms after the arrival)."""
        if launcher == "caf-hvd":
            return self.join_cluster(delay)
        self.set_hosts(self.host_lines(launcher, 2))
        job = self.launch(launcher, 2)
        try:
            job.wait_trigger(2)
            time.sleep(delay)
            t_add, wall_add = time.monotonic(), time.time()
            self.set_hosts(self.host_lines(launcher, 3))
            t, resumed = job.wait_step_at(3)
            after = [c for c in self.discovery_calls() if c >= wall_add]
            ms = lambda x: None if x is None else (x - t_add) * 1000  # noqa: E731
            return ms(t), {
                "discovery script ran": (after[0] - wall_add) * 1000 if after else None,
                "newcomer resumed": ms(job.resumed_on(self.hvd_hosts[2], 3, t_add)),
                "rank 0 resumed at 3": ms(resumed),
                "(period of discovery calls)": self.discovery_period()}
        finally:
            job.l.stop()

    def member(self, name, token, join=None):
        """A node agent of the join scenario's cluster: loopback, 1 slot, the bench's
        cluster directory (mutual TLS); with `join`, the port of the agent that holds the
        table. A Launch, so its lines are stamped on arrival; RUN_MARK=token, so the job's
        stop takes it (and the ranks it started) down too. Returns (launch, port)."""
        from harness import free_port
        port = free_port()
        argv = [os.environ["CAF_HVD"], "node", "--name", name, "--port", str(port),
                "--bind", "127.0.0.1", "--slots", "1", "--cluster-dir", self.cluster_dir]
        if join is not None:
            argv += ["--join", f"127.0.0.1:{join}"]
        return Launch(argv, {**os.environ, RUN_MARK: token}), port

    def join_cluster(self, delay):
        """caf-hvd's join: agents ha (holds the cluster's table) and hb (joined to it), a
        driver with --cluster and no discovery script; `delay` s after the trigger step,
        agent hc starts with --join. Fresh agents every run, so no table remembers an
        earlier hc."""
        token = uuid.uuid4().hex
        agents, job = [], None
        try:
            holder, p0 = self.member("ha", token)
            agents.append(holder)
            holder.wait_line(r"listening", START_TIMEOUT)
            agents.append(self.member("hb", token, join=p0)[0])
            agents[-1].wait_line(r"joined the cluster", START_TIMEOUT)
            # the driver's default --discovery-interval: it asks the table that often
            job = self.launch("caf-hvd", 2, interval=None, cluster=f"127.0.0.1:{p0}",
                              token=token)
            job.wait_trigger(2)
            time.sleep(delay)
            t_join, wall_join = time.monotonic(), time.time()
            newcomer, port = self.member("hc", token, join=p0)
            agents.append(newcomer)
            t, resumed = job.wait_step_at(3)
            ms = lambda x: None if x is None else (x - t_join) * 1000  # noqa: E731
            # the event log's stamps are seconds since the epoch
            wall = lambda x: None if x is None else (x - wall_join) * 1000  # noqa: E731
            ev = self.join_events("hc", port, wall_join)
            return ms(t), {
                "agent listening": ms(newcomer.first(r"listening", t_join)),
                "table has it": ms(holder.first(r"node 'hc' joined", t_join)),
                "discovery listed it": wall(ev.get("discovery")),
                "newcomer started": wall(ev.get("rank.started")),
                "newcomer at its lot": wall(ev.get("rank.parked")),
                "generation released": wall(ev.get("generation.released")),
                "newcomer resumed": ms(job.resumed_on("hc", 3, t_join)),
                "rank 0 resumed at 3": ms(resumed)}
        finally:
            if job:
                job.l.stop()
            for a in agents:
                a.stop()

    def join_events(self, name, port, since):
        """From the driver's event log, the epoch stamps of the join of node `name` (at
        127.0.0.1:port) after `since`: the first `discovery` that lists it, the
        generation.begin that added it, its rank's rank.started and rank.parked (warm
        joins: the newcomer waits at its plan's lot, imports and hvd.init()'s first
        connect done), and the first generation.released of that generation or a later one
        (a plan replaced before its release releases a later number)."""
        import json
        try:
            with open(self.events_file) as f:
                log = [json.loads(x) for x in f if x.strip()]
        except (OSError, ValueError):
            return {}
        log = [e for e in log if e["timestamp"] >= since]
        out = {}

        def first(name_, pred):
            return next((e for e in log if e["name"] == name_ and pred(e["context"])), None)
        e = first("discovery", lambda c: any(h.endswith(f":{port}") or h == name
                                             for h in c.get("hosts", [])))
        if e:
            out["discovery"] = e["timestamp"]
        begin = first("generation.begin", lambda c: name in c.get("added", []))
        if not begin:
            return out
        g = begin["context"]["generation"]
        started = first("rank.started", lambda c: c["host"] == name and c["generation"] >= g)
        if started:
            out["rank.started"] = started["timestamp"]
            slot = started["context"]["slot"]
            parked = first("rank.parked", lambda c: c["slot"] == slot)
            if parked:
                out["rank.parked"] = parked["timestamp"]
        released = first("generation.released", lambda c: c["generation"] >= g)
        if released:
            out["generation.released"] = released["timestamp"]
        return out

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

    def measure_init(self, runs=3):
        """ms from just before a fresh interpreter's Popen to its hvd.init() returning
        (median of `runs`): `import torch; import horovod.torch as hvd; hvd.init()` as a
        1-rank job with no launcher (no HOROVOD_* variables: Horovod then runs alone).
        The program's own part of a join, which no launcher can take away. The interpreter
        prints time.monotonic(), one clock for every process of the machine."""
        code = "import time, torch, horovod.torch as hvd; hvd.init(); print(time.monotonic())"
        env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
        env["PYTHONPATH"] = self.site
        xs = []
        for _ in range(runs):
            t0 = time.monotonic()
            r = subprocess.run([PYTHON, "-c", code], check=True, capture_output=True,
                               text=True, env=env)
            xs.append((float(r.stdout.split()[-1]) - t0) * 1000)
        self.init_ms = statistics.median(xs)
        return self.init_ms

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


SCENARIOS = ("recovery", "growth", "join")


def scenario_list(spec):
    """argparse type of --scenarios: a comma-separated subset of SCENARIOS, in their order."""
    names = [x.strip() for x in spec.split(",") if x.strip()]
    bad = [x for x in names if x not in SCENARIOS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"'{spec}': give some of {','.join(SCENARIOS)}")
    return [x for x in SCENARIOS if x in names]


def main():  # noqa: C901
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"),
                    help="caf-hvd's build directory (default: build/)")
    ap.add_argument("--only", choices=("horovodrun", "caf-hvd"),
                    help="measure one launcher only")
    ap.add_argument("--scenarios", type=scenario_list, default=list(SCENARIOS),
                    metavar="LIST", help="comma-separated, of recovery, growth, join "
                                         "(default: all three)")
    ap.add_argument("--gloo-timeout", type=int, default=None, metavar="S",
                    help="HOROVOD_GLOO_TIMEOUT_SECONDS for the ranks of the recovery runs "
                         "(default: unset, Horovod's 30 s; growth and join always run with "
                         "the default: under horovodrun the old ranks wait that long in "
                         "Gloo's rendezvous for the new process to start)")
    a = ap.parse_args()
    launchers = [a.only] if a.only else ["horovodrun", "caf-hvd"]
    scenarios = a.scenarios
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
    measures = {"recovery": bench.recovery, "growth": bench.growth, "join": bench.join}
    # (scenario, label, launcher, measure) in the order of the table
    configs = [(scenario, launcher, launcher, measures[scenario])
               for scenario in scenarios for launcher in launchers]
    rows = {}  # (scenario, label) -> [(ms, breakdown)]
    try:
        if "caf-hvd" in launchers:
            # the discovery-script scenarios' agents (join starts its own cluster of agents
            # in every run); the throw-away cluster's credentials serve both
            bench.start_agents(() if scenarios == ["join"] else ("ha", "hb", "hc"))
            default_interval = caf_default_interval()
            if "growth" in scenarios:
                configs.append(("growth", "caf-hvd --cold-joins", "caf-hvd",
                                lambda l, d: bench.growth(l, d, cold=True)))
                if default_interval is not None and default_interval != 1:
                    configs.append(("growth", f"caf-hvd, its default --discovery-interval "
                                    f"{default_interval:g}", "caf-hvd",
                                    lambda l, d: bench.growth(l, d, interval=None)))
        if "growth" in scenarios:
            bench.measure_import()
        if "join" in scenarios:
            bench.measure_init()
        print(f"## Real Horovod elastic jobs: horovodrun and caf-hvd, {a.runs} runs\n")
        print(f"    {command}\n", flush=True)
        rng = random.Random(GROWTH_SEED)
        for i in range(a.runs):
            # the same random delay for every launcher of a run (and for growth and join):
            # where the change falls in the discovery schedule (and in the commit cycle) is
            # not tied to the start-up
            delay = rng.uniform(0, GROWTH_DELAY_S)
            # launchers alternate within each scenario; the order flips every run
            for scenario in scenarios:
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
        "(30 s) for growth and join" if a.gloo_timeout else \
        "HOROVOD_GLOO_TIMEOUT_SECONDS unset (Horovod's default: 30 s)"
    default = f" (its default is {default_interval:g} s)" if default_interval is not None \
        else ""
    caf = []
    scripted = " and ".join(s for s in scenarios if s != "join")
    if scripted:
        caf.append(f"caf-hvd ({scripted}): 3 node agents on loopback (mutual TLS), each "
                   f"holding a table of its own, the discovery script, --discovery-interval "
                   f"1{default}")
    if "join" in scenarios:
        caf.append(f"caf-hvd (join): node agents on loopback (mutual TLS) in one cluster (ha "
                   f"holds its table, hb and then hc started with --join), --cluster and no "
                   f"discovery script, the default --discovery-interval"
                   f"{f' ({default_interval:g} s)' if default_interval is not None else ''}")
    print(f"Program: tests/cluster/horovod_programs/elastic_train.py (Horovod 0.28.1, "
          f"TorchState, DistributedOptimizer), TRAIN_COMMIT={COMMIT} (a commit every "
          f"{COMMIT} steps), TRAIN_STEP_MS={STEP_MS}, TRAIN_STEPS={STEPS} (the job is "
          f"stopped after the measurement); {gloo}; 1 slot per host, --min-np 1 --max-np 3. "
          f"horovodrun: --gloo --network-interfaces lo, hosts localhost, 127.0.0.1, "
          f"{socket.gethostname()}; it runs the discovery script every "
          f"{HOROVODRUN_DISCOVERY_S:g} s after the previous call returned (fixed in "
          f"Horovod). " + "; ".join(caf) + ".\n")
    what = {
        "recovery": "recovery: ms from the SIGKILL of rank 2 of 3 (right after rank 0 printed "
                    f"step {TRIGGER} or a later step 2 after a commit) to rank 0's first "
                    "`committed` at size 2.",
        "growth": "growth: ms from the third host's appearance in the discovery output (0 - "
                  f"{GROWTH_DELAY_S:g} s after that step, random, the same delay for both "
                  "launchers in a run) to rank 0's first `committed` at size 3.",
        "join": "join: ms from the third host's arrival (the same delay after that step; "
                "caf-hvd: just before the Popen of its agent with --join; horovodrun: just "
                "before the replace that adds it to the discovery output) to rank 0's first "
                "`step S size 3` (every rank, the newcomer too, did one synchronous step)."}
    print(" ".join(what[s] for s in scenarios) + "\n")
    heads = [f"run {i + 1}" for i in range(a.runs)]
    print("| scenario | launcher | " + " | ".join(heads) + " | median | min - max |")
    print("|---|---|" + "---|" * len(heads) + "---|---|")
    for (scenario, label), xs in rows.items():
        ms = [x[0] for x in xs]
        print(f"| {scenario} | {label} | " + " | ".join(fmt(x) for x in ms)
              + f" | {fmt(med(ms))} | {fmt(min(ms))} - {fmt(max(ms))} |")
    if "growth" in scenarios:
        print(f"\nThe program's imports (torch, horovod.torch) take {fmt(bench.import_ms)} ms "
              "(median of 3 fresh interpreters). Growth's program's share: the newcomer's "
              "imports plus the new size's steps up to its first commit (from rank 0's "
              "resume); the launcher's share is the rest. The survivors' pause: the longest "
              "gap between rank 0's consecutive step lines from the host's appearance to the "
              "first commit at size 3, less the median gap between steps before it (the "
              "program's own pace; step lines, as the commit that acts on the notice prints "
              "nothing). caf-hvd's loss window: from the release of the grown generation to "
              "the last of its ranks finishing hvd.init()'s rendezvous (its event log).")
    if "join" in scenarios:
        print(f"\nThe program's own start (a fresh {PYTHON}: import torch, import "
              f"horovod.torch, hvd.init() as a 1-rank job with no launcher, from just before "
              f"its Popen) takes {fmt(bench.init_ms)} ms (median of 3).")
        for launcher in launchers:
            j = med([x[0] for x in rows.get(("join", launcher), [])])
            if j is not None:
                print(f"- join, {launcher}: {fmt(j)} ms less that = {fmt(j - bench.init_ms)} "
                      f"ms, the launcher's part"
                      + (" (goal: at most 1500 ms)" if launcher == "caf-hvd" else ""))
        print("Join's breakdown, caf-hvd: the newcomer's agent printed `listening`, the "
              "holder's agent printed that hc joined its table, then from the driver's event "
              "log: the first `discovery` listing hc, its rank's rank.started and rank.parked "
              "(warm joins: it waits at its plan's lot, its imports and hvd.init()'s first "
              "connect done), the grown generation's release (the survivors re-joined at a "
              "commit after they were told); then the newcomer's and rank 0's `resume` lines "
              "at size 3. horovodrun: its first discovery call after the change, and the same "
              "two `resume` lines.")
    print("\nBreakdown (medians; ms after the kill, or after the host appeared):\n")
    for (scenario, label), xs in rows.items():
        parts = {}
        for _, p in xs:
            for k, v in p.items():
                parts.setdefault(k, []).append(v)
        last = "first step" if scenario == "join" else "first commit"
        print(f"- {scenario}, {label}: "
              + ", ".join(f"{k} {fmt(med(v))}" for k, v in parts.items())
              + f", {last} at the new size {fmt(med([x[0] for x in xs]))}")
    if len(launchers) == 2:
        print()
        for scenario, label in [(s, l) for s, l in rows if l.startswith("caf-hvd")
                                and l != "caf-hvd --cold-joins"]:
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
