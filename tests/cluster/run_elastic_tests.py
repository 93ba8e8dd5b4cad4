"""Elastic job tests: real node agents on loopback (each its own host), a real driver
with a host discovery script whose output the test rewrites, and caf-hvd-allreduce's
elastic loop as the training program. Checked from the ranks' own output and the
driver's messages. Run by `meson test`; prints a closing 'N passed, N failed' line."""

import json
import os
import re
import socket
import struct
import shutil
import signal
import stat
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (Cluster, describe_pids, free_port, leftover_ranks, pid_with_env,  # noqa: E402
                     pids_matching, raw_http, read_line, rendezvous_of, run_suite, wait_until)

ALLREDUCE = os.environ.get("CAF_HVD_ALLREDUCE", "caf-hvd-allreduce")

STEP = re.compile(r"^\[\d+\]<stdout>:step (\d+) size (\d+) sum (\d+) t=\d+$", re.M)
JOIN = re.compile(r"joined generation (\d+): slot (\S+) is rank (\d+) of (\d+)")
DONE = re.compile(r"elastic run done: (\d+) steps, checksum (\d+)")
RESUME = re.compile(r"generation (\d+): rank 0 of (\d+) on (\S+) resumes at step (\d+)")
PROBE = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                      "elastic_probe.py")]


class ElasticTest(unittest.TestCase):
    def setUp(self):
        self.c = Cluster()
        self.addCleanup(self.c.close)
        self.dir = tempfile.mkdtemp(prefix="caf-hvd-elastic-")
        self.hosts_file = os.path.join(self.dir, "hosts")
        self.script = os.path.join(self.dir, "discover.sh")
        self.write_script(f"#!/bin/sh\ncat {self.hosts_file}\n")
        self.driver = None

    def tearDown(self):
        shutil.rmtree(self.dir, True)

    def write_script(self, text):
        with open(self.script, "w") as f:
            f.write(text)
        os.chmod(self.script, stat.S_IRWXU)

    def set_hosts(self, *hosts):
        """hosts: (name, slots) of started agents; written atomically."""
        tmp = self.hosts_file + ".tmp"
        with open(tmp, "w") as f:
            for name, slots in hosts:
                f.write(f"127.0.0.1:{self.c.nodes[name][1]}:{slots}\n")
        os.replace(tmp, self.hosts_file)

    def start(self, *flags, steps=100, step_ms=20, program=None):
        # Every job keeps its event log, so a failure says what the job went through (an
        # intermittent "the driver ended before step N" once came without it).
        self.events = os.path.join(self.dir, "events.jsonl")
        if "--events" in flags:
            self.events = flags[flags.index("--events") + 1]
        else:
            flags = (*flags, "--events", self.events)
        args = ["driver", "--host-discovery-script", self.script, "--discovery-interval", "0.1",
                *flags, "--"]
        args += program or [ALLREDUCE, "--elastic", "--steps", str(steps), "--step-ms",
                            str(step_ms)]
        self.driver = self.c.start(args)
        self.out_lines = []
        return self.driver

    def finish(self, timeout=60):
        try:
            out, err = self.driver.communicate(timeout=timeout)
        except Exception:
            self.driver.kill()
            out, err = self.driver.communicate()
            raise AssertionError(f"driver did not finish in {timeout}s:\n{err[-3000:]}"
                                 f"{self.event_tail()}")
        return self.driver.returncode, out, err

    def rank_ended(self, rank):
        """Whether the job's event log has rank `rank`'s end (the driver saw its exit)."""
        try:
            with open(self.events) as f:
                events = [json.loads(line) for line in f if line.strip()]
        except (OSError, ValueError):
            return False
        return any(e.get("name") == "rank.ended" and e.get("context", {}).get("rank") == rank
                   for e in events)

    def event_tail(self, n=40):
        """The job's last events, one line each, for a failure's message."""
        try:
            with open(self.events) as f:
                lines = f.read().splitlines()[-n:]
        except (OSError, AttributeError):
            return ""
        return "\nthe job's last events:\n" + "\n".join(lines)

    def wait_for_step(self, n, timeout=20):
        """Reads the driver's stdout until rank 0 reports step n; returns the lines read.
        It never reads past that line (read_line): finish() gets every line after it."""
        deadline = time.monotonic() + timeout
        while True:
            line = read_line(self.driver.stdout.fileno(), deadline)
            if line:
                self.out_lines.append(line)
            if not line.endswith("\n"):
                break
            m = STEP.match(line.rstrip("\n"))
            if m and int(m.group(1)) >= n:
                return
        # the driver ended, or is killed at the deadline: say how, with its own words
        killed = time.monotonic() >= deadline
        if killed:
            self.driver.kill()
        try:
            rc, err = self.driver.wait(timeout=10), self.driver.stderr.read()
        except Exception as e:
            rc, err = None, f"(its end could not be read: {e})"
        how = (f"was killed after {timeout}s without step {n}" if killed
               else f"ended (exit {rc}) before step {n}")
        raise AssertionError(f"the driver {how}:\n"
                             f"{''.join(self.out_lines)[-2000:]}\nstderr:\n"
                             f"{err[-3000:]}{self.event_tail()}")

    def read_stderr_until(self, pattern, timeout=30):
        """Reads the driver's stderr until a line matches `pattern`; returns the lines
        read (fails with them when the driver ends or the time is up first: then it is
        killed). It never reads past that line (read_line): finish() gets the rest."""
        lines = []
        deadline = time.monotonic() + timeout
        while not any(pattern.search(x) for x in lines):
            line = read_line(self.driver.stderr.fileno(), deadline)
            if line:
                lines.append(line)
            if not line.endswith("\n"):
                break
        killed = not any(pattern.search(x) for x in lines) and time.monotonic() >= deadline
        if killed:
            self.driver.kill()
        self.assertTrue(any(pattern.search(x) for x in lines),
                        ("the driver was killed: no such line within " f"{timeout}s:\n"
                         if killed else "") + "".join(lines)[-3000:] + self.event_tail())
        return lines

    def rank_pid(self, rank):
        """Pid of the program that currently has HOROVOD_RANK=rank at start (gen 1)."""
        pid = pid_with_env(ALLREDUCE, prefix=True, HOROVOD_RANK=rank, HOROVOD_ELASTIC=1)
        if pid is None:
            raise AssertionError(f"no process of rank {rank}")
        return pid

    def check_run(self, out, steps):
        """Every step's sum equals its world size; the final state is consistent."""
        text = "".join(self.out_lines) + out
        m = DONE.search(text)
        self.assertIsNotNone(m, text[-3000:])
        self.assertEqual(int(m.group(1)), steps)
        self.assertEqual(int(m.group(2)), steps * (steps + 1) // 2)
        seen = [(int(s), int(n), int(x)) for s, n, x in STEP.findall(text)]
        for s, n, x in seen:
            self.assertEqual(n, x, f"step {s}: sum {x} for world size {n}")
        numbers = sorted({s for s, _, _ in seen})
        self.assertEqual(numbers, list(range(1, steps + 1)), "a committed step is missing")
        # A killed rank 0 may have printed a step its survivors did not commit: one back.
        self.assert_resumes_continue(text, slack=1)
        return text, seen

    def resumes(self, text):
        """[(generation, size, host, step)] in output order."""
        return [(int(g), int(n), h, int(s)) for g, n, h, s in RESUME.findall(text)]

    def assert_resumes_continue(self, text, slack=0):
        """No generation resumes below the last step committed before it (a restart from
        step 0 shows up here even when every step number is printed at some point)."""
        last = 0
        for line in text.splitlines():
            m = STEP.match(line)
            if m:
                last = max(last, int(m.group(1)))
            r = RESUME.search(line)
            if r:
                self.assertGreaterEqual(int(r.group(4)), last - slack,
                                        f"generation {r.group(1)} resumes at step {r.group(4)} "
                                        f"after step {last} was committed:\n{text[-3000:]}")

    def joins(self, text):
        """generation -> {slot: (rank, size)}"""
        out = {}
        for g, slot, r, n in JOIN.findall(text):
            out.setdefault(int(g), {})[slot] = (int(r), int(n))
        return out

    # -- failures ------------------------------------------------------------------------

    def test_rank_killed_host_blacklisted_survivors_rerank(self):
        self.c.node("ha")
        self.c.node("hb")
        self.set_hosts(("ha", 2), ("hb", 2))
        outdir = os.path.join(self.dir, "out")
        self.start("--min-np", "2", "--output-filename", outdir, steps=80)
        self.wait_for_step(10)
        os.kill(self.rank_pid(0), signal.SIGKILL)
        rc, out, err = self.finish()
        self.assertEqual(rc, 0, err)
        self.assertIn("rank 0 on host ha ended with signal 9", err)
        self.assertIn("host ha is blacklisted for the rest of the job", err)
        self.assertIn("generation 2: 2 ranks on hb:2 (removed ha)", err)
        text, seen = self.check_run(out, 80)
        j = self.joins(text)
        self.assertEqual(j[1], {"ha:0": (0, 4), "ha:1": (1, 4), "hb:0": (2, 4), "hb:1": (3, 4)})
        # the former rank `slots` (2) is the new rank 0
        self.assertEqual(j[2], {"hb:0": (0, 2), "hb:1": (1, 2)})
        self.assertEqual({n for _, n, _ in seen}, {4, 2})
        # --output-filename: one directory per slot, the slot's lines across generations
        with open(os.path.join(outdir, "hb:0", "stdout")) as f:
            slot_out = f.read()
        self.assertIn("joined generation 1: slot hb:0 is rank 2 of 4", slot_out)
        self.assertIn("joined generation 2: slot hb:0 is rank 0 of 2", slot_out)
        self.assertIn("elastic run done: 80 steps", slot_out)
        self.assertEqual(sorted(os.listdir(outdir)),
                         ["ha:0", "ha:1", "hb:0", "hb:1", "rank.0", "rank.1"])
        # rank.N names the slot with rank N in the final generation (gen 1's rank.2/3 gone)
        self.assertEqual([os.readlink(os.path.join(outdir, f"rank.{r}")) for r in (0, 1)],
                         ["hb:0", "hb:1"])

    def test_node_agent_killed(self):
        self.c.node("ha")
        self.c.node("hb")
        self.set_hosts(("ha", 1), ("hb", 2))
        self.start("--min-np", "1", steps=80)
        self.wait_for_step(10)
        os.killpg(self.c.nodes["hb"][0].pid, signal.SIGKILL)
        rc, out, err = self.finish()
        self.assertEqual(rc, 0, err)
        self.assertRegex(err, r"node agent hb \(127\.0\.0\.1:\d+\) was lost")
        self.assertIn("generation 2: 1 ranks on ha:1 (removed hb)", err)
        text, seen = self.check_run(out, 80)
        self.assertEqual(self.joins(text)[2], {"ha:0": (0, 1)})
        wait_until(lambda: not pids_matching(ALLREDUCE, prefix=True), 10,
                   "the lost agent's ranks to be gone")

    def test_host_lost_after_rank_0_finished_is_named(self):
        """Rank 0 (on ha) exits 0; rank 1's agent (hb) is then killed before its rank's exit
        is seen: the job cannot claim success, and says why in those words."""
        self.c.node("ha")
        self.c.node("hb")
        self.set_hosts(("ha", 1), ("hb", 1))
        # this test's own rank command: a `sleep 30...` of another test or of the machine
        # must not count (a fresh-clone CI run once timed out on one)
        rank_cmd = f"sleep 30.{os.getpid()}{time.monotonic_ns() % 1000}"
        program = ["sh", "-c", 'if [ "$HOROVOD_RANK" = 0 ]; then echo done; exit 0; fi; '
                               f"echo waiting; {rank_cmd}"]
        self.start("--min-np", "2", program=program)
        wait_until(lambda: pid_with_env(rank_cmd, prefix=True, HOROVOD_RANK=1) is not None, 20,
                   "rank 1 to start")
        # rank 0's exit has reached the driver: its own event says so (not a sleep)
        wait_until(lambda: self.rank_ended(0), 20, "the driver's rank.ended event of rank 0")
        os.killpg(self.c.nodes["hb"][0].pid, signal.SIGKILL)
        rc, out, err = self.finish()
        self.assertEqual(rc, 1, err)
        self.assertRegex(err, r"node agent hb \(127\.0\.0\.1:\d+\) was lost after a rank of "
                              r"the final generation had finished \(.*\); the exits of its "
                              r"ranks were not seen, so the job cannot report success")
        try:
            wait_until(lambda: not pids_matching(rank_cmd, prefix=True), 10,
                       "the lost agent's rank to be gone")
        except AssertionError as e:
            raise AssertionError(f"{e}: {describe_pids(pids_matching(rank_cmd, prefix=True))}")

    def test_hung_node_agent(self):
        """An agent stopped with SIGSTOP: heartbeats time out, its host leaves the job, and
        the job goes on; its rank (still running) is told -1 when it re-joins.

        The job's abort ends that rank's connection to ha; a send or receive of Gloo's
        TCP transport that is partly on the wire then is not woken by the connection's
        end (Pair::signalException skips the unbound buffer of an operation in
        progress) and waits for Gloo's timeout before the rank re-joins: seen in CI
        (the rank left 30 s after the abort) and forced with 80 MB messages here. The
        timeout is 3 s, so the rank re-joins while generation 2 still runs."""
        self.c.node("ha")
        self.c.node("hb")
        self.set_hosts(("ha", 1), ("hb", 1))
        self.start("--min-np", "1", "--link-timeout", "3", "--env",
                   "HOROVOD_GLOO_TIMEOUT_SECONDS=3", steps=400)
        self.wait_for_step(10)
        agent = self.c.nodes["hb"][0]
        os.kill(agent.pid, signal.SIGSTOP)
        self.addCleanup(lambda: agent.poll() is None and os.kill(agent.pid, signal.SIGCONT))
        rc, out, err = self.finish()
        self.assertEqual(rc, 0, err)
        self.assertRegex(err, r"node agent hb \(127\.0\.0\.1:\d+\) was lost: connection lost")
        self.assertIn("generation 2: 1 ranks on ha:1 (removed hb)", err)
        text, seen = self.check_run(out, 400)
        self.assertEqual(self.joins(text)[2], {"ha:0": (0, 1)})
        wait_until(lambda: not pids_matching(ALLREDUCE, prefix=True), 10,
                   "the hung agent's rank to leave")

    def test_cooldown_host_returns(self):
        self.c.node("ha")
        self.c.node("hb")
        self.set_hosts(("ha", 1), ("hb", 1))
        self.start("--min-np", "1", "--blacklist-cooldown-range", "1", "2", steps=250)
        self.wait_for_step(10)
        os.kill(self.rank_pid(1), signal.SIGKILL)
        rc, out, err = self.finish()
        self.assertEqual(rc, 0, err)
        self.assertRegex(err, r"host hb is blacklisted for 2\.0 s \(failure 1\)")
        self.assertIn("host hb (127.0.0.1", err)
        self.assertIn("is back from its blacklist cooldown", err)
        self.assertIn("generation 3: 2 ranks on ha:1,hb:1 (added hb)", err)
        text, seen = self.check_run(out, 250)
        j = self.joins(text)
        self.assertEqual(j[2], {"ha:0": (0, 1)})
        self.assertEqual(j[3], {"ha:0": (0, 2), "hb:0": (1, 2)})
        self.assertEqual([n for _, n, _ in seen][-1], 2)

    def test_all_hosts_failed(self):
        self.c.node("ha")
        self.set_hosts(("ha", 2))
        self.start("--min-np", "1", steps=200)
        self.wait_for_step(5)
        os.kill(self.rank_pid(1), signal.SIGKILL)
        rc, out, err = self.finish()
        self.assertEqual(rc, 1, err)
        self.assertIn("every host is blacklisted; first failure: rank 1 on host ha ended with "
                      "signal 9", err)

    def test_hung_rank_misses_the_barrier_deadline(self):
        """A stopped rank: its peers time out in Gloo and re-join; it holds the job's state,
        so it is waited for up to the elastic timeout (not --start-timeout), then its host
        is blacklisted and the job goes on."""
        for n in ("ha", "hb", "hc"):
            self.c.node(n)
        self.set_hosts(("ha", 1), ("hb", 1), ("hc", 1))
        self.start("--min-np", "1", "--start-timeout", "1", "--elastic-timeout", "3",
                   "--kill-grace-seconds", "1", "--env", "HOROVOD_GLOO_TIMEOUT_SECONDS=2",
                   steps=150)
        self.wait_for_step(10)
        pid = self.rank_pid(1)
        os.kill(pid, signal.SIGSTOP)
        rc, out, err = self.finish(timeout=90)
        self.assertEqual(rc, 0, err)
        self.assertRegex(err, r"rank 1 \(hb:0\) did not join generation \d+ within 3 s "
                              r"\(--elastic-timeout; it holds the state of generation 1")
        self.assertIn("host hb is blacklisted", err)
        text, seen = self.check_run(out, 150)
        last = max(self.joins(text))
        self.assertEqual(self.joins(text)[last], {"ha:0": (0, 2), "hc:0": (1, 2)})
        wait_until(lambda: not os.path.exists(f"/proc/{pid}"), 10, "the stopped rank to be killed")

    def test_interrupt_and_driver_kill_stop_every_rank(self):
        self.c.node("ha")
        self.c.node("hb")
        self.set_hosts(("ha", 1), ("hb", 1))
        self.start("--min-np", "2", steps=100000)
        self.wait_for_step(5)
        self.driver.send_signal(signal.SIGINT)
        rc, out, err = self.finish()
        self.assertEqual(rc, 130, err)
        self.assertIn("received Interrupt; stopping the job", err)
        wait_until(lambda: not pids_matching(ALLREDUCE, prefix=True), 10, "ranks to be gone")
        self.start("--min-np", "2", steps=100000)
        self.wait_for_step(5)
        self.driver.kill()
        self.driver.wait()
        wait_until(lambda: not pids_matching(ALLREDUCE, prefix=True), 15,
                   "the ranks of a killed driver to be stopped by their agents")

    def hold_a_slot(self, port):
        """Another job with one rank on the agent at `port`, started and holding its slot."""
        other = self.c.start(["driver", "-np", "1", "-H", f"127.0.0.1:{port}:1", "--",
                              "sh", "-c", "echo holding; exec sleep 300"])
        self.assertIn("holding", other.stdout.readline())
        return other

    def until_freed(self, said, other):
        """Reads the job's stderr until `said`, ends `other` (its slot is free), and lets
        the job finish: it must end well, never having blacklisted anything; -> (rc, out,
        every stderr line)."""
        err_lines = self.read_stderr_until(said)
        other.send_signal(signal.SIGTERM)
        other.wait(timeout=30)
        rc, out, err = self.finish(timeout=120)
        err = "".join(err_lines) + err
        self.assertEqual(rc, 0, err[-3000:])
        self.assertNotIn("blacklisted", err)
        return rc, out, err

    def test_a_node_full_of_another_jobs_ranks_is_waited_for_not_blacklisted(self):
        """hx (--slots 1) runs another job's rank when discovery lists it for this elastic
        job: its agent refuses the ranks ("the node has 1 slot for all jobs and 1 is
        held"). The node is full, not broken: the job leaves it for now, says why, and
        takes it once the other job has ended. It blacklisted hx before."""
        self.c.node("ha")
        self.c.node("hx", slots=1)
        hx = self.c.nodes["hx"][1]
        other = self.hold_a_slot(hx)
        self.set_hosts(("ha", 1))
        self.start("--min-np", "1", steps=1200)
        self.wait_for_step(5)
        self.set_hosts(("ha", 1), ("hx", 1))
        refused = re.compile(r"warning: discovered host 127\.0\.0\.1:\d+ is not used \(trying "
                             r"again while it is listed\): .*the node has 1 slot for all jobs "
                             r"and 1 is held")
        rc, out, err = self.until_freed(refused, other)
        self.assertRegex(err, r"generation \d+: 2 ranks on ha:1,hx:1 \(added hx\)")
        self.check_run(out, 1200)

    def test_growing_onto_a_node_another_job_filled_keeps_the_node_and_its_ranks(self):
        """The job runs a rank on hx (--slots 2) when discovery lists a second slot there;
        another job has just taken it, so hx's agent refuses the new rank. The job keeps
        its rank on hx and hx itself (a full node is not a broken one), says why, and grows
        there once the other job has ended. It blacklisted hx before, losing its rank."""
        self.c.node("ha")
        self.c.node("hx", slots=2)
        hx = self.c.nodes["hx"][1]
        self.set_hosts(("ha", 1), ("hx", 1))
        self.start("--min-np", "1", steps=1500)
        self.wait_for_step(5)
        other = self.hold_a_slot(hx)
        self.set_hosts(("ha", 1), ("hx", 2))
        full = re.compile(r"warning: host hx \(127\.0\.0\.1:\d+\) is full: the job keeps its 1 "
                          r"rank there and asks for more again while it is listed: .*the node "
                          r"has 2 slots for all jobs and 2 are held")
        rc, out, err = self.until_freed(full, other)
        self.assertRegex(err, r"generation \d+: 3 ranks on ha:1,hx:2")
        text, seen = self.check_run(out, 1500)
        # the rank on hx never left: the job's size never dropped below 2
        self.assertGreaterEqual(min(n for _, n, _ in seen), 2, err[-3000:])

    def test_driver_killed_between_spawn_and_launch_leaks_no_slot(self):
        """--cold-joins: hb's two slots get workers when generation 2 forms, and their
        processes wait for its release, which waits for ha's rank to re-join; it never
        does (its program does not speak Horovod's rendezvous). The driver is SIGKILLed
        there. hb's agent ends the never-launched workers at once: its 2 slots take a new
        job of 2 ranks. Before, its colocator waited for a launch that would never come,
        holding both slots and listing the job until the agent itself stopped."""
        self.c.node("ha", slots=1)
        self.c.node("hb", slots=2)
        self.set_hosts(("ha", 1))
        self.start("--min-np", "1", "--cold-joins", "--verbose",
                   program=["sh", "-c", "echo step 1 size 1 sum 1 t=0; exec sleep 300"])
        self.wait_for_step(1)
        self.set_hosts(("ha", 1), ("hb", 2))
        spawned = re.compile(r"host 127\.0\.0\.1:\d+: the workers of 2 slots are spawned")
        self.read_stderr_until(spawned)
        self.driver.kill()
        self.driver.wait()
        hb = self.c.nodes["hb"][1]
        # a job that needs both of hb's slots starts (it waits for nothing)
        rc, out, err = self.c.run(["driver", "-np", "2", "-H", f"127.0.0.1:{hb}:2", "--",
                                   "sh", "-c", "echo ran"], timeout=60)
        self.assertEqual(rc, 0, err)
        self.assertEqual(out.count("ran"), 2, out)
        self.assertNotIn("are held", err)

    def test_no_host_of_the_previous_generation_left(self):
        self.c.node("ha")
        self.c.node("hb")
        self.set_hosts(("ha", 1))
        self.start("--min-np", "1", steps=100000)
        self.wait_for_step(5)
        self.set_hosts(("hb", 1))  # every host of generation 1 goes at once
        rc, out, err = self.finish()
        self.assertEqual(rc, 1, err)
        self.assertIn("no host of generation 1 is left to carry the job's state over", err)
        wait_until(lambda: not pids_matching(ALLREDUCE, prefix=True), 10, "ranks to be gone")

    # -- the lifecycle's promises ---------------------------------------------------------

    def test_state_lost_when_the_only_old_host_dies_before_rejoining(self):
        """hb joins; generation 2 forms and hb's slot waits for its release while ha's
        rank (the only one holding the state) is still in its step; ha's rank is killed
        there. hb never held state: the job fails and says so, it does not restart from
        step 0 on hb (whose process never started)."""
        self.c.node("ha")
        self.c.node("hb")
        self.set_hosts(("ha", 1))
        events = os.path.join(self.dir, "events.jsonl")
        self.start("--min-np", "1", "--events", events, steps=100, step_ms=4000)
        self.wait_for_step(1)
        pid = self.rank_pid(0)
        self.set_hosts(("ha", 1), ("hb", 1))

        def generation_2():
            with open(events) as f:
                return '"generation":2' in f.read().replace(" ", "")
        wait_until(generation_2, 10, "generation 2 to begin")
        os.kill(pid, signal.SIGKILL)
        rc, out, err = self.finish()
        self.assertEqual(rc, 1, err)
        self.assertIn("no host of generation 1 is left to carry the job's state over: the "
                      "training state was lost with the last host of the previous generation "
                      "(ha)", err)
        text = "".join(self.out_lines) + out
        self.assertEqual([r[0] for r in self.resumes(text)], [1], text)  # nothing resumed
        self.assertNotIn("hb:0", text)  # hb's slot never ran a process
        wait_until(lambda: not pids_matching(ALLREDUCE, prefix=True), 10, "ranks to be gone")

    def test_host_joins_while_the_old_rank_is_in_a_long_step(self):
        """Steps take longer than --start-timeout: the old rank is waited for (it holds the
        state), the job goes on from its commit on both hosts."""
        self.c.node("ha")
        self.c.node("hb")
        self.set_hosts(("ha", 1))
        self.start("--min-np", "1", "--start-timeout", "1", steps=4, step_ms=2500)
        self.wait_for_step(1)
        self.set_hosts(("ha", 1), ("hb", 1))
        rc, out, err = self.finish()
        self.assertEqual(rc, 0, err)
        self.assertNotIn("blacklisted", err)
        self.assertIn("generation 2: 2 ranks on ha:1,hb:1 (added hb)", err)
        text, seen = self.check_run(out, 4)
        self.assert_resumes_continue(text)
        r = self.resumes(text)
        self.assertEqual([(g, n, h) for g, n, h, _ in r], [(1, 1, "ha"), (2, 2, "ha")], text)
        self.assertGreaterEqual(r[1][3], 1)

    def test_generation_1_rank_that_never_asks_is_bounded(self):
        """Generation 1 starts released (as under horovodrun): ha's rank times out in
        Gloo waiting for hb's, which hangs before its first init, and asks to re-join. hb's
        rank belongs to the released plan, so it is waited for up to the elastic timeout;
        then its host is blacklisted and the job goes on."""
        self.c.node("ha")
        self.c.node("hb")
        self.set_hosts(("ha", 1), ("hb", 1))
        marker = f"1000.{time.monotonic_ns() % 10**9}"
        prog = ["sh", "-c", f'if [ "$HOROVOD_HOSTNAME" = hb ]; then exec sleep {marker}; fi; '
                f'exec {ALLREDUCE} --elastic --steps 20 --step-ms 10']
        self.start("--min-np", "1", "--elastic-timeout", "3", "--kill-grace-seconds", "1",
                   "--env", "HOROVOD_GLOO_TIMEOUT_SECONDS=2", program=prog)
        rc, out, err = self.finish()
        self.assertEqual(rc, 0, err)
        self.assertRegex(err, r"rank 1 \(hb:0\) did not join generation \d+ within 3 s "
                              r"\(--elastic-timeout")
        self.assertIn("host hb is blacklisted", err)
        self.check_run(out, 20)
        wait_until(lambda: not pids_matching(f"sleep {marker}"), 10, "the hung rank to be killed")

    def test_slot_that_leaves_and_traps_sigterm_is_killed(self):
        """A slot leaves (its host shrinks); its program traps SIGTERM to checkpoint and
        keeps running: SIGKILL follows the grace period, and the job ends when its real
        rank does."""
        self.c.node("ha")
        self.set_hosts(("ha", 2))
        self.start("--min-np", "1", "--kill-grace-seconds", "1",
                   program=[*PROBE, "--seconds", "6", "--checkpoint-on-term"])
        line = read_line(self.driver.stdout.fileno(), time.monotonic() + 30)
        self.assertIn("joined generation 1", line, "no first line within 30 s")
        self.set_hosts(("ha", 1))
        rc, out, err = self.finish(timeout=30)
        self.assertEqual(rc, 0, err)
        text = line + out
        self.assertIn("slot ha:1 left the job", text)
        self.assertIn("slot ha:1 checkpoints on SIGTERM", text)
        self.assertIn("slot ha:0 joined generation 2 as rank 0 of 1", text)

    def test_torch_store_off_finds_master_port_per_generation(self):
        """--torch-store off: every generation's new processes get a MASTER_PORT found free
        on rank 0's host for that generation (never 0)."""
        self.c.node("ha")
        self.c.node("hb")
        self.set_hosts(("ha", 1))
        self.start("--min-np", "1", "--torch-store", "off", program=[*PROBE, "--seconds", "3"])
        first = read_line(self.driver.stdout.fileno(), time.monotonic() + 30)
        self.set_hosts(("ha", 1), ("hb", 1))
        rc, out, err = self.finish(timeout=30)
        self.assertEqual(rc, 0, err)
        ports = re.findall(r"slot (\S+) joined generation (\d) .*MASTER_PORT (\d+), agent store "
                           r"unset", first + out)
        self.assertIn(("hb:0", "2"), [(s, g) for s, g, _ in ports], first + out)
        self.assertTrue(all(int(p) > 0 for _, _, p in ports), ports)

    # -- requests a neighbour sends to the job's servers ------------------------------------

    def test_names_that_are_not_host_names_get_400_and_reach_the_terminal_escaped(self):
        """A slot name with an escape sequence and a line break, one that is not UTF-8 (a
        PUT /worker_addresses/%ff%fe:0 used to end the job: its JSON event threw in the
        coordinator), and a read of the registrations: each refused, the job unharmed."""
        self.c.node("ha")
        self.set_hosts(("ha", 1))
        self.start("--min-np", "1", steps=120)
        self.wait_for_step(5)
        server = rendezvous_of(self.rank_pid(0))
        for method, path in [("GET", b"/rank_and_size/%1b[2J%1b[31mEVIL%0a:0"),
                             ("GET", b"/rank_and_size/%ff%fe:0"),
                             ("PUT", b"/worker_addresses/%ff%fe:0"),
                             ("PUT", b"/worker_addresses/%1b]0;title%07:0")]:
            status, body = raw_http(server, method, path, b"x")
            self.assertEqual(status, 400, (path, body))
        self.assertEqual(raw_http(server, "GET", b"/worker_addresses/ha:0")[0], 403)
        self.assertEqual(raw_http(server, "GET", b"/worker_addresses/ha:0?snapshot=1")[0], 403)
        rc, out, err = self.finish()
        self.assertEqual(rc, 0, err)
        self.check_run(out, 120)
        self.assertNotIn("\x1b", err)
        self.assertIn("the rendezvous server refused a vote for host '\\x1b[2J\\x1b[31mEVIL"
                      "\\x0a' from 127.0.0.1: not a host name", err)
        self.assertNotIn("coordinator ended", err)

    def test_a_neighbours_put_cannot_make_the_abort_cut_a_ranks_other_connection(self):
        """Any PUT body used to add Gloo endpoints, which the agents cut in the survivors'
        processes when a generation breaks: a neighbour could name a database the ranks
        use. Each rank's process group holds a connection to a listener this test owns;
        the neighbour PUTs that listener's address in Gloo's layout (an ad-hoc scope and a
        key of scope global that is no rank's); hb's rank is killed; ha's connection is
        still up after the abort (which did run: the gloo.abort event)."""
        db = socket.socket()
        db.bind(("127.0.0.1", 0))
        db.listen(8)
        db.settimeout(30)
        self.addCleanup(db.close)
        holder = os.path.join(self.dir, "holder.py")
        with open(holder, "w") as f:
            f.write("import os, socket, time\n"
                    f"s = socket.create_connection(('127.0.0.1', {db.getsockname()[1]}))\n"
                    "s.sendall(os.environ['HOROVOD_HOSTNAME'].encode() + b'\\n')\n"
                    "time.sleep(120)\n")
        events = os.path.join(self.dir, "events.jsonl")
        self.c.node("ha")
        self.c.node("hb")
        self.set_hosts(("ha", 1), ("hb", 1))
        self.start("--min-np", "1", "--events", events, program=[
            "sh", "-c", f"{sys.executable} {holder} & exec {ALLREDUCE} --elastic --steps 400 "
                        "--step-ms 20"])
        conns = {}
        for _ in range(2):
            c, _ = db.accept()
            self.addCleanup(c.close)
            conns[c.makefile().readline().strip()] = c
        self.assertEqual(set(conns), {"ha", "hb"})
        self.wait_for_step(10)
        server = rendezvous_of(self.rank_pid(0))
        poison = (struct.pack("=H", socket.AF_INET) + struct.pack("!H", db.getsockname()[1])
                  + socket.inet_aton("127.0.0.1")).ljust(128, b"\0") + struct.pack("=q", 1)
        for path in (b"/database/x", b"/global/x", b"/global/rank_x"):
            self.assertEqual(raw_http(server, "PUT", path, poison)[0], 200, path)
        victim = pid_with_env(ALLREDUCE, prefix=True, HOROVOD_HOSTNAME="hb")
        self.assertIsNotNone(victim)
        os.kill(victim, signal.SIGKILL)

        def aborted():
            try:
                with open(events) as f:
                    return [json.loads(l) for l in f if '"gloo.abort"' in l]
            except OSError:
                return []
        wait_until(lambda: any(e["context"]["host"] == "ha" for e in aborted()), 20,
                   "ha's Gloo abort")
        # the event comes with the agent's report, after its cuts: a cut connection's end
        # here would already read as closed
        ha = conns["ha"]
        ha.setblocking(False)
        try:
            data = ha.recv(1)
            self.fail(f"ha's connection to the test's listener was cut (read {data!r})")
        except BlockingIOError:
            pass  # still up, nothing to read
        abort = [e for e in aborted() if e["context"]["host"] == "ha"][0]["context"]
        self.assertGreaterEqual(abort["processes"], 1, abort)
        rc, out, err = self.finish()
        self.assertEqual(rc, 0, err)
        self.assertIn("host hb is blacklisted", err)

    # -- host changes --------------------------------------------------------------------

    def test_hosts_added_then_removed(self):
        self.c.node("ha")
        self.c.node("hb")
        self.set_hosts(("ha", 2))
        self.start("--min-np", "2", "--reset-limit", "2", steps=150)
        self.wait_for_step(10)
        self.set_hosts(("ha", 2), ("hb", 2))
        self.wait_for_step(60)
        self.set_hosts(("hb", 2))
        rc, out, err = self.finish()
        self.assertEqual(rc, 0, err)
        text, seen = self.check_run(out, 150)
        j = self.joins(text)
        self.assertEqual(j[1], {"ha:0": (0, 2), "ha:1": (1, 2)})
        # existing ranks keep their numbers; the new host's ranks come after them
        self.assertEqual(j[2], {"ha:0": (0, 4), "ha:1": (1, 4), "hb:0": (2, 4), "hb:1": (3, 4)})
        # the oldest surviving host keeps rank 0: former rank 2 (= slots) is rank 0
        self.assertEqual(j[3], {"hb:0": (0, 2), "hb:1": (1, 2)})
        self.assertIn("slot ha:0 is no longer in the job", text)
        self.assertEqual([n for _, n, _ in seen][0], 2)
        self.assertIn(4, {n for _, n, _ in seen})

    def test_a_draining_agent_is_left_like_a_host_gone_from_discovery(self):
        """SIGTERM to an agent given --drain-grace: a job that found its hosts with a
        discovery script (which still lists the node) leaves it at its next commit, blames
        nobody, and the agent exits once its ranks are gone, long before its grace."""
        self.c.node("ha")
        agent = self.c.node("hb", extra=["--drain-grace", "60"])
        self.set_hosts(("ha", 1), ("hb", 1))
        self.start("--min-np", "1", steps=200)
        self.wait_for_step(20)
        sigterm = time.monotonic()
        self.c.nodes["hb"][0].send_signal(signal.SIGTERM)
        self.assertEqual(self.c.nodes["hb"][0].wait(timeout=30), 0)
        self.assertLess(time.monotonic() - sigterm, 30)
        rc, out, err = self.finish()
        self.assertEqual(rc, 0, err)
        text, seen = self.check_run(out, 200)
        self.assertIn("node hb drains (its agent received SIGTERM and stops within 60 s "
                      "(--drain-grace)): the job leaves it at its next commit", err)
        self.assertRegex(err, r"generation 2: 1 ranks on ha:1 \(removed hb\)")
        self.assertNotIn("blacklisted", err)
        self.assertNotIn("was lost", err)
        self.assertEqual(sorted({n for _, n, _ in seen}), [1, 2])
        self.assertEqual([n for _, n, _ in seen][-1], 1)
        del agent

    def test_slots_of_a_host_grow_and_shrink(self):
        self.c.node("ha")
        self.c.node("hb")
        self.set_hosts(("ha", 1), ("hb", 1))
        self.start("--min-np", "2", steps=150)
        self.wait_for_step(10)
        self.set_hosts(("ha", 2), ("hb", 1))
        self.wait_for_step(50)
        self.set_hosts(("ha", 1), ("hb", 1))
        rc, out, err = self.finish()
        self.assertEqual(rc, 0, err)
        text, seen = self.check_run(out, 150)
        j = self.joins(text)
        self.assertEqual(j[1], {"ha:0": (0, 2), "hb:0": (1, 2)})
        self.assertEqual(j[2], {"ha:0": (0, 3), "ha:1": (1, 3), "hb:0": (2, 3)})
        self.assertEqual(j[3], {"ha:0": (0, 2), "hb:0": (1, 2)})
        self.assertIn("slot ha:1 is no longer in the job", text)
        self.assertEqual([n for _, n, _ in seen][-1], 2)

    def test_max_np_no_reset_for_extra_hosts(self):
        self.c.node("ha")
        self.c.node("hb")
        self.set_hosts(("ha", 2))
        self.start("--min-np", "1", "--max-np", "2", "--verbose", steps=60)
        self.wait_for_step(10)
        self.set_hosts(("ha", 2), ("hb", 2))
        rc, out, err = self.finish()
        self.assertEqual(rc, 0, err)
        self.assertRegex(err, r"host hb \(127\.0\.0\.1:\d+\) ready")
        self.assertNotIn("generation 2", err)
        text, seen = self.check_run(out, 60)
        self.assertEqual({n for _, n, _ in seen}, {2})

    def test_local_and_cross_sizes_count_only_the_ranks_max_np_leaves(self):
        """--max-np 3 over two hosts of 2 slots: hb runs one rank, so its LOCAL_SIZE is 1
        (not its 2 slots) and local rank 1 exists on ha alone (CROSS_SIZE 1), as Horovod
        computes them for the ranks it starts."""
        self.c.node("ha")
        self.c.node("hb")
        self.set_hosts(("ha", 2), ("hb", 2))
        self.start("--min-np", "3", "--max-np", "3", program=[
            "sh", "-c", "echo layout rank=$HOROVOD_RANK size=$HOROVOD_SIZE "
            "host=$HOROVOD_HOSTNAME local=$HOROVOD_LOCAL_RANK/$HOROVOD_LOCAL_SIZE "
            "cross=$HOROVOD_CROSS_RANK/$HOROVOD_CROSS_SIZE"])
        rc, out, err = self.finish()
        self.assertEqual(rc, 0, err)
        got = sorted(re.findall(r"layout (rank=.*)", out))
        self.assertEqual(got, ["rank=0 size=3 host=ha local=0/2 cross=0/2",
                               "rank=1 size=3 host=ha local=1/2 cross=0/1",
                               "rank=2 size=3 host=hb local=0/1 cross=1/2"], out)

    def test_reset_limit(self):
        self.c.node("ha")
        self.c.node("hb")
        self.set_hosts(("ha", 2))
        self.start("--min-np", "2", "--reset-limit", "1", steps=400)
        self.wait_for_step(10)
        self.set_hosts(("ha", 2), ("hb", 2))
        self.wait_for_step(40)
        self.set_hosts(("hb", 2))
        rc, out, err = self.finish()
        self.assertEqual(rc, 1, err)
        self.assertIn("generation 2: 4 ranks", err)
        self.assertNotIn("generation 3", err)
        self.assertIn("the job has been reset 1 times, which reaches the reset limit "
                      "(--reset-limit 1)", err)
        wait_until(lambda: not pids_matching(ALLREDUCE, prefix=True), 10, "ranks to be gone")

    def test_waits_for_min_np_then_starts(self):
        self.c.node("ha")
        self.c.node("hb")
        self.set_hosts(("ha", 1))
        self.start("--min-np", "3", steps=20)
        said = "".join(self.read_stderr_until(re.compile("waiting up to")))
        self.set_hosts(("ha", 1), ("hb", 2))
        rc, out, err = self.finish()
        err = said + err
        self.assertEqual(rc, 0, err)
        self.assertIn("waiting up to 600 s for at least 3 slots (--min-np); available now: 1 "
                      "slots on ha (1 slots)", err)
        self.assertIn("generation 1: 3 ranks on ha:1,hb:2", err)
        self.check_run(out, 20)

    def test_elastic_timeout(self):
        self.c.node("ha")
        self.set_hosts(("ha", 1))
        self.start("--min-np", "2", "--elastic-timeout", "1")
        rc, out, err = self.finish()
        self.assertEqual(rc, 1, err)
        self.assertIn("elastic timeout (1 s) expired waiting for at least 2 slots (--min-np); "
                      "available: 1 slots on ha (1 slots)", err)

    def test_elastic_timeout_when_no_discovered_host_can_be_reached(self):
        """No host ever becomes ready (so the job's servers never start): the wait for
        --min-np slots still ends at --elastic-timeout, saying why each host was not used
        (it used to wait until it was killed)."""
        dead = free_port()  # nothing listens there
        with open(self.hosts_file, "w") as f:
            f.write(f"127.0.0.1:{dead}:2\n")
        started = time.monotonic()
        self.start("--min-np", "2", "--elastic-timeout", "2")
        rc, out, err = self.finish(timeout=30)
        self.assertEqual(rc, 1, err)
        self.assertLess(time.monotonic() - started, 20, err)
        self.assertIn("elastic timeout (2 s) expired waiting for at least 2 slots (--min-np); "
                      f"available: 0 slots; not usable: 127.0.0.1:{dead} (cannot reach it: "
                      "Connection refused", err)

    # -- the discovery script ------------------------------------------------------------

    def test_discovery_fails_at_first_call(self):
        self.write_script("#!/bin/sh\necho 'no cloud API today' >&2\nexit 3\n")
        self.start()
        rc, out, err = self.finish()
        self.assertEqual(rc, 1, err)
        self.assertIn(f"host discovery script {self.script} failed on its first call: it exited "
                      "with code 3; its stderr ends with: no cloud API today", err)

    def test_discovery_garbage_line(self):
        self.c.node("ha")
        self.write_script(f"#!/bin/sh\necho 127.0.0.1:{self.c.nodes['ha'][1]}:1\n"
                          "echo 'host two:x'\n")
        self.start()
        rc, out, err = self.finish()
        self.assertEqual(rc, 1, err)
        self.assertIn("failed on its first call: discovery output line 2:", err)
        self.assertIn("host two:x", err)

    def test_discovery_fails_later_and_recovers(self):
        self.c.node("ha")
        self.set_hosts(("ha", 2))
        count = os.path.join(self.dir, "count")
        # Calls 3 to 6 fail; the job goes on with the last host set.
        self.write_script(f"#!/bin/sh\nn=$(cat {count} 2>/dev/null || echo 0)\n"
                          f"echo $((n+1)) > {count}\n"
                          f"if [ $n -ge 2 ] && [ $n -le 5 ]; then echo flaky >&2; exit 1; fi\n"
                          f"cat {self.hosts_file}\n")
        self.start("--min-np", "2", steps=60)
        rc, out, err = self.finish()
        self.assertEqual(rc, 0, err)
        self.assertIn("warning: host discovery script", err)
        self.assertIn("keeping the last host set", err)
        self.check_run(out, 60)

    def test_non_elastic_program_runs(self):
        self.c.node("ha")
        self.set_hosts(("ha", 2))
        self.start("--min-np", "2", program=["sh", "-c", "echo rank=$HOROVOD_RANK "
                                             "elastic=$HOROVOD_ELASTIC"])
        rc, out, err = self.finish()
        self.assertEqual(rc, 0, err)
        self.assertIn("rank=0 elastic=1", out)
        self.assertIn("rank=1 elastic=1", out)

    def test_bad_flags(self):
        plain = os.path.join(self.dir, "plain")
        with open(plain, "w") as f:
            f.write("127.0.0.1:1\n")
        os.chmod(plain, 0o644)
        cases = [
            (["driver", "--min-np", "2", "-H", "127.0.0.1:1", "--", "true"],
             "--min-np belongs to elastic jobs"),
            (["driver", "--host-discovery-script", "/nonexistent", "--", "true"],
             "--host-discovery-script /nonexistent: No such file or directory"),
            (["driver", "--host-discovery-script", plain, "--", "true"],
             "not an executable file"),
            (["driver", "--host-discovery-script", self.script, "--blacklist-cooldown-range",
              "5", "2", "--", "true"], "need 1 <= LOW <= HIGH <= 3600"),
            (["driver", "--host-discovery-script", self.script, "--min-np", "4", "--max-np", "2",
              "--", "true"], "--max-np 2 is below the minimum of 4 ranks"),
            (["driver", "--host-discovery-script", self.script, "-H", "127.0.0.1:1", "--",
              "true"], "replaces -H/--hostfile"),
            (["driver", "--host-discovery-script", self.script, "--reset-limit", "-1", "--",
              "true"], "must not be negative"),
        ]
        for args, msg in cases:
            rc, out, err = self.c.run(args)
            self.assertNotEqual(rc, 0, args)
            self.assertIn(msg, err, args)


if __name__ == "__main__":
    sys.exit(run_suite(ElasticTest, sys.argv[1:], leftover_ranks))
