"""Elastic jobs with real Horovod workers (built from the vendored tarball by
scripts/setup-horovod.sh, cached outside the checkout) and the same scenarios with
caf-hvd-allreduce --elastic, which speaks the same protocol: real node agents on loopback
(each its own host), a real driver with a discovery script whose output the test
rewrites. Each scenario asserts the size the job reaches, that no generation resumes
below the last step committed before it, that the replicas end equal, and the exit code.
Run by `meson test`; prints a closing 'N passed, N failed' line."""

import base64
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import (Cluster, pid_with_env, raw_http, read_line, rendezvous_of,  # noqa: E402
                     wait_until)

ROOT = os.environ.get("CAF_HVD_SOURCE_ROOT", os.path.dirname(os.path.dirname(HERE)))
ALLREDUCE = os.environ.get("CAF_HVD_ALLREDUCE", "caf-hvd-allreduce")
TRAIN = os.path.join(HERE, "horovod_programs", "elastic_train.py")
LINE = re.compile(r"^\[(\d+)\]<stdout>:(.*)$")


def horovod_site():
    """Builds (or finds in the cache) real Horovod; a failed build fails the suite."""
    r = subprocess.run([os.path.join(ROOT, "scripts", "setup-horovod.sh")],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"building real Horovod failed (scripts/setup-horovod.sh exit "
                           f"{r.returncode}):\n{r.stderr[-4000:]}")
    return r.stdout.strip().splitlines()[-1]


SITE = None


def stdout_bodies(text):
    """What the ranks printed on stdout, line by line, without the launcher's tags."""
    for line in text.splitlines():
        m = LINE.match(line)
        if m:
            yield m.group(2)


class Horovod:
    """Real Horovod: hvd.elastic.run, TorchState, commit every 5 steps."""
    name = "horovod"
    step_ms = 200

    def command(self, steps):
        return ["/usr/bin/python3", TRAIN]

    def env(self, steps, extra=None):
        e = {"PYTHONPATH": SITE, "TRAIN_STEPS": str(steps), "TRAIN_COMMIT": "5",
             "TRAIN_STEP_MS": str(self.step_ms)}
        e.update(extra or {})
        return e

    def pattern(self):
        return "/usr/bin/python3 " + TRAIN

    def parse(self, text):
        """-> (events in output order: ("resume", size, step, host) of rank 0, ("commit",
        step), ("step", step, size); done lines (rank, size, step, verdict))"""
        events, done = [], []
        for body in stdout_bodies(text):
            r = re.match(r"resume: rank (\d+) of (\d+) on (\S+) at step (\d+)$", body)
            if r and r.group(1) == "0":
                events.append(("resume", int(r.group(2)), int(r.group(4)), r.group(3)))
            c = re.match(r"committed (\d+)$", body)
            if c:
                events.append(("commit", int(c.group(1))))
            s = re.match(r"step (\d+) size (\d+)$", body)
            if s:
                events.append(("step", int(s.group(1)), int(s.group(2))))
            d = re.match(r"done: rank (\d+) of (\d+) at step (\d+) params (\S+) (.*)$", body)
            if d:
                done.append((int(d.group(1)), int(d.group(2)), int(d.group(3)), d.group(5)))
        return events, done


class Allreduce:
    """caf-hvd-allreduce --elastic: commits after every step, checks its checksum."""
    name = "allreduce"
    step_ms = 100

    def command(self, steps):
        return [ALLREDUCE, "--elastic", "--steps", str(steps), "--step-ms", str(self.step_ms)]

    def env(self, steps, extra=None):
        return dict(extra or {})

    def pattern(self):
        return ALLREDUCE

    def parse(self, text):
        events, done = [], []
        for body in stdout_bodies(text):
            r = re.match(r"generation \d+: rank 0 of (\d+) on (\S+) resumes at step (\d+)", body)
            if r:
                events.append(("resume", int(r.group(1)), int(r.group(3)), r.group(2)))
            s = re.match(r"step (\d+) size (\d+) sum (\d+)", body)
            if s:
                if s.group(2) != s.group(3):
                    raise AssertionError(f"allreduce sum {s.group(3)} at size {s.group(2)}")
                events.append(("step", int(s.group(1)), int(s.group(2))))
                events.append(("commit", int(s.group(1))))
            d = re.match(r"caf-hvd-allreduce: elastic run done: (\d+) steps, checksum (\d+)", body)
            if d:
                steps = int(d.group(1))
                ok = int(d.group(2)) == steps * (steps + 1) // 2
                done.append((0, None, steps, "equal" if ok else "checksum wrong"))
        return events, done


def committed_at_size(size):
    """A commit of rank 0 after it resumed at `size`."""
    def pred(events):
        at = [i for i, e in enumerate(events) if e[0] == "resume" and e[1] == size]
        return bool(at) and any(e[0] == "commit" for e in events[at[0]:])
    return pred


def read_events(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def timeline_since(events, text, t0):
    """What happened after wall-clock time t0, for a failure message: each job event at its
    offset in seconds, and the ranks' lines about the failure (caf-hvd-allreduce prints
    "a peer failed (<Gloo's error>)", the Horovod program "resume: ..." at each start), so
    a slow recovery says whether the survivors noticed late (a Gloo timeout in the error),
    the plan formed or was released late, or the new rendezvous waited."""
    rows = [f"  +{e['timestamp'] - t0:7.3f} s  {e['name']} {json.dumps(e.get('context'))[:160]}"
            for e in events if e["timestamp"] >= t0 - 0.05]
    said = [line for line in text.splitlines()
            if any(w in line for w in ("peer failed", "re-join", "resume:"))]
    return "\n".join(["job events since the kill:", *rows, "the ranks said:",
                      *(f"  {line[:300]}" for line in said[-8:])])


class Scenarios:
    """The scenarios, for one program (a subclass sets `program`)."""
    program = None

    def setUp(self):
        self.c = Cluster()
        self.addCleanup(self.c.close)
        self.dir = tempfile.mkdtemp(prefix="caf-hvd-hvd-elastic-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.hosts_file = os.path.join(self.dir, "hosts")
        self.script = os.path.join(self.dir, "discover.sh")
        with open(self.script, "w") as f:
            f.write(f"#!/bin/sh\ncat {self.hosts_file}\n")
        os.chmod(self.script, stat.S_IRWXU)
        self.events = os.path.join(self.dir, "events.jsonl")
        self.token = f"{os.getpid()}-{time.monotonic_ns()}"
        self.addCleanup(self.no_rank_left)

    def ours(self, **env):
        """A pid of this test's ranks (with `env` in its environment), or None."""
        return pid_with_env(self.program.pattern(), prefix=True, CAF_HVD_TEST_TOKEN=self.token,
                            **env)

    def no_rank_left(self):
        self.c.close()
        wait_until(lambda: self.ours() is None, 15, "every rank to be gone")

    def set_hosts(self, *hosts):
        tmp = self.hosts_file + ".tmp"
        with open(tmp, "w") as f:
            for name, slots in hosts:
                f.write(f"127.0.0.1:{self.c.nodes[name][1]}:{slots}\n")
        os.replace(tmp, self.hosts_file)

    def start(self, steps, *flags, env=None):
        args = ["driver", "--host-discovery-script", self.script, "--discovery-interval",
                "0.2", "--events", self.events, "--min-np", "1", "--max-np", "8",
                "--kill-grace-seconds", "2"]
        for k, v in {**self.program.env(steps, env), "CAF_HVD_TEST_TOKEN": self.token}.items():
            args += ["--env", f"{k}={v}"]
        args += list(flags) + ["--"] + self.program.command(steps)
        self.t0 = time.monotonic()
        self.driver = self.c.start(args)
        self.lines = []
        return self.driver

    def read_until(self, pred, timeout, what):
        """Reads the driver's stdout until pred(events) holds, never past that line
        (read_line): finish()'s communicate() gets every line after it."""
        deadline = time.monotonic() + timeout
        while True:
            line = read_line(self.driver.stdout.fileno(), deadline)
            if line:
                self.lines.append(line)
            if not line.endswith("\n"):
                break
            events, _ = self.program.parse("".join(self.lines))
            if pred(events):
                return events
        ended = time.monotonic() < deadline
        self.driver.kill()
        out, err = self.driver.communicate()
        raise AssertionError(f"no {what} within {timeout}s (the job {'ended' if ended else 'runs'}):"
                             f"\n{''.join(self.lines)[-3000:]}{out[-2000:]}\n{err[-3000:]}")

    def finish(self, timeout=150):
        try:
            out, err = self.driver.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.driver.kill()
            out, err = self.driver.communicate()
            raise AssertionError(f"driver did not finish in {timeout}s:\n{err[-4000:]}")
        text = "".join(self.lines) + out
        return self.driver.returncode, text, err

    def committed(self, n):
        return lambda ev: any(e[0] == "commit" and e[1] >= n for e in ev)

    def check(self, text, err, steps, final_size, rc=0, rc_got=None):
        """Size reached, monotonic resumes, equal replicas, every step's allreduce."""
        events, done = self.program.parse(text)
        self.assertEqual(rc_got, rc, err[-4000:])
        last_commit = 0
        for e in events:
            if e[0] == "commit":
                last_commit = max(last_commit, e[1])
            elif e[0] == "resume":
                self.assertGreaterEqual(e[2], last_commit,
                                        f"a generation of size {e[1]} resumed at step {e[2]} "
                                        f"after step {last_commit} was committed:\n"
                                        f"{text[-3000:]}")
        self.assertTrue(done, f"no rank finished:\n{text[-3000:]}\n{err[-3000:]}")
        for rank, size, step, verdict in done:
            self.assertEqual(step, steps, f"rank {rank} ended at step {step}")
            self.assertEqual(verdict, "equal", f"rank {rank}: {verdict}")
            if size is not None:
                self.assertEqual(size, final_size, f"rank {rank} ended at size {size}")
        if isinstance(self.program, Horovod):
            self.assertEqual(sorted(d[0] for d in done), list(range(final_size)),
                             f"every rank of the final size reports: {done}")
        sizes = [e[1] for e in events if e[0] == "resume"]
        self.assertEqual(sizes[-1], final_size, f"resumes at sizes {sizes}")
        return events, sizes

    def train_until_commit(self, steps, hosts, *flags, agents=("ha", "hb", "hc"), commit=10,
                           env=None, slots=None):
        """Agents for `agents` (with `--slots slots` when given), a job on `hosts` (one slot
        each) until step `commit`."""
        for n in agents:
            self.c.node(n, slots=slots)
        self.set_hosts(*((h, 1) for h in hosts))
        self.start(steps, *flags, env=env)
        self.read_until(self.committed(commit), 90, f"step {commit}'s commit")

    def rank_pid(self, host):
        """The pid of this test's rank on `host`, waiting for it: the program starts a moment
        after the job's rank.started event (the launcher's shim starts it), so a test that
        acts on that event looked too early once in a suite run."""
        pid = None

        def found():
            nonlocal pid
            pid = self.ours(HOROVOD_HOSTNAME=host)
            return pid is not None
        wait_until(found, 10, f"a rank of this test on host {host}")
        return pid

    # -- scenarios ----------------------------------------------------------------------

    def test_host_added_grows_at_its_next_commit(self):
        steps = 50
        self.train_until_commit(steps, ("ha", "hb"))
        self.set_hosts(("ha", 1), ("hb", 1), ("hc", 1))
        rc, text, err = self.finish()
        events, sizes = self.check(text, err, steps, 3, rc_got=rc)
        self.assertEqual(sizes, [2, 3], text[-3000:])
        self.assertIn("generation 2: 3 ranks on ha:1,hb:1,hc:1 (added hc)", err)
        self.assertNotIn("blacklisted", err)

    def test_host_removed_from_discovery_shrinks(self):
        steps = 50
        self.train_until_commit(steps, ("ha", "hb", "hc"))
        hc = self.rank_pid("hc")
        self.set_hosts(("ha", 1), ("hb", 1))
        rc, text, err = self.finish()
        events, sizes = self.check(text, err, steps, 2, rc_got=rc)
        self.assertEqual(sizes, [3, 2], text[-3000:])
        self.assertIn("(removed hc)", err)
        self.assertNotIn("blacklisted", err)
        self.assertFalse(os.path.exists(f"/proc/{hc}"), "the removed host's rank still runs")

    def test_worker_killed(self):
        """The survivors fail at once, not at Gloo's timeout (HOROVOD_GLOO_TIMEOUT_SECONDS,
        30 s by default): their agents shut down the broken generation's Gloo connections."""
        steps = 50
        self.train_until_commit(steps, ("ha", "hb", "hc"))
        killed, killed_at = time.monotonic(), time.time()
        os.kill(self.rank_pid("hb"), signal.SIGKILL)
        self.read_until(committed_at_size(2), 90, "a commit at size 2")
        recovery = time.monotonic() - killed
        rc, text, err = self.finish()
        events, sizes = self.check(text, err, steps, 2, rc_got=rc)
        self.assertEqual(sizes, [3, 2], text[-3000:])
        self.assertIn("host hb is blacklisted", err)
        job_events = read_events(self.events)
        aborts = [e["context"] for e in job_events if e["name"] == "gloo.abort"]
        self.assertLess(recovery, 10, f"rank 0's first commit at size 2 came {recovery:.1f} s "
                                      f"after the kill (Gloo aborts: {aborts}):\n{err[-3000:]}\n"
                                      f"{timeline_since(job_events, text, killed_at)}")
        if isinstance(self.program, Horovod):
            self.assertTrue(aborts and sum(a["cut"] for a in aborts) > 0, aborts)
            self.assertTrue(all(a["problem"] is None for a in aborts), aborts)

    def test_node_agent_killed(self):
        steps = 50
        self.train_until_commit(steps, ("ha", "hb", "hc"))
        os.killpg(self.c.nodes["hb"][0].pid, signal.SIGKILL)
        rc, text, err = self.finish()
        events, sizes = self.check(text, err, steps, 2, rc_got=rc)
        self.assertEqual(sizes, [3, 2], text[-3000:])
        self.assertRegex(err, r"node agent hb \(127\.0\.0\.1:\d+\) was lost")

    def test_host_added_and_another_killed_in_one_window(self):
        """Scenario 2 of the issue: hc appears, hb's agent dies moments later. The job
        ends on ha and hc; hc, which did nothing wrong, is never blacklisted."""
        steps = 60
        self.train_until_commit(steps, ("ha", "hb"))
        self.set_hosts(("ha", 1), ("hb", 1), ("hc", 1))
        hc = f"127.0.0.1:{self.c.nodes['hc'][1]}"

        def hc_discovered():
            with open(self.events) as f:
                return any(e["name"] == "discovery" and hc in e["context"]["hosts"]
                           for e in map(json.loads, filter(str.strip, f)))
        wait_until(hc_discovered, 30, "the driver's discovery of hc")
        os.killpg(self.c.nodes["hb"][0].pid, signal.SIGKILL)
        rc, text, err = self.finish()
        events, sizes = self.check(text, err, steps, 2, rc_got=rc)
        self.assertNotIn("host hc is blacklisted", err)
        resumed_on = [e[3] for e in events if e[0] == "resume"]
        self.assertEqual(resumed_on[-1], "ha", text[-3000:])


class HorovodElastic(Scenarios, unittest.TestCase):
    program = Horovod()

    def test_unreachable_notification_service_does_not_hang_the_job(self):
        """Rank 0's notification service is gone: the driver says it could not tell rank 0,
        the job trains on at its size and ends; the added host's newcomer, which waited at
        its first rendezvous for a release that never came, is stopped at the end."""
        steps = 40
        self.train_until_commit(steps, ("ha",), agents=("ha", "hb"), commit=5,
                                env={"TRAIN_NO_NOTIFY": "1"})
        self.set_hosts(("ha", 1), ("hb", 1))
        rc, text, err = self.finish()
        events, sizes = self.check(text, err, steps, 1, rc_got=rc)
        self.assertEqual(sizes, [1])
        self.assertRegex(err, r"warning: could not tell rank 0 \(ha:0\) of the host change of "
                              r"generation 2: lo 127\.0\.0\.1:\d+: connection refused")
        self.assertIn("processes    2 (1 x code 137, 1 x exit 0); 2 generations", err)
        self.assertFalse(self.events_named("generation.released", generation=2))
        self.assertIsNone(self.ours(HOROVOD_HOSTNAME="hb"))

    def wait_for_event(self, name, timeout, **context):
        """Waits until the job's event log has `name` with `context` among its fields."""
        def seen():
            try:
                events = read_events(self.events)
            except (OSError, ValueError):
                return False
            return any(e["name"] == name and all(e["context"].get(k) == v
                                                  for k, v in context.items())
                       for e in events)
        wait_until(seen, timeout, f"event {name} {context}")

    def test_notice_that_reaches_rank_0_inside_reset_is_sent_again(self):
        """Horovod's run_fn (horovod/common/elastic.py) calls state.on_reset() after
        reset(), and on_reset replaces the notification queue (`self._host_messages =
        queue.Queue()`): a HostsUpdatedRequest that reaches rank 0 while it is inside
        reset() -- here waiting in hvd.init() for a newcomer with a slow start -- is
        acknowledged and dropped. hd is added right when generation 2 (hc added) is
        released; sent once, its notice is lost, the ranks never re-join, and at
        --elastic-timeout healthy hosts are blacklisted. Sent again until rank 0 acts on
        it, the job grows to 4 without blaming anyone."""
        steps = 100
        self.train_until_commit(steps, ("ha", "hb"), "--elastic-timeout", "40",
                                agents=("ha", "hb", "hc", "hd"), commit=10,
                                env={"TRAIN_START_DELAY": "hc:6"})
        self.set_hosts(("ha", 1), ("hb", 1), ("hc", 1))
        self.wait_for_event("generation.released", 60, generation=2)
        self.set_hosts(("ha", 1), ("hb", 1), ("hc", 1), ("hd", 1))
        rc, text, err = self.finish()
        events, sizes = self.check(text, err, steps, 4, rc_got=rc)
        self.assertEqual(sizes[-1], 4, text[-3000:])
        self.assertNotIn("blacklisted", err)
        self.assertNotIn("did not join", err)

    def test_rank_0_host_removed_loses_no_step(self):
        """Removing rank 0's host: Horovod notifies the current rank 0
        (horovod/runner/elastic/driver.py _notify_workers_host_changes, the coordinator's
        slot), every rank raises HostsUpdatedInterrupt at the same commit, after save()
        (State.commit), and the removed host's rank is answered -1 in rank_and_size. So no
        step is ever done twice: rank 0's step lines rise strictly from first to last.
        (caf-hvd sent no notice, and stopped rank 0 mid-step after the kill grace; the
        others rolled back to their last commit and repeated the steps since.)"""
        steps = 60
        # commits 3 s apart: the kill grace (2 s here) ends between two of them
        self.train_until_commit(steps, ("ha", "hb", "hc"), commit=15,
                                env={"TRAIN_COMMIT": "15"})
        self.set_hosts(("hb", 1), ("hc", 1))
        rc, text, err = self.finish()
        events, sizes = self.check(text, err, steps, 2, rc_got=rc)
        self.assertEqual(sizes, [3, 2], text[-3000:])
        self.assertIn("generation 2: 2 ranks on hb:1,hc:1 (removed ha)", err)
        self.assertNotIn("blacklisted", err)
        stepped = [e[1] for e in events if e[0] == "step"]
        repeated = [b for a, b in zip(stepped, stepped[1:]) if b <= a]
        self.assertFalse(repeated, f"steps done again after the removal: {repeated}\n"
                                   f"{text[-3000:]}\n{err[-2000:]}")
        resumed = [e for e in events if e[0] == "resume"]
        self.assertEqual(resumed[-1][3], "hb", resumed)

    def test_rank_that_never_reaches_the_rendezvous_fails_at_the_start_timeout(self):
        """A fresh process that never begins its Gloo rendezvous (hb's rank sleeps before
        hvd.init()) is failed as its host's fault at --start-timeout. Its peers wait in
        hvd.init()'s rendezvous for it, outside any try (horovod/common/operations.cc,
        BackgroundThreadLoop -> GlooContext::Initialize): left there, they end with
        std::terminate at HOROVOD_GLOO_TIMEOUT_SECONDS (HTTPStore::wait,
        horovod/common/gloo/http_store.cc) and their hosts were blacklisted, so the job
        failed. They never finished a rendezvous, so they hold no state: they are
        restarted at once and the job trains to the end on ha and hc."""
        steps = 30
        for n in ("ha", "hb", "hc"):
            self.c.node(n)
        self.set_hosts(("ha", 1), ("hb", 1), ("hc", 1))
        self.start(steps, "--start-timeout", "8", env={"TRAIN_START_DELAY": "hb:600"})
        rc, text, err = self.finish(timeout=120)
        events, sizes = self.check(text, err, steps, 2, rc_got=rc)
        self.assertEqual(sizes, [2], text[-3000:])
        self.assertRegex(err, r"rank 1 on host hb did not reach the job's rendezvous within 8 s "
                              r"of its start \(--start-timeout\)")
        self.assertIn("host hb is blacklisted", err)
        for healthy in ("ha", "hc"):
            self.assertNotIn(f"host {healthy} is blacklisted", err)
            self.assertRegex(err, rf"rank \d on host {healthy} had not finished its first "
                                  rf"rendezvous when generation 1 broke: it holds no state")
        self.assertNotIn("terminate called", err)
        restarted = [e["context"]["slot"] for e in read_events(self.events)
                     if e["name"] == "rank.restarted"]
        self.assertEqual(sorted(restarted), ["ha:0", "hc:0"], restarted)

    # -- warm joins: a newcomer starts when its plan forms, waits at the plan's lot ------

    def events_named(self, name, **context):
        return [e for e in read_events(self.events) if e["name"] == name
                and all(e["context"].get(k) == v for k, v in context.items())]

    def last_step(self):
        steps = [e[1] for e in self.program.parse("".join(self.lines))[0] if e[0] == "step"]
        return steps[-1] if steps else 0

    def assert_parked_before_told(self, newcomer):
        """Generation 2's newcomer waited at its lot before the plan was released, and rank
        0 (ha:0) was told of the plan only after that; returns the event log."""
        log = read_events(self.events)
        names = [(e["name"], e["context"].get("generation"), e["context"].get("slot"))
                 for e in log]
        parked = names.index(("rank.parked", 2, newcomer))
        self.assertLess(parked, names.index(("generation.released", 2, None)), names)
        self.assertTrue(any(n == ("notify.sent", 2, "ha:0") for n in names[parked:]), names)
        return log

    def test_newcomer_imports_while_the_others_train(self):
        """hc's process takes 6 s to reach hvd.init() (a slow import). It starts when its
        plan forms and waits at the plan's lot while ha and hb train on; they are told of
        hc (Horovod's HostsUpdatedRequest) only once it waits there. Started at the
        release instead (horovodrun's order: the survivors re-join first, then the
        newcomer starts), the survivors would sit in rank_and_size's barrier for the whole
        6 s. A parked newcomer's requests never reach the running plan's scopes: the
        server hears of hc's slot only in generation 2."""
        steps = 120
        self.train_until_commit(steps, ("ha", "hb"), commit=10,
                                env={"TRAIN_START_DELAY": "hc:6"})
        before = self.last_step()
        self.set_hosts(("ha", 1), ("hb", 1), ("hc", 1))
        rc, text, err = self.finish()
        events, sizes = self.check(text, err, steps, 3, rc_got=rc)
        self.assertEqual(sizes, [2, 3], text[-3000:])
        grown_at = next(e[2] for e in events if e[0] == "resume" and e[1] == 3)
        # 6 s of import at 200 ms a step: the survivors trained through most of it
        self.assertGreaterEqual(grown_at - before, 15,
                                f"the survivors stopped at step {grown_at} (hc was added after "
                                f"step {before}): they waited for the newcomer's import\n"
                                f"{err[-3000:]}")
        log = self.assert_parked_before_told("hc:0")
        hc_rendezvous = [e["context"]["generation"] for e in log
                         if e["name"] == "rank.rendezvous" and e["context"]["slot"] == "hc:0"]
        self.assertTrue(hc_rendezvous and min(hc_rendezvous) == 2, hc_rendezvous)
        self.assertNotIn("blacklisted", err)

    def test_newcomer_that_fails_before_its_release_costs_the_others_nothing(self):
        """hc's newcomer is killed while it imports (before it reached its plan's lot):
        its host is blacklisted, and the running ranks, never told of it, train on without
        a single re-join (no rollback, no Gloo abort); the job forms its released plan
        again. (Started at the release, a newcomer that dies takes the survivors, already
        re-joined and waiting in its rendezvous, down with it.)"""
        steps = 60
        self.train_until_commit(steps, ("ha", "hb"), commit=10,
                                env={"TRAIN_START_DELAY": "hc:30"})
        self.set_hosts(("ha", 1), ("hb", 1), ("hc", 1))
        self.wait_for_event("rank.started", 30, slot="hc:0")
        os.kill(self.rank_pid("hc"), signal.SIGKILL)
        rc, text, err = self.finish()
        events, sizes = self.check(text, err, steps, 2, rc_got=rc)
        self.assertEqual(sizes, [2], f"the survivors re-joined: {text[-3000:]}")
        self.assertRegex(err, r"rank 2 on host hc ended with signal 9.*; it was not released "
                              r"yet: the running ranks go on")
        self.assertIn("host hc is blacklisted", err)
        self.assertRegex(err, r"generation 3: 2 ranks on ha:1,hb:1, as released")
        self.assertFalse(self.events_named("gloo.abort"))
        stepped = [e[1] for e in events if e[0] == "step"]
        self.assertEqual(stepped, sorted(set(stepped)), "a step was done again")

    def test_plan_replaced_while_a_newcomer_is_parked(self):
        """hc's newcomer waits at generation 2's lot (the survivors commit only every 6 s,
        longer than HOROVOD_GLOO_TIMEOUT_SECONDS, which a parked newcomer must outlast),
        then hd appears: generation 3 replaces generation 2 before its release. hc's
        newcomer, started with generation 2's ranks and sizes, is stopped (its held
        request is dropped, never stored) and starts again for generation 3; the job grows
        to 4 without blaming anyone or losing a step. Each agent has `--slots 1`: hc's new
        worker is asked for while the stopped one still holds the node's only slot, and
        the agent hands the slot over once it is free (it refused, and the job blacklisted
        hc, before)."""
        steps = 90
        self.train_until_commit(steps, ("ha", "hb"), commit=30, slots=1,
                                agents=("ha", "hb", "hc", "hd"),
                                env={"TRAIN_COMMIT": "30", "HOROVOD_GLOO_TIMEOUT_SECONDS": "5"})
        self.set_hosts(("ha", 1), ("hb", 1), ("hc", 1))
        self.wait_for_event("rank.parked", 60, slot="hc:0", generation=2)
        self.set_hosts(("ha", 1), ("hb", 1), ("hc", 1), ("hd", 1))
        rc, text, err = self.finish(timeout=180)
        events, sizes = self.check(text, err, steps, 4, rc_got=rc)
        self.assertEqual(sizes[-1], 4, text[-3000:])
        self.assertNotIn("blacklisted", err)
        self.assertTrue(self.events_named("rank.unparked", slot="hc:0", generation=2))
        released = [e["context"]["generation"] for e in self.events_named("generation.released")]
        self.assertNotIn(2, released)
        hc_rendezvous = [e["context"]["generation"] for e in self.events_named("rank.rendezvous",
                                                                                slot="hc:0")]
        self.assertTrue(hc_rendezvous and 2 not in hc_rendezvous, hc_rendezvous)
        stepped = [e[1] for e in events if e[0] == "step"]
        self.assertEqual(stepped, sorted(set(stepped)), "a step was done again")

    def test_host_lost_at_the_release_blames_no_healthy_host(self):
        """hb's rank is killed the moment generation 2 (hc added) is released, while every
        rank of it is inside hvd.init()'s rendezvous. Horovod ends the ranks that wait
        there for hb with std::terminate (the init rendezvous runs outside any try,
        horovod/common/operations.cc); they are not at fault, and a state holder still
        inside the rendezvous of scope global cannot finish it: it is stopped at once
        rather than at HOROVOD_GLOO_TIMEOUT_SECONDS (30 s here). Within seconds the job
        goes on with a state holder or fails saying the state is lost; either way ha and
        hc are never blacklisted, and a successful end lost no step."""
        steps = 60
        self.train_until_commit(steps, ("ha", "hb"), commit=10)
        self.set_hosts(("ha", 1), ("hb", 1), ("hc", 1))
        self.wait_for_event("generation.released", 60, generation=2)
        os.kill(self.rank_pid("hb"), signal.SIGKILL)
        killed = time.monotonic()
        rc, text, err = self.finish(timeout=120)
        ended = time.monotonic() - killed
        self.assertNotIn("host ha is blacklisted", err)
        self.assertNotIn("host hc is blacklisted", err)
        if rc == 0:
            events, sizes = self.check(text, err, steps, 2, rc_got=rc)
        else:
            self.assertRegex(err, r"no host of generation \d+ is left to carry the job's "
                                  r"state over", err[-3000:])
            self.assertLess(ended, 20, f"the job ended {ended:.1f} s after the kill "
                                       f"(Horovod's Gloo timeout is 30 s):\n{err[-3000:]}")

    def test_rank_in_a_long_step_is_waited_for_past_the_elastic_timeout(self):
        """Slow is not dead: hb's rank computes for 10 s in one step (its process uses CPU
        time, it prints nothing) while a host is added. ha's rank waits for it in the
        step's allreduce, so neither re-joins the new plan until the long step ends, 7 s
        past --elastic-timeout 3. Both are alive: the plan waits for them and the job grows
        to 3, blacklisting nobody. Measured from the plan's start, as before, both would
        be failed at 3 s and, no host of the plan they held left, the job would fail."""
        steps = 40
        trigger = os.path.join(self.dir, "long-step")
        self.train_until_commit(steps, ("ha", "hb"), "--elastic-timeout", "3",
                                env={"TRAIN_LONG_STEP": f"hb:10:{trigger}"})
        open(trigger, "w").close()
        self.read_until(lambda ev: any("long step on hb" in l for l in self.lines), 30,
                        "hb's long step")
        self.set_hosts(("ha", 1), ("hb", 1), ("hc", 1))
        rc, text, err = self.finish()
        events, sizes = self.check(text, err, steps, 3, rc_got=rc)
        self.assertEqual(sizes, [2, 3], text[-3000:])
        self.assertNotIn("blacklisted", err)
        self.assertRegex(err, r"generation 2 waits for rank \d \(hb:0\): it holds the state of "
                              r"generation 1 and is still in its step")
        slow = [e for e in read_events(self.events) if e["name"] == "rank.slow"]
        self.assertIn("hb:0", [e["context"]["slot"] for e in slow], slow)
        # it was waited for past the timeout: the plan ran >= 3 s after it began
        began = [e for e in read_events(self.events) if e["name"] == "generation.begin"
                 and e["context"].get("generation") == 2]
        released = [e for e in read_events(self.events) if e["name"] == "generation.released"
                    and e["context"].get("generation") == 2]
        self.assertTrue(began and released, read_events(self.events)[-10:])
        self.assertGreater(released[0]["timestamp"] - began[0]["timestamp"], 3.0)

    def test_registrations_are_never_read_back_and_notices_still_work(self):
        """Horovod workers register their notification services (address and HMAC key,
        horovod/runner/elastic/worker.py's WorkerNotificationManager, put into the store
        by horovod/runner/common/util/... put_data_into_kvstore) with PUT
        /worker_addresses/<host>:<local_rank>. A GET of it (or ?snapshot=1 of the scope)
        answered 200 with the pickle and its key: anyone the job admits could then sign a
        request to the worker's service, which unpickles it. Refused now; the driver
        still reads the registrations itself, so the job grows and shrinks on notices."""
        self.train_until_commit(60, ("ha",), agents=("ha", "hb"), commit=5)
        wait_until(lambda: '"notify.registered"' in open(self.events).read(), 30,
                   "ha:0's registration")
        server = rendezvous_of(self.rank_pid("ha"))
        for path in ("/worker_addresses/ha:0", "/worker_addresses/ha:0?snapshot=1",
                     "/worker_addresses/ha:0?wait_ms=100"):
            status, body = raw_http(server, "GET", path)
            self.assertEqual(status, 403, body)
            self.assertNotIn(b"gAW", body)  # no pickle (base64 of protocol 5) in the answer
        # the server answers otherwise
        self.assertEqual(raw_http(server, "GET", "/unrelated/key")[0], 404)
        self.set_hosts(("ha", 1), ("hb", 1))
        self.read_until(lambda ev: any(e[0] == "resume" and e[1] == 2 for e in ev), 90,
                        "a resume at size 2")
        self.set_hosts(("ha", 1))
        rc, text, err = self.finish()
        events, sizes = self.check(text, err, 60, 1, rc_got=rc)
        self.assertEqual(sizes, [1, 2, 1], text[-3000:])
        with open(self.events) as f:
            sent = [json.loads(l)["context"] for l in f if '"notify.sent"' in l]
        self.assertTrue(any(c["delivered"] and c["generation"] == 2 for c in sent), sent)
        self.assertNotIn("blacklisted", err)

    def test_registration_key_never_logged(self):
        """The worker's key (it prints it, for this test) reaches neither the driver's own
        messages nor the event log, in any spelling; the registration itself is logged."""
        self.train_until_commit(25, ("ha",), "--verbose", agents=("ha", "hb"), commit=5,
                                env={"TRAIN_PRINT_KEY": "1"})
        self.set_hosts(("ha", 1), ("hb", 1))  # a notification is sent with that key
        rc, text, err = self.finish()
        self.check(text, err, 25, 2, rc_got=rc)
        self.assertRegex(err, r"ha:0 registered its notification service at lo: "
                              r"127\.0\.0\.1:\d+ \(key: 32 bytes\)")
        self.assertIn("rank 0 (ha:0) was told of generation 2's host change", err)
        keys = set(re.findall(r"<stdout>:key: ([0-9a-f]{64})$", text, re.M))
        self.assertTrue(keys, text[-2000:])
        with open(self.events) as f:
            log = f.read()
        self.assertIn('"notify.registered"', log)
        self.assertIn('"delivered":true', log.replace(" ", ""))
        for k in keys:
            raw = bytes.fromhex(k)
            for spelling in (k, k.upper(), base64.b64encode(raw).decode(), repr(raw)[2:-1],
                             raw.decode("latin-1")):
                self.assertNotIn(spelling, err)
                self.assertNotIn(spelling, log)


    def test_elastic_executor_with_real_horovod_inside(self):
        """caf_hvd.ElasticExecutor runs a Horovod elastic function (hvd.elastic.run,
        TorchState); a host joins mid-run; run() returns the final generation's values.
        The join is warm: hb's worker takes 4 s to reach hvd.init() (a slow import), and
        rank 0 trains on through it; its process starts when the plan forms, its worker
        function runs and waits at the plan's lot, and rank 0 is told of hb only then.
        Started at the release (horovodrun's order, and this executor's before), rank 0
        would re-join at its next commit and wait in rank_and_size's barrier for the
        whole import: hb would take the state over a few steps after it was added."""
        sys.path.insert(0, os.path.join(ROOT, "python"))
        from caf_hvd import ElasticExecutor
        self.c.node("ha")
        self.c.node("hb")
        self.set_hosts(("ha", 1))
        progress = os.path.join(self.dir, "progress")
        ex = ElasticExecutor(min_workers=1, max_workers=3, discovery_script=self.script,
                             discovery_interval=0.2, elastic_timeout=60,
                             caf_hvd=os.environ.get("CAF_HVD"),
                             extra_args=("--events", self.events) + self.executor_flags)
        ex.start(extra_env_vars={"PYTHONPATH": SITE, "PROGRESS_FILE": progress,
                                 "CAF_HVD_TEST_TOKEN": self.token, "FN_STEPS": "80",
                                 "FN_START_DELAY": "hb:4"})
        result = {}

        def run():
            try:
                result["values"] = ex.run(horovod_elastic_fn)
            except Exception as e:  # noqa: BLE001 - reported by the test below
                result["error"] = e

        t = threading.Thread(target=run)
        t.start()

        def step():
            try:
                with open(progress) as f:
                    return int(f.read() or 0)
            except (OSError, ValueError):
                return 0
        wait_until(lambda: step() >= 10 or not t.is_alive(), 90, "step 10 of the function")
        added_at = step()
        self.set_hosts(("ha", 1), ("hb", 1))
        t.join(150)
        self.assertFalse(t.is_alive(), "ElasticExecutor.run did not return")
        self.assertNotIn("error", result, result.get("error"))
        values = result["values"]
        self.assertEqual([v[:3] for v in values], [(0, 2, 80), (1, 2, 80)], values)
        self.assertTrue(all(v[3] for v in values), f"replicas differ: {values}")
        self.assertEqual(values[0][4][0], 1, values)  # it began at size 1, then grew
        took_over = values[1][4][0]  # the step at which hb's rank got the state
        # 4 s of import at about 0.1 s a step: rank 0 trained through most of it
        self.assertGreaterEqual(took_over - added_at, 20,
                                f"hb was added after step {added_at} and took the state over "
                                f"at step {took_over}: rank 0 waited for its import")
        self.assert_parked_before_told("hb:0")

    executor_flags = ()


def horovod_elastic_fn():
    """Runs on every rank of each generation (pickled by value with cloudpickle)."""
    import os
    import time

    import torch

    import horovod.torch as hvd
    steps = int(os.environ.get("FN_STEPS", "40"))
    delay_host, _, delay = os.environ.get("FN_START_DELAY", "").partition(":")
    if delay_host == os.environ.get("HOROVOD_HOSTNAME"):
        time.sleep(float(delay))  # a slow import
    hvd.init()
    torch.manual_seed(7)
    model = torch.nn.Linear(4, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model=model, optimizer=opt, step=0)
    first = {}

    @hvd.elastic.run
    def train(state):
        first.setdefault("size", hvd.size())
        resumed_at = state.step
        while state.step < steps:
            x = torch.full((2, 4), float(hvd.rank() + 1))
            opt.zero_grad()
            (model(x) ** 2).mean().backward()
            opt.step()
            state.step += 1
            if state.step % 5 == 0:
                state.commit()
                if hvd.rank() == 0:
                    with open(os.environ["PROGRESS_FILE"], "w") as f:
                        f.write(str(state.step))
            time.sleep(0.1)
        mine = float(sum(p.detach().double().sum() for p in model.parameters()))
        root = hvd.broadcast_object(mine, root_rank=0, name="final")
        return (hvd.rank(), hvd.size(), state.step, root == mine,
                (first["size"] if hvd.rank() == 0 else resumed_at,))

    return train(state)


class AllreduceElastic(Scenarios, unittest.TestCase):
    program = Allreduce()


def main():
    global SITE
    try:
        SITE = horovod_site()
    except RuntimeError as e:
        print(e)
        print("0 passed, 1 failed")
        return 1
    loader = unittest.defaultTestLoader
    suite = unittest.TestSuite(list(loader.loadTestsFromTestCase(HorovodElastic))
                               + list(loader.loadTestsFromTestCase(AllreduceElastic)))
    if sys.argv[1:]:
        suite = unittest.TestSuite(t for t in suite if any(a in t.id() for a in sys.argv[1:]))
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    failed = len(result.failures) + len(result.errors)
    print(f"{result.testsRun - failed - len(result.skipped)} passed, {failed} failed, "
          f"{len(result.skipped)} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
