"""Cluster tests: real node agents (several per machine, each its own host) and a real
driver, checked from the ranks' own output. Run by `meson test`; prints a closing
'N passed, N failed' line."""

import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import (Cluster, command_ran, free_port, make_cluster, pids_matching, rank_envs,  # noqa: E402
                     rank_lines, read_line, run_suite, wait_until)


class ClusterTest(unittest.TestCase):
    def setUp(self):
        self.c = Cluster()
        self.addCleanup(self.c.close)
        self.marker = f"{time.monotonic_ns() % 10**9}"

    def sleeper(self, seconds=60):
        """A rank command that sleeps in a grandchild and is findable by its marker."""
        return ["sh", "-c", f"sleep {seconds}.{self.marker}; true"]

    def sleeping(self):
        return pids_matching(f"sleep 60.{self.marker}", prefix=True)

    def assert_no_ranks_left(self, timeout=5):
        wait_until(lambda: not pids_matching(f"60.{self.marker}"), timeout,
                   "every rank process to be gone")

    def layout(self, hosts, np):
        for name, _ in hosts:
            if name not in self.c.nodes:
                self.c.node(name)
        spec = ",".join(self.c.spec(n, s) for n, s in hosts)
        rc, out, err = self.c.run(["driver", "-np", str(np), "-H", spec, "--", "env"])
        self.assertEqual(rc, 0, err)
        envs = rank_envs(out)
        self.assertEqual(sorted(envs), list(range(np)), out)
        return envs

    def check_values(self, envs, expected):
        """expected: rank -> (host, local_rank, local_size, cross_rank, cross_size)."""
        for r, (host, lr, ls, cr, cs) in expected.items():
            e = envs[r]
            got = (e["HOROVOD_HOSTNAME"], int(e["HOROVOD_LOCAL_RANK"]),
                   int(e["HOROVOD_LOCAL_SIZE"]), int(e["HOROVOD_CROSS_RANK"]),
                   int(e["HOROVOD_CROSS_SIZE"]))
            self.assertEqual(got, (host, lr, ls, cr, cs), f"rank {r}")
            self.assertEqual(e["HOROVOD_RANK"], str(r))
            self.assertEqual(e["RANK"], str(r))
            self.assertEqual(e["LOCAL_RANK"], str(lr))
            self.assertEqual(e["LOCAL_WORLD_SIZE"], str(ls))

    # -- environment -----------------------------------------------------------------

    def test_run_mode_environment(self):
        rc, out, err = self.c.run(["run", "-np", "4", "--env", "EXTRA=x=1", "--", "env"])
        self.assertEqual(rc, 0, err)
        envs = rank_envs(out)
        self.assertEqual(sorted(envs), [0, 1, 2, 3])
        ports = {e["MASTER_PORT"] for e in envs.values()}
        self.assertEqual(len(ports), 1)
        for r, e in envs.items():
            self.assertEqual(e["HOROVOD_SIZE"], "4")
            self.assertEqual(e["WORLD_SIZE"], "4")
            self.assertEqual(e["HOROVOD_LOCAL_RANK"], str(r))
            self.assertEqual(e["HOROVOD_LOCAL_SIZE"], "4")
            self.assertEqual(e["HOROVOD_CROSS_RANK"], "0")
            self.assertEqual(e["HOROVOD_CROSS_SIZE"], "1")
            self.assertEqual(e["GROUP_RANK"], "0")
            self.assertEqual(e["HOROVOD_CONTROLLER"], "gloo")
            self.assertEqual(e["HOROVOD_CPU_OPERATIONS"], "gloo")
            self.assertEqual(e["MASTER_ADDR"], "127.0.0.1")
            self.assertEqual(e["HOROVOD_GLOO_IFACE"], "lo")
            self.assertEqual(e["EXTRA"], "x=1")
            self.assertEqual(e["PWD"], os.getcwd())
        self.assertTrue(0 < int(ports.pop()) < 65536)

    def test_balanced_two_by_two(self):
        envs = self.layout([("hostA", 2), ("hostB", 2)], 4)
        self.check_values(envs, {0: ("hostA", 0, 2, 0, 2), 1: ("hostA", 1, 2, 0, 2),
                                 2: ("hostB", 0, 2, 1, 2), 3: ("hostB", 1, 2, 1, 2)})
        self.assertEqual([envs[r]["GROUP_RANK"] for r in range(4)], ["0", "0", "1", "1"])
        self.assertEqual(len({e["MASTER_PORT"] for e in envs.values()}), 1)

    def test_imbalanced_three_plus_one_and_one_plus_three(self):
        envs = self.layout([("hostA", 3), ("hostB", 1)], 4)
        self.check_values(envs, {0: ("hostA", 0, 3, 0, 2), 1: ("hostA", 1, 3, 0, 1),
                                 2: ("hostA", 2, 3, 0, 1), 3: ("hostB", 0, 1, 1, 2)})
        envs = self.layout([("hostA", 1), ("hostB", 3)], 4)
        self.check_values(envs, {0: ("hostA", 0, 1, 0, 2), 1: ("hostB", 0, 3, 1, 2),
                                 2: ("hostB", 1, 3, 0, 1), 3: ("hostB", 2, 3, 0, 1)})

    def test_fewer_ranks_than_slots_use_the_first_hosts(self):
        envs = self.layout([("hostA", 2), ("hostB", 2)], 3)
        self.check_values(envs, {0: ("hostA", 0, 2, 0, 2), 1: ("hostA", 1, 2, 0, 1),
                                 2: ("hostB", 0, 1, 1, 2)})

    def test_hostfile(self):
        self.c.node("hostA")
        self.c.node("hostB")
        with tempfile.NamedTemporaryFile("w", suffix=".hosts") as f:
            f.write(f"# two hosts\n127.0.0.1:{self.c.nodes['hostA'][1]} slots=1\n\n"
                    f"127.0.0.1:{self.c.nodes['hostB'][1]} slots=1  # second\n")
            f.flush()
            rc, out, err = self.c.run(["driver", "-np", "2", "--hostfile", f.name, "--", "env"])
        self.assertEqual(rc, 0, err)
        envs = rank_envs(out)
        self.assertEqual(envs[0]["HOROVOD_HOSTNAME"], "hostA")
        self.assertEqual(envs[1]["HOROVOD_HOSTNAME"], "hostB")

    # -- output ------------------------------------------------------------------------

    def test_stalled_stdout_does_not_freeze_the_job(self):
        """Nobody reads the driver's stdout for 10 s while rank 0 floods it and rank 1
        fails: the job is torn down meanwhile (rank 2 stopped), the driver waits for the
        reader instead of dropping output, and every line it got arrives in order."""
        marker = f"1000.{self.marker}"
        prog = ["sh", "-c", "case $HOROVOD_RANK in 0) exec seq 1 5000000;; "
                f"1) sleep 1; exit 3;; *) exec sleep {marker};; esac"]
        p = self.c.start(["run", "-np", "3", "--kill-grace-seconds", "1", "--", *prog])
        t0 = time.monotonic()
        wait_until(lambda: pids_matching(f"sleep {marker}", prefix=True), 10, "rank 2 to start")
        wait_until(lambda: not pids_matching(f"sleep {marker}", prefix=True), 8,
                   "rank 2 to be stopped while the driver's stdout is not read")
        time.sleep(max(0.0, 10 - (time.monotonic() - t0)))
        self.assertIsNone(p.poll(), "the driver exited before its output was read")
        out, err = p.communicate(timeout=30)
        self.assertEqual(p.returncode, 3, err)
        self.assertRegex(err, r"rank 1 on host \S+ ended with exit code 3")
        nums = [int(x) for x in rank_lines(out).get(0, [])]
        # Each line is about 18 bytes with its tag, so a 64 KiB pipe holds ~3,600 of them:
        # more than 8,000 means the driver kept what it could not write while stdout was
        # stalled (a driver that dropped output would deliver one pipe buffer at most).
        # How much more depends on how the rank's writes were batched, hence no higher bar.
        self.assertGreater(len(nums), 8000, "not more than two pipe buffers of output")
        self.assertEqual(nums, list(range(1, len(nums) + 1)), "lines lost or reordered")

    def test_output_integrity_under_load(self):
        self.c.node("hostA")
        self.c.node("hostB")
        n = 100000
        script = (f"seq 1 {n}; seq 1 1000 >&2; "
                  "printf 'no newline at the end'")
        with tempfile.TemporaryDirectory() as d:
            rc, out, err = self.c.run(
                ["driver", "-np", "4", "-H", f"{self.c.spec('hostA', 2)},{self.c.spec('hostB', 2)}",
                 "--output-filename", d, "--", "sh", "-c", script], timeout=120)
            self.assertEqual(rc, 0, err[-2000:])
            expected = [str(i) for i in range(1, n + 1)] + ["no newline at the end"]
            lines = rank_lines(out)
            errs = rank_lines(err, "stderr")
            for r in range(4):
                self.assertEqual(lines[r], expected, f"rank {r} stdout")
                self.assertEqual(errs[r], [str(i) for i in range(1, 1001)], f"rank {r} stderr")
                with open(os.path.join(d, f"rank.{r}", "stdout")) as f:
                    self.assertEqual(f.read().splitlines(), expected)
                with open(os.path.join(d, f"rank.{r}", "stderr")) as f:
                    self.assertEqual(len(f.read().splitlines()), 1000)
        for line in out.splitlines():  # nothing but whole, prefixed lines
            self.assertRegex(line, r"^\[\d\]<stdout>:")

    # -- exits and teardown --------------------------------------------------------------

    def test_exit_code_of_the_first_failing_rank(self):
        self.c.node("hostA")
        self.c.node("hostB")
        spec = f"{self.c.spec('hostA', 2)},{self.c.spec('hostB', 2)}"
        script = f'if [ "$HOROVOD_RANK" = 2 ]; then exit 3; fi; exec sleep 60.{self.marker}'
        t0 = time.monotonic()
        rc, out, err = self.c.run(["driver", "-np", "4", "-H", spec, "--", "sh", "-c", script])
        self.assertEqual(rc, 3, err)
        self.assertIn("rank 2 on host hostB failed first: exit code 3", err)
        self.assertLess(time.monotonic() - t0, 5)  # the sleepers were stopped by SIGTERM
        self.assert_no_ranks_left()

    def test_signal_death_and_success(self):
        rc, _, err = self.c.run(["run", "-np", "2", "--", "sh", "-c",
                                 'if [ "$HOROVOD_RANK" = 1 ]; then kill -KILL $$; fi; sleep 0.2'])
        self.assertEqual(rc, 137, err)
        self.assertIn("rank 1", err)
        self.assertIn("signal 9", err)
        rc, _, err = self.c.run(["run", "-np", "3", "--", "true"])
        self.assertEqual(rc, 0, err)

    def test_ranks_stopped_while_starting_get_sigterm_not_the_grace_and_sigkill(self):
        # Rank 0 fails at once, so the others are stopped while some are still starting.
        # A stop that reached a shim before its command existed used to be lost: that rank
        # ran until SIGKILL after the grace (code 137, here 30 s).
        for attempt in range(20):
            rc, _, err = self.c.run(["run", "-np", "8", "--kill-grace-seconds", "30", "--",
                                     "sh", "-c", 'if [ "$HOROVOD_RANK" = 0 ]; then exit 3; fi; '
                                     "exec sleep 60"], timeout=60)
            self.assertEqual(rc, 3, err)
            summary = re.search(r"processes\s+8 \((.*)\)", err).group(1)
            self.assertNotIn("137", summary, f"attempt {attempt}: {err}")

    def test_a_rank_dies_with_its_shim_even_when_the_shim_is_sigkilled(self):
        # A batch system that kills a step's processes one by one may SIGKILL the shim
        # (caf-hvd-exec) before it can end the rank's group: the rank must not survive it.
        rank_cmd = f"sleep {100000 + int(self.marker) % 100000}"  # unique to this test
        p = self.c.start(["run", "-np", "1", "--", "sh", "-c", f"echo up; exec {rank_cmd}"])
        self.assertIn("up", read_line(p.stdout.fileno(), time.monotonic() + 30),
                      "no 'up' line within 30 s")
        wait_until(lambda: pids_matching(rank_cmd, prefix=True), 5, "the rank to exec")
        shims = [pid for pid in pids_matching("caf-hvd-exec")
                 if rank_cmd in open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace")
                 .replace("\0", " ")]
        self.assertEqual(len(shims), 1, shims)
        os.kill(shims[0], signal.SIGKILL)
        wait_until(lambda: not pids_matching(rank_cmd, prefix=True), 5,
                   "the rank to die with its shim")
        p.kill()
        p.communicate()

    def test_teardown_sigterm_then_sigkill_after_grace(self):
        # Rank 1 ignores SIGTERM and must be killed after the grace period; rank 2 exits
        # cleanly on SIGTERM and says so.
        script = ('case "$HOROVOD_RANK" in 0) sleep 0.5; exit 5;; '
                  "1) trap '' TERM; echo ready; while :; do sleep 0.1; done;; "
                  "2) trap 'echo got-term; exit 0' TERM; echo ready; "
                  "while :; do sleep 0.1; done;; esac")
        t0 = time.monotonic()
        rc, out, err = self.c.run(["run", "-np", "3", "--kill-grace-seconds", "1", "--",
                                   "sh", "-c", script])
        took = time.monotonic() - t0
        self.assertEqual(rc, 5, err)
        self.assertIn("got-term", rank_lines(out).get(2, []))
        self.assertGreater(took, 1.4)  # waited the grace period for rank 1
        self.assertLess(took, 6)

    def running_job(self, hosts, *options):
        """Starts node agents `hosts` (name -> slots) and a driver whose ranks sleep;
        returns the driver once every rank runs."""
        for name in hosts:
            self.c.node(name)
        spec = ",".join(self.c.spec(n, k) for n, k in hosts.items())
        np = sum(hosts.values())
        events = tempfile.NamedTemporaryFile(prefix="caf-hvd-events-", suffix=".jsonl",
                                             delete=False)
        events.close()
        self.addCleanup(os.unlink, events.name)
        p = self.c.start(["driver", "-np", str(np), "-H", spec, "--events", events.name,
                          *options, "--"] + self.sleeper())
        wait_until(lambda: len(self.sleeping()) == np, 10, f"all {np} ranks to run")

        def running_phase():
            # the driver's own view: every launch answered (a rank's process can exist
            # before its agent's answer reaches the driver)
            with open(events.name) as f:
                return any('"phase.begin"' in line and '"run"' in line for line in f)

        wait_until(running_phase, 10, "the driver's run phase (every rank's launch answered)")
        return p

    def interrupt(self, sig, code):
        p = self.running_job({"hostA": 1, "hostB": 1})
        p.send_signal(sig)
        _, err = p.communicate(timeout=15)
        self.assertEqual(p.returncode, code, err)
        self.assert_no_ranks_left()

    def test_ctrl_c_tears_down(self):
        self.interrupt(signal.SIGINT, 130)

    def test_sigterm_tears_down(self):
        self.interrupt(signal.SIGTERM, 143)

    def test_node_agent_killed_mid_job(self):
        p = self.running_job({"hostA": 2, "victim": 2})
        t0 = time.monotonic()
        os.kill(self.c.nodes["victim"][0].pid, signal.SIGKILL)
        _, err = p.communicate(timeout=15)
        self.assertLess(time.monotonic() - t0, 3)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("node victim", err)
        self.assertIn("lost", err)
        self.assert_no_ranks_left()  # the victim's ranks too, not only hostA's

    def test_node_agent_sigterm_stops_its_ranks_with_grace(self):
        """A node agent stopped with SIGTERM (a service restart) stops its ranks as the
        driver would: SIGTERM (rank 0 checkpoints and exits 7), the job's grace period,
        SIGKILL (rank 1 ignores SIGTERM); the driver reports them as stopped by the agent."""
        agent = self.c.node("ha")
        prog = ["sh", "-c", f': {self.marker}; if [ "$HOROVOD_RANK" = 0 ]; then '
                'trap "echo rank 0 checkpoints on SIGTERM; exit 7" TERM; '
                'else trap "" TERM; fi; echo ready; while :; do sleep 0.1; done']
        p = self.c.start(["driver", "-np", "2", "-H", self.c.spec("ha", 2), "--verbose",
                          "--kill-grace-seconds", "1", "--", *prog])
        deadline = time.monotonic() + 30
        ready = [read_line(p.stdout.fileno(), deadline), read_line(p.stdout.fileno(), deadline)]
        self.assertTrue(all("ready" in l for l in ready),
                        f"no two 'ready' lines within 30 s: {ready}")
        t0 = time.monotonic()
        self.c.nodes["ha"][0].send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
        self.assertEqual(p.returncode, 7, err)
        self.assertIn("[0]<stdout>:rank 0 checkpoints on SIGTERM", out)
        self.assertIn("rank 0 on host ha ended with exit code 7, stopped by its node agent "
                      "(node agent 'ha' received Terminated)", err)
        self.assertRegex(err, r"rank 1 on \S+ ended: signal 9 \(Killed\), stopped by its node "
                              r"agent \(node agent 'ha' received Terminated\)")
        self.assertEqual(self.c.nodes["ha"][0].wait(timeout=10), 0)
        self.assertLess(time.monotonic() - t0, 10)
        wait_until(lambda: not pids_matching(f": {self.marker};"), 5, "no rank left")
        del agent

    def test_static_job_on_a_draining_agent_is_told_at_once_and_fails_at_the_grace(self):
        """SIGTERM to an agent given --drain-grace (a spot VM's notice): a static job with
        ranks there is told at once (its ranks run on: a job that ends within the grace is
        not harmed), and when the grace ends with its rank still running the job fails,
        saying that the drain's grace stopped it, not that a node was lost."""
        self.c.node("ha", extra=["--drain-grace", "3"])
        self.c.node("hb")
        prog = ["sh", "-c", f': {self.marker}; echo ready; while :; do sleep 0.1; done']
        p = self.c.start(["driver", "-np", "2", "-H",
                          f'{self.c.spec("ha", 1)},{self.c.spec("hb", 1)}',
                          "--kill-grace-seconds", "1", "--", *prog])
        deadline = time.monotonic() + 30
        ready = [read_line(p.stdout.fileno(), deadline), read_line(p.stdout.fileno(), deadline)]
        self.assertTrue(all("ready" in l for l in ready),
                        f"no two 'ready' lines within 30 s: {ready}")
        self.c.nodes["ha"][0].send_signal(signal.SIGTERM)
        told = read_line(p.stderr.fileno(), time.monotonic() + 30)
        told_at = time.monotonic()
        self.assertEqual(told.strip(), "caf-hvd: warning: node ha drains (its agent received "
                         "SIGTERM and stops within 3 s (--drain-grace)); this job's 1 rank there "
                         "run on, and the job fails if the node stops them")
        out, err = p.communicate(timeout=30)
        self.assertGreater(time.monotonic() - told_at, 2)  # told before the grace, not at it
        self.assertEqual(p.returncode, 143, err)
        self.assertIn("rank 0 on host ha ended with signal 15 (Terminated), stopped by its node "
                      "agent (node agent 'ha' was drained (SIGTERM) and its --drain-grace of 3 s "
                      "ended)", err)
        self.assertNotIn("was lost", err)
        self.assertEqual(self.c.nodes["ha"][0].wait(timeout=10), 0)
        self.assert_no_ranks_left(timeout=10)

    def test_hung_node_agent_fails_the_job_within_its_link_timeout(self):
        p = self.running_job({"hostA": 1, "frozen": 1}, "--start-timeout", "60",
                             "--link-timeout", "3")
        frozen = self.c.nodes["frozen"][0]
        os.kill(frozen.pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            _, err = p.communicate(timeout=20)
            self.assertLess(time.monotonic() - t0, 8)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn("node frozen", err)
        finally:
            os.kill(frozen.pid, signal.SIGCONT)
        # Once it runs again, the agent notices the driver is gone and stops its rank.
        self.assert_no_ranks_left(timeout=10)

    def test_agent_paused_for_less_than_the_link_timeout_is_not_lost(self):
        """A loaded or stolen-from machine can pause a process for seconds; an agent
        silent for less than --link-timeout (default 10 s) keeps its job, on both ends:
        the driver keeps the agent and the agent keeps the driver."""
        for name in ("hostA", "paused"):
            self.c.node(name)
        spec = f"{self.c.spec('hostA', 1)},{self.c.spec('paused', 1)}"
        p = self.c.start(["driver", "-np", "2", "-H", spec, "--",
                          "sh", "-c", f"sleep 8.{self.marker}; echo done"])
        wait_until(lambda: len(pids_matching(f"sleep 8.{self.marker}", prefix=True)) == 2, 10,
                   "both ranks to run")
        paused = self.c.nodes["paused"][0]
        os.kill(paused.pid, signal.SIGSTOP)
        try:
            time.sleep(4.5)  # above the 3 s that counted as lost before --link-timeout
        finally:
            os.kill(paused.pid, signal.SIGCONT)
        out, err = p.communicate(timeout=30)
        self.assertEqual(p.returncode, 0, err)
        self.assertNotIn("lost", err)
        self.assertEqual(sorted(rank_lines(out)), [0, 1], out)
        self.assertEqual(paused.poll(), None, "the paused agent must still run")

    def test_driver_paused_for_longer_than_the_agents_link_timeout(self):
        """The agents' own --link-timeout: a driver stopped (Ctrl-Z) for longer counts
        as dead and the agent stops that job's ranks."""
        self.c.node("short", extra=["--link-timeout", "2"])
        p = self.c.start(["driver", "-np", "1", "-H", self.c.spec("short", 1), "--"]
                         + self.sleeper())
        wait_until(lambda: len(self.sleeping()) == 1, 10, "the rank to run")
        os.kill(p.pid, signal.SIGSTOP)
        try:
            # the stopped driver's own command line names the rank's command too
            wait_until(lambda: not self.sleeping(), 10, "the agent to stop the rank")
        finally:
            os.kill(p.pid, signal.SIGCONT)
        _, err = p.communicate(timeout=20)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("node short", err)
        self.assertIn("driver lost; stopping its 1 ranks",
                      self.c.nodes["short"][0].stdout.readline())

    def test_driver_killed_agents_stop_the_job_and_stay_up(self):
        p = self.running_job({"hostA": 1, "hostB": 1})
        spec = f"{self.c.spec('hostA', 1)},{self.c.spec('hostB', 1)}"
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        self.assert_no_ranks_left(timeout=10)
        rc, out, err = self.c.run(["driver", "-np", "2", "-H", spec, "--", "hostname"])
        self.assertEqual(rc, 0, err)
        self.assertEqual(sorted(rank_lines(out)), [0, 1])

    def test_run_mode_sigkill_leaves_no_rank_behind(self):
        p = self.c.start(["run", "-np", "3", "--"] + self.sleeper())
        wait_until(lambda: len(self.sleeping()) == 3, 10, "all 3 ranks to run")
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        self.assert_no_ranks_left()

    # -- a real collective under the launcher ---------------------------------------------

    def allreduce(self, hosts):
        allreduce = os.environ.get("CAF_HVD_ALLREDUCE", "caf-hvd-allreduce")
        for name in hosts:
            self.c.node(name)
        spec = ",".join(self.c.spec(n, k) for n, k in hosts.items())
        np = sum(hosts.values())
        rc, out, err = self.c.run(["driver", "-np", str(np), "-H", spec, "--", allreduce,
                                   "--sizes", "4K,1M,4M"], timeout=120)
        self.assertEqual(rc, 0, err)
        lines = rank_lines(out)
        self.assertIn("caf-hvd-allreduce: all sums correct (3 sizes x global/local/cross)",
                      lines[0])
        for r in range(np):
            self.assertTrue(lines[r][0].startswith(f"rank {r}/{np} on "), lines[r])
        return lines

    def test_allreduce_balanced_two_by_two(self):
        lines = self.allreduce({"hostA": 2, "hostB": 2})
        self.assertIn("local 1/2, cross 1/2", lines[3][0])

    def test_allreduce_imbalanced_three_plus_one(self):
        lines = self.allreduce({"hostA": 3, "hostB": 1})
        self.assertIn("on hostB: local 0/1, cross 1/2", lines[3][0])
        self.assertIn("local 2/3, cross 0/1", lines[2][0])

    def test_allreduce_three_hosts_one_two_one(self):
        lines = self.allreduce({"hostA": 1, "hostB": 2, "hostC": 1})
        self.assertIn("on hostC: local 0/1, cross 2/3", lines[3][0])
        self.assertIn("on hostB: local 1/2, cross 0/1", lines[2][0])

    def test_horovods_python_client_against_the_jobs_server(self):
        # Horovod's http_client: urllib PUT of base64 bodies, GET, 404 as an error.
        client = r"""
import base64, os, urllib.request, urllib.error
base = "http://%s:%s" % (os.environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"],
                         os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"])
r = os.environ["HOROVOD_RANK"]
body = base64.b64encode(b"value-of-" + r.encode())
urllib.request.urlopen(urllib.request.Request(base + "/runfunc/" + r, data=body,
                                              method="PUT")).read()
got = base64.b64decode(urllib.request.urlopen(base + "/runfunc/" + r).read())
assert got == b"value-of-" + r.encode(), got
try:
    urllib.request.urlopen(base + "/runfunc/missing")
    raise SystemExit("missing key did not fail")
except urllib.error.HTTPError as e:
    assert e.code == 404
urllib.request.urlopen(urllib.request.Request(base + "/runfunc/" + r, method="DELETE")).read()
print("client ok", os.environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"])
"""
        rc, out, err = self.c.run(["run", "-np", "2", "--", sys.executable, "-c", client])
        self.assertEqual(rc, 0, err)
        for r in (0, 1):
            self.assertEqual(rank_lines(out)[r], ["client ok 127.0.0.1"])

    def test_a_rendezvous_scope_is_kept_until_its_last_rank_finishes(self):
        """Horovod's finish (DELETE /global/<rank>) of the first rank must not clear the
        scope under a rank that still reads it; the last rank's finish clears it. Rank 1
        reads rank 0's key only after rank 0 has finished (rank 0's file says so), then
        finishes itself and sees the scope gone."""
        gate = tempfile.mkdtemp(prefix="caf-hvd-scope-")
        self.addCleanup(shutil.rmtree, gate, True)
        client = r"""
import base64, os, sys, time, urllib.request, urllib.error
base = "http://%s:%s/global/" % (os.environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"],
                                 os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"])
r, gate = os.environ["HOROVOD_RANK"], sys.argv[1]
def put(k, v):
    urllib.request.urlopen(urllib.request.Request(base + k, data=base64.b64encode(v),
                                                  method="PUT")).read()
def get(k):
    try:
        return base64.b64decode(urllib.request.urlopen(base + k).read())
    except urllib.error.HTTPError as e:
        return e.code
def finish():
    urllib.request.urlopen(urllib.request.Request(base + r, method="DELETE")).read()
def wait_for(what, ok, seconds=20):
    end = time.monotonic() + seconds
    while not ok():
        if time.monotonic() > end:
            raise SystemExit("rank %s: no %s within %d s" % (r, what, seconds))
        time.sleep(0.02)
put(r, b"address-of-" + r.encode())
other = "1" if r == "0" else "0"
wait_for("key of rank " + other, lambda: get(other) != 404)
if r == "0":
    finish()
    open(os.path.join(gate, "rank-0-finished"), "w").close()
    print("finished")
else:
    wait_for("finish of rank 0", lambda: os.path.exists(os.path.join(gate, "rank-0-finished")))
    print("after rank 0's finish:", get("0"))
    finish()
    print("after the last finish:", get("0"))
"""
        rc, out, err = self.c.run(["run", "-np", "2", "--", sys.executable, "-c", client, gate])
        self.assertEqual(rc, 0, err)
        self.assertEqual(rank_lines(out)[0], ["finished"], out)
        self.assertEqual(rank_lines(out)[1], ["after rank 0's finish: b'address-of-0'",
                                              "after the last finish: 404"], out)

    def test_allreduce_reports_a_dead_peer_instead_of_hanging(self):
        allreduce = os.environ.get("CAF_HVD_ALLREDUCE", "caf-hvd-allreduce")
        # Rank 1's allreduce is killed mid-benchmark; rank 0 ignores the launcher's
        # SIGTERM so that its own error report can be observed within the grace period.
        # Rank 1 waits until its contexts are connected (its line-buffered "rank 1/2"
        # line), not a fixed time, so that a slow machine still kills it mid-benchmark.
        script = ('if [ "$HOROVOD_RANK" = 1 ]; then f=$(mktemp); '
                  f'stdbuf -oL {allreduce} --bench --sizes 16M --iters 100000 >"$f" & p=$!; '
                  'i=0; until grep -q "^rank 1/2" "$f"; do i=$((i+1)); '
                  '[ $i -gt 300 ] && echo "rank 1 never connected" && exit 8; sleep 0.1; done; '
                  'sleep 0.5; kill -9 $p; rm -f "$f"; exit 9; fi; '
                  f"trap '' TERM; {allreduce} --bench --sizes 16M --iters 100000; "
                  'echo "allreduce exit=$?"')
        t0 = time.monotonic()
        rc, out, err = self.c.run(["run", "-np", "2", "--kill-grace-seconds", "20", "--",
                                   "sh", "-c", script], timeout=60)
        self.assertEqual(rc, 9, err)
        self.assertIn("allreduce exit=1", rank_lines(out).get(0, []), out)
        self.assertIn("rank 0: benchmark of 16M failed (peer: rank 1)", err)
        self.assertLess(time.monotonic() - t0, 15)

    # -- admission and hostile input ----------------------------------------------------

    def node_log(self, name):
        """What a node agent printed so far (non-blocking)."""
        p = self.c.nodes[name][0]
        os.set_blocking(p.stdout.fileno(), False)
        text = p.stdout.read() or ""
        return text

    def test_only_drivers_of_the_cluster_can_spawn(self):
        self.c.node("guarded")
        spec = self.c.spec("guarded", 1)
        with tempfile.TemporaryDirectory() as other:
            foreign = make_cluster(os.path.join(other, "c"))
            rc, _, err = self.c.run(["driver", "--cluster-dir", foreign, "-np", "1", "-H", spec,
                                     "--", "touch", f"/tmp/pwned.{self.marker}"])
        self.assertEqual(rc, 1, err)
        self.assertIn("TLS handshake failed", err)
        rc, _, err = self.c.run(["driver", "--insecure", "-np", "1", "-H", spec, "--", "touch",
                                 f"/tmp/pwned.{self.marker}"])
        self.assertEqual(rc, 1, err)
        self.assertIn("requires TLS", err)
        port = self.c.nodes["guarded"][1]
        # an anonymous TLS client (openssl's, which scripts/setup.sh installs): refused for
        # the certificate it did not give
        probe = subprocess.run(["openssl", "s_client", "-connect", f"127.0.0.1:{port}"],
                               input="x", capture_output=True, text=True, timeout=10)
        self.assertIn("CONNECTED", probe.stdout, probe.stderr)
        with socket.create_connection(("127.0.0.1", port)) as s:  # plain bytes
            s.sendall(b"\x00\x00\x00\x10garbage-garbage-garbage")
            s.settimeout(5)
            try:
                s.recv(100)
            except OSError:
                pass
        self.assertFalse(os.path.exists(f"/tmp/pwned.{self.marker}"))
        rc, out, err = self.c.run(["driver", "-np", "1", "-H", spec, "--", "echo", "admitted"])
        self.assertEqual(rc, 0, err)
        self.assertEqual(rank_lines(out)[0], ["admitted"])
        log = self.node_log("guarded")
        self.assertRegex(log, r"refused 127\.0\.0\.1:\d+: TLS handshake failed \(.*peer did not "
                              r"return a certificate\)")
        self.assertRegex(log, r"refused 127\.0\.0\.1:\d+: TLS handshake failed \(.*wrong version "
                              r"number\)")

    def cluster_cmd(self, *args):
        r = subprocess.run([harness.CAF_HVD, "cluster", *args], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout

    def test_certificate_roles_and_revocation(self):
        with tempfile.TemporaryDirectory() as d:
            c = make_cluster(os.path.join(d, "c"))
            self.cluster_cmd("add-node", "h1", c)
            self.cluster_cmd("add-node", "h2", c)
            for who in ("alice", "bob"):
                self.cluster_cmd("add-driver", who, c, "--out", f"{d}/{who}")
            h1, h2 = f"{c}/issued/h1", f"{c}/issued/h2"
            self.c.node("h1", extra=["--cluster-dir", h1])
            port = self.c.nodes["h1"][1]
            spec = self.c.spec("h1", 1)
            touch = ["--", "touch", f"/tmp/pwned.{self.marker}"]

            def drive(creds, *cmd):
                return self.c.run(["driver", "--cluster-dir", creds, "-np", "1", "-H", spec,
                                   *(cmd or touch)])

            rc, out, err = drive(f"{d}/alice", "--", "echo", "alice")
            self.assertEqual(rc, 0, err)
            self.assertEqual(rank_lines(out)[0], ["alice"])

            # h2's node key (a joining agent's, or one stolen) connects to h1, as joining
            # needs, but cannot make it run anything: no colocator without a driver's
            # ticket for h1 and the job, no worker spawned from outside.
            attack = os.environ.get("CAF_HVD_SPAWN_ATTACK") or os.path.join(
                os.path.dirname(os.path.dirname(harness.CAF_HVD)), "tests", "caf-hvd-spawn-attack")
            marker = f"/tmp/pwned.{self.marker}"
            r = subprocess.run([attack, h2, "127.0.0.1", str(port), marker, f"{d}/alice"],
                               capture_output=True, text=True, timeout=120)
            self.assertEqual(r.returncode, 0, r.stderr)
            out = r.stdout
            self.assertIn("connect: ok", out)
            self.assertRegex(out, r"node 1: .*node agent 'h1' refused to run job pwn for this peer: "
                                  r"its driver ticket did not check out: the ticket carries no "
                                  r"certificate")
            self.assertRegex(out, r"node 2: .*its certificate 'h2' is a node certificate, not a "
                                  r"driver one")
            # alice's own tickets, made for another agent (another certificate for h1's node
            # id; another node id): refused for their audience
            for step in (3, 4):
                self.assertRegex(out, rf"node {step}: .*node agent 'h1' refused to run job pwn "
                                      rf"for this peer: .*not for colocator at")
            for step in (1, 2, 3, 4):
                self.assertIn(f"workers {step}: 0", out)
                self.assertRegex(out, rf"launch {step}: .*refused to run job pwn")
            # workers are not offered for remote spawn: CAF's spawn server knows no such type
            self.assertIn("worker spawn: system_error(unknown_type)", out)
            self.assertNotIn("served as", out)
            # each launch above was answered, and an answer comes after the spawn
            self.assertFalse(command_ran(marker), "the attacker's command ran")
            # caf-hvd itself will not drive with a node directory.
            rc, _, err = drive(h2)
            self.assertEqual(rc, 1, err)
            self.assertIn("holds no driver certificate", err)

            # A "node agent" presenting a driver certificate is refused by the driver.
            server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            server.load_cert_chain(f"{d}/bob/driver.pem", f"{d}/bob/driver.key")
            server.load_verify_locations(f"{c}/ca.pem")
            server.verify_mode = ssl.CERT_REQUIRED
            fake = socket.create_server(("127.0.0.1", 0))
            fake.settimeout(20)

            def serve():
                for _ in range(3):  # the reachability check, then the handshake
                    try:
                        conn, _ = fake.accept()
                    except OSError:
                        return
                    try:
                        with server.wrap_socket(conn, server_side=True) as t:
                            t.recv(1)
                    except (ssl.SSLError, OSError):
                        pass

            threading.Thread(target=serve, daemon=True).start()
            try:
                rc, _, err = self.c.run(["driver", "--cluster-dir", f"{d}/alice", "-np", "1",
                                         "-H", f"127.0.0.1:{fake.getsockname()[1]}:1", *touch])
            finally:
                fake.close()
            self.assertEqual(rc, 1, err)
            self.assertIn("certificate 'bob' is a driver certificate; a driver connects only to "
                          "node agents", err)

            # Revoked: bob runs nothing from the moment the list is in the agent's directory
            # (his ticket is checked against it), and his handshake is refused once the
            # agent reloads it; alice still drives, and the agent keeps running.
            out = self.cluster_cmd("revoke", "bob", c)
            self.assertIn("revoked 1 certificate(s) named 'bob'", out)
            self.assertTrue(os.path.exists(f"{h1}/crl.pem"))
            rc, _, err = drive(f"{d}/bob", "--", "echo", "before-reload")
            self.assertEqual(rc, 1, err)
            self.assertIn("its certificate 'bob' is not valid in this cluster: certificate revoked",
                          err)
            agent = self.c.nodes["h1"][0]
            os.kill(agent.pid, signal.SIGHUP)
            log = ""
            deadline = time.monotonic() + 10
            while "reloaded the credentials" not in log and time.monotonic() < deadline:
                time.sleep(0.1)
                log += self.node_log("h1")
            self.assertIn("reloaded the credentials", log)
            rc, _, err = drive(f"{d}/bob")
            self.assertEqual(rc, 1, err)
            self.assertIn("the node agent refused this driver's certificate: the cluster "
                          "revoked it", err)
            rc, out, err = drive(f"{d}/alice", "--", "echo", "still")
            self.assertEqual(rc, 0, err)
            self.assertEqual(rank_lines(out)[0], ["still"])
            self.assertIsNone(agent.poll())
            log += self.node_log("h1")
            self.assertIn("refused to run job pwn for this peer", log)
            self.assertRegex(log, r"certificate 'bob' \(serial [0-9A-F]+\) is revoked")
            self.assertFalse(os.path.exists(f"/tmp/pwned.{self.marker}"))

    def test_an_agent_of_another_version_is_refused_naming_both_versions(self):
        """A rolling upgrade meets an agent of another caf-hvd version (a peer whose
        handshake names application id caf-hvd/2): a driver and a joining agent both stop at
        once with an error that names both versions and the agent's address, not a timeout
        or a bare CAF error code."""
        forge = os.environ.get("CAF_HVD_BASP_FORGE") or os.path.join(
            os.path.dirname(os.path.dirname(harness.CAF_HVD)), "tests", "caf-hvd-basp-forge")
        with tempfile.TemporaryDirectory() as d:
            c = make_cluster(os.path.join(d, "c"))
            self.cluster_cmd("add-node", "old", c)
            self.cluster_cmd("add-node", "new", c)
            self.cluster_cmd("add-driver", "alice", c, "--out", f"{d}/alice")
            portfile = os.path.join(d, "port")
            old = subprocess.Popen([forge, f"{c}/issued/old", "node", "--serve-version",
                                    "caf-hvd/2", portfile], stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, start_new_session=True)
            self.addCleanup(harness.reap, [old])
            deadline = time.monotonic() + 10
            while not (os.path.exists(portfile) and open(portfile).read().strip()):
                self.assertIsNone(old.poll(), old.stdout.read() if old.poll() is not None else "")
                self.assertLess(time.monotonic(), deadline, "the old agent never listened")
                time.sleep(0.05)
            port = int(open(portfile).read())
            both = (rf"version caf-hvd/\d+ \(this caf-hvd\) refuses version caf-hvd/2 \(the "
                    rf"agent at 127\.0\.0\.1:{port}\): upgrade both ends to the same release")
            rc, out, err = self.c.run(["driver", "--cluster-dir", f"{d}/alice", "-np", "1", "-H",
                                       f"127.0.0.1:{port}:1", "--", "true"])
            self.assertEqual(rc, 1, out + err)
            self.assertRegex(err, both)
            # a new agent joining an old table gives up on its first try, saying the same
            r = subprocess.run([harness.CAF_HVD, "node", "--name", "new", "--port", "0",
                                "--bind", "127.0.0.1", "--cluster-dir", f"{c}/issued/new",
                                "--join", f"127.0.0.1:{port}"],
                               capture_output=True, text=True, timeout=60)
            self.assertNotEqual(r.returncode, 0, r.stderr)
            self.assertRegex(r.stderr, r"cannot join the cluster at 127\.0\.0\.1:\d+: " + both)
            # and so does `caf-hvd status`
            r = subprocess.run([harness.CAF_HVD, "status", "--cluster", f"127.0.0.1:{port}",
                                "--cluster-dir", f"{d}/alice"],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
            self.assertRegex(r.stderr, r"cannot reach the cluster at 127\.0\.0\.1:\d+: " + both)

    def test_a_cluster_on_one_machine_runs_jobs_across_its_agents(self):
        """Three agents on one machine, the second and third joined over 127.0.0.1: the
        table lists its own agent at the machine's address and the members at the
        loopback address they joined from. Those addresses are all this machine's, so a
        job placed across them runs (it was refused: "reached at a loopback address,
        which the job's other hosts cannot reach"), static and elastic, with a real Gloo
        allreduce that checks every element."""
        port = free_port()
        agents = []

        def agent(name, *extra):
            p = self.c.start(["node", "--name", name, "--port", str(port if not extra else 0),
                              "--slots", "2", *extra],
                             env=dict(os.environ, CAF_HVD_CLUSTER_DIR=harness.issue("node", name)))
            line = p.stdout.readline()
            self.assertIn("listening", line)
            agents.append(p)
            return p

        agent("one-a")  # every address: the table lists it at the machine's own
        for name in ("one-b", "one-c"):
            agent(name, "--bind", "127.0.0.1", "--join", f"127.0.0.1:{port}")

        def members():
            rc, out, _ = self.c.run(["status", "--cluster", f"127.0.0.1:{port}", "--json"])
            return json.loads(out)["nodes"] if rc == 0 else []

        wait_until(lambda: len([n for n in members() if n["state"] == "alive"]) == 3, 20,
                   "both members to join the table")
        addresses = {n["name"]: n["address"] for n in members()}
        self.assertEqual(addresses["one-b"], "127.0.0.1", addresses)
        allreduce = os.environ.get("CAF_HVD_ALLREDUCE", "caf-hvd-allreduce")
        # every slot: the table's own agent and both members
        rc, out, err = self.c.run(["driver", "--cluster", f"127.0.0.1:{port}", "-np", "6", "--",
                                   allreduce], timeout=120)
        self.assertEqual(rc, 0, err)
        self.assertIn("caf-hvd-allreduce: all sums correct", out)
        hosts = {line.split(" on ")[1].split(":")[0]
                 for lines in rank_lines(out).values() for line in lines if " on " in line}
        self.assertEqual(hosts, {"one-a", "one-b", "one-c"}, out)
        rc, out, err = self.c.run(["driver", "--cluster", f"127.0.0.1:{port}", "--min-np", "2",
                                   "--max-np", "6", "--", allreduce, "--elastic", "--steps",
                                   "10"], timeout=120)
        self.assertEqual(rc, 0, err)
        self.assertRegex(out, r"elastic run done: 10 steps, checksum 55")
        for p in agents:
            p.terminate()
        for p in agents:
            p.wait(timeout=30)

    def test_pre_role_member_certificates_work_with_a_warning(self):
        if not shutil.which("openssl"):
            self.skipTest("the openssl command is needed to make a pre-role certificate")
        with tempfile.TemporaryDirectory() as d:
            c = make_cluster(os.path.join(d, "c"))
            old = os.path.join(d, "old")
            os.mkdir(old, 0o700)
            shutil.copy(f"{c}/ca.pem", old)
            with open(f"{d}/ext", "w") as f:
                f.write("basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                        "extendedKeyUsage=serverAuth,clientAuth\n")
            subprocess.run(["openssl", "req", "-new", "-newkey", "ec", "-pkeyopt",
                            "ec_paramgen_curve:P-256", "-nodes", "-keyout", f"{old}/member.key",
                            "-subj", "/O=caf-hvd cluster/CN=caf-hvd member", "-out", f"{d}/csr"],
                           check=True, capture_output=True)
            subprocess.run(["openssl", "x509", "-req", "-in", f"{d}/csr", "-CA", f"{c}/ca.pem",
                            "-CAkey", f"{c}/ca.key", "-set_serial", "0x51", "-days", "30",
                            "-extfile", f"{d}/ext", "-out", f"{old}/member.pem"],
                           check=True, capture_output=True)
            os.chmod(f"{old}/member.key", 0o600)
            self.cluster_cmd("add-node", "fresh", c)
            self.c.node("fresh", extra=["--cluster-dir", f"{c}/issued/fresh"])
            rc, out, err = self.c.run(["driver", "--cluster-dir", old, "-np", "1", "-H",
                                       self.c.spec("fresh", 1), "--", "echo", "legacy"])
            self.assertEqual(rc, 0, err)
            self.assertEqual(rank_lines(out)[0], ["legacy"])
            self.assertIn("member.pem is a pre-role member certificate", err)
            time.sleep(0.2)
            self.assertIn("presented a pre-role member certificate ('caf-hvd member', serial 51)",
                          self.node_log("fresh"))
            # Revoked by its file (no index knows it): refused after the agent's reload.
            out = self.cluster_cmd("revoke", f"{old}/member.pem", c)
            self.assertIn("(serial 51)", out)
            os.kill(self.c.nodes["fresh"][0].pid, signal.SIGHUP)
            deadline = time.monotonic() + 10
            log = ""
            while "reloaded the credentials" not in log and time.monotonic() < deadline:
                time.sleep(0.1)
                log += self.node_log("fresh")
            rc, _, err = self.c.run(["driver", "--cluster-dir", old, "-np", "1", "-H",
                                     self.c.spec("fresh", 1), "--", "true"])
            self.assertEqual(rc, 1, err)
            self.assertIn("the cluster revoked it", err)

    def test_insecure_on_both_sides_works_with_a_warning(self):
        p = self.c.start(["node", "--port", "0", "--name", "open", "--bind", "127.0.0.1",
                          "--insecure"])
        line = p.stdout.readline()
        self.assertIn("(INSECURE)", line)
        port = int(re.search(r":(\d+) \(", line).group(1))
        rc, out, err = self.c.run(["driver", "--insecure", "-np", "1", "-H",
                                   f"127.0.0.1:{port}:1", "--", "echo", "plain"])
        self.assertEqual(rc, 0, err)
        self.assertIn("WARNING: --insecure", err)
        self.assertEqual(rank_lines(out)[0], ["plain"])
        # A driver of the cluster refuses to talk to an agent without TLS.
        rc, _, err = self.c.run(["driver", "-np", "1", "-H", f"127.0.0.1:{port}:1", "--",
                                 "true"])
        self.assertEqual(rc, 1, err)

    def test_node_listens_on_one_port_only(self):
        port = self.c.node("single")
        pid = self.c.nodes["single"][0].pid
        inodes = set()
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
        listening = set()
        for table in ("tcp", "tcp6", "udp", "udp6"):
            with open(f"/proc/{pid}/net/{table}") as f:
                for line in f.readlines()[1:]:
                    fields = line.split()
                    if fields[9] in inodes and (fields[3] == "0A" or table.startswith("udp")):
                        listening.add(int(fields[1].rsplit(":", 1)[1], 16))
        self.assertEqual(listening, {port})  # no automatic-connections port, nothing else

    def test_credentials_errors_are_clear(self):
        with tempfile.TemporaryDirectory() as d:
            missing = os.path.join(d, "none")
            self.assert_fails(["node", "--cluster-dir", missing], 1,
                              f"no cluster credentials in {missing}", "caf-hvd cluster init")
            c = make_cluster(os.path.join(d, "c"))
            os.chmod(os.path.join(c, "node.key"), 0o644)
            self.assert_fails(["node", "--cluster-dir", c], 1, "node.key is accessible by "
                              "other users (mode 644)")
            os.chmod(os.path.join(c, "node.key"), 0o600)
            with open(os.path.join(c, "driver.pem"), "w") as f:
                f.write("not a certificate\n")
            self.assert_fails(["driver", "--cluster-dir", c, "-np", "1", "-H", "127.0.0.1:1",
                               "--", "true"], 1, "driver.pem is not a PEM certificate")
            self.assert_fails(["cluster", "init", c], 1, "refusing to overwrite")
        self.assert_fails(["node", "--insecure", "--cluster-dir", "/x"], 2, "exclude each other")

    def test_hostile_clients_while_a_job_runs(self):
        allreduce = os.environ.get("CAF_HVD_ALLREDUCE", "caf-hvd-allreduce")
        self.c.node("hostA")
        self.c.node("hostB")
        spec = f"{self.c.spec('hostA', 1)},{self.c.spec('hostB', 1)}"
        script = ('[ "$HOROVOD_RANK" = 0 ] && echo "port=$HOROVOD_GLOO_RENDEZVOUS_PORT"; '
                  f"sleep 2; exec {allreduce} --sizes 4K,1M")
        p = self.c.start(["driver", "-np", "2", "-H", spec, "--", "sh", "-c", script])
        line = read_line(p.stdout.fileno(), time.monotonic() + 60)
        self.assertIn("port=", line, "no rank 0 line within 60 s")
        rdv = int(line.strip().rsplit("=", 1)[1])
        socks = []
        try:
            for port in (rdv, self.c.nodes["hostA"][1]):
                for i in range(40):
                    s = socket.create_connection(("127.0.0.1", port))
                    if i % 4 == 0:
                        s.sendall(os.urandom(512))       # garbage
                    elif i % 4 == 1:
                        s.sendall(b"PUT /global/0 HTTP/1.1\r\nContent-Length: 99")  # half
                    elif i % 4 == 2:
                        s.sendall(b"G")                  # slow: one byte, then silence
                    socks.append(s)                      # i % 4 == 3: idle
            out, err = p.communicate(timeout=60)
        finally:
            for s in socks:
                s.close()
        self.assertEqual(p.returncode, 0, err + "\nnode hostA said:\n" + self.node_log("hostA"))
        self.assertIn("caf-hvd-allreduce: all sums correct", out)

    def test_connection_flood_on_the_node_port(self):
        # Idle TLS connections that never handshake are shut down after 5 s; a driver
        # that meets the flood retries its handshake and gets through, well before the
        # idle ones are gone: the agent keeps accepting while hundreds of handshakes wait
        # (it took in 30 connections a second when it slept on every one of them, and a
        # driver queued behind 600 was locked out for 20 s and more)
        port = self.c.node("flooded")
        socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(600)]
        try:
            rc, out, err = self.c.run(["driver", "-np", "1", "-H", self.c.spec("flooded", 1),
                                       "--start-timeout", "10", "--", "echo", "through"],
                                      timeout=60)
            self.assertEqual(rc, 0, err)
            self.assertEqual(rank_lines(out)[0], ["through"])
            pid = self.c.nodes["flooded"][0].pid
            wait_until(lambda: len(os.listdir(f"/proc/{pid}/fd")) < 100, 15,
                       "the node to drop the idle connections")
        finally:
            for s in socks:
                s.close()

    # -- bad input -----------------------------------------------------------------------

    def assert_fails(self, args, code, *needles):
        rc, out, err = self.c.run(args, timeout=30)
        self.assertEqual(rc, code, f"{args}: {err}")
        for n in needles:
            self.assertIn(n, err)

    def test_sixteen_agents_by_four_every_rank_in_its_place(self):
        for i in range(16):
            self.c.node(f"q{i:02d}")
        hosts = ",".join(self.c.spec(f"q{i:02d}", 4) for i in range(16))
        show = ("echo $HOROVOD_RANK $HOROVOD_SIZE $HOROVOD_LOCAL_RANK $HOROVOD_LOCAL_SIZE "
                "$HOROVOD_CROSS_RANK $HOROVOD_CROSS_SIZE $HOROVOD_HOSTNAME $RANK $LOCAL_RANK "
                "$GROUP_RANK")
        rc, out, err = self.c.run(["driver", "-H", hosts, "-np", "64", "--quiet", "--",
                                   "sh", "-c", show], timeout=120)
        self.assertEqual(rc, 0, err)
        got = rank_lines(out)
        self.assertEqual(sorted(got), list(range(64)))
        for r in range(64):
            h, lr = divmod(r, 4)
            self.assertEqual(got[r], [f"{r} 64 {lr} 4 {h} 16 q{h:02d} {r} {lr} {h}"], r)

    def test_hosts_from_a_slurm_allocation(self):
        # Two agents at the default port on two loopback addresses stand for two nodes
        # of a Slurm allocation; the driver gets no -H.
        default_port = 24780
        for addr in ("127.0.0.1", "127.0.0.2"):
            with socket.socket() as s:
                try:
                    s.bind((addr, default_port))
                except OSError:
                    self.skipTest(f"{addr}:{default_port} is taken on this machine")
        for i, addr in enumerate(("127.0.0.1", "127.0.0.2")):
            p = self.c.start(["node", "--name", f"slurm{i + 1}", "--bind", addr])
            line = p.stdout.readline()
            self.assertIn("listening", line)
        env = dict(os.environ, SLURM_JOB_ID="77", SLURM_JOB_NODELIST="127.0.0.[1-2]",
                   SLURM_TASKS_PER_NODE="2(x2)")
        rc, out, _ = self.c.run(["hosts"], env=env)
        self.assertEqual(rc, 0)
        self.assertEqual(out, "127.0.0.1:2\n127.0.0.2:2\n")
        rc, out, err = self.c.run(["driver", "--quiet", "--", "sh", "-c",
                                   "echo $HOROVOD_RANK $HOROVOD_SIZE $HOROVOD_HOSTNAME"], env=env)
        self.assertEqual(rc, 0, err)
        self.assertIn("caf-hvd: 2 hosts from Slurm job 77 (SLURM_JOB_NODELIST) (4 slots)", err)
        got = {r: lines[0] for r, lines in rank_lines(out).items()}
        self.assertEqual(got, {0: "0 4 slurm1", 1: "1 4 slurm1", 2: "2 4 slurm2",
                               3: "3 4 slurm2"})
        # an allocation that does not parse is refused before anything starts
        env["SLURM_JOB_NODELIST"] = "127.0.0.[1-2"
        rc, out, err = self.c.run(["driver", "--", "true"], env=env)
        self.assertEqual(rc, 2)
        self.assertIn("hostlist '127.0.0.[1-2': '[' without ']'", err)

    def fake_ssh(self):
        """An ssh stand-in that runs the remote command here (loopback addresses as hosts),
        logs each host it is asked for, and fails like a host whose sshd is down for
        127.0.0.3."""
        d = tempfile.mkdtemp(prefix="caf-hvd-ssh-")
        self.addCleanup(shutil.rmtree, d, True)
        path = os.path.join(d, "ssh")
        log = os.path.join(d, "log")
        with open(path, "w") as f:
            f.write(f"""#!/bin/sh
while [ $# -gt 0 ]; do
  case "$1" in -o|-p|-i) shift 2 ;; -*) shift ;; *) break ;; esac
done
host=$1; shift
echo "$host" >> {log}
if [ "$host" = 127.0.0.3 ]; then
  echo "ssh: connect to host $host port 22: Connection refused" >&2; exit 255
fi
exec sh -c "$*"
""")
        os.chmod(path, 0o755)
        return path, log

    def own_ssh_agents(self):
        """This suite's agents started over ssh (with their sh wrappers): processes of
        other suites, benchmarks or shells on this machine do not count."""
        ours = set(harness.pids_with_env_entry("CAF_HVD_CLUSTER_DIR",
                                               os.environ["CAF_HVD_CLUSTER_DIR"]))
        return [pid for pid in pids_matching("--exit-on-stdin-eof") if pid in ours]

    def test_agents_over_ssh_for_one_job(self):
        ssh, log = self.fake_ssh()
        show = ["sh", "-c", "echo $HOROVOD_RANK $HOROVOD_HOSTNAME"]
        base = ["driver", "--launcher", "ssh", "--ssh-command", ssh, "--quiet"]
        rc, out, err = self.c.run(base + ["-H", "127.0.0.1:2,127.0.0.2:2", "-np", "4", "--",
                                          *show])
        self.assertEqual(rc, 0, err)
        self.assertEqual({r: l[0] for r, l in rank_lines(out).items()},
                         {0: "0 127.0.0.1", 1: "1 127.0.0.1", 2: "2 127.0.0.2",
                          3: "3 127.0.0.2"})
        wait_until(lambda: not self.own_ssh_agents(), 10,
                   "the job's agents to end with it")
        # a host whose sshd is down: named with ssh's own error, nothing left running
        rc, out, err = self.c.run(base + ["-H", "127.0.0.1:1,127.0.0.3:1", "-np", "2", "--",
                                          "true"])
        self.assertEqual(rc, 1)
        self.assertIn("cannot start node agents over ssh:\n  host 127.0.0.3: ", err)
        self.assertIn("ssh: connect to host 127.0.0.3 port 22: Connection refused", err)
        self.assertEqual(rank_lines(out), {})
        wait_until(lambda: not self.own_ssh_agents(), 10, "no agent left")
        # an agent that already answers at the host's port is used, not started again
        port = self.c.node("already")
        os.remove(log)
        rc, out, err = self.c.run(base + ["-H", f"127.0.0.1:{port}:1,127.0.0.2:1", "-np", "2",
                                          "--", *show])
        self.assertEqual(rc, 0, err)
        self.assertEqual(open(log).read().split(), ["127.0.0.2"])
        self.assertEqual(sorted(l[0] for l in rank_lines(out).values()),
                         ["0 already", "1 127.0.0.2"])

    def test_agents_over_ssh_end_with_a_killed_driver(self):
        ssh, _ = self.fake_ssh()
        # unique to this test: any other "sleep 300" on the machine (a shell waiting, the
        # multihost suite's ranks) is not one of its ranks
        rank_cmd = f"sleep 300.{self.marker}"
        p = self.c.start(["driver", "--launcher", "ssh", "--ssh-command", ssh, "-H",
                          "127.0.0.1:1,127.0.0.2:1", "-np", "2", "--", "sh", "-c",
                          f"echo up; exec {rank_cmd}"])
        seen = 0
        while seen < 2:
            line = p.stdout.readline()
            self.assertTrue(line, "the job ended early")
            seen += "up" in line
        agents = self.own_ssh_agents()
        self.assertGreaterEqual(len(agents), 2)  # agents, with their ssh sessions
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        # the ranks themselves (command lines starting with rank_cmd)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and (self.own_ssh_agents()
                                               or pids_matching(rank_cmd, prefix=True)):
            time.sleep(0.1)
        left = self.own_ssh_agents() + pids_matching(rank_cmd, prefix=True)
        self.assertEqual(harness.describe_pids(left), [], "left after the driver's SIGKILL")

    def test_descriptor_limit_raised_for_caf_hvd_not_for_its_ranks(self):
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard <= 512:
            self.skipTest(f"the hard descriptor limit is {hard}: nothing to raise")
        show = ("gp=$(ps -o ppid= -p $PPID | tr -d ' '); "
                "echo rank $(ulimit -n) launcher $(awk '/open files/ {print $4}' /proc/$gp/limits)")
        p = subprocess.run(
            [harness.CAF_HVD, "run", "-np", "1", "--quiet", "--", "sh", "-c", show],
            capture_output=True,
            text=True, timeout=60,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (512, hard)))
        self.assertEqual(p.returncode, 0, p.stderr)
        want = "rank 512 launcher unlimited" if hard == resource.RLIM_INFINITY \
            else f"rank 512 launcher {hard}"
        self.assertIn(want, p.stdout)

    def test_bad_input(self):
        port = self.c.node("hostA")
        self.assert_fails(["driver", "-np", "2", "-H", "nohostslots", "--", "true"], 2,
                          "invalid host spec 'nohostslots'")
        self.assert_fails(["driver", "-np", "2", "-H", "a:x", "--", "true"], 2, "'x'")
        self.assert_fails(["driver", "-np", "5", "-H", f"127.0.0.1:{port}:4", "--", "true"], 2,
                          "-np 5 exceeds the 4 slots")
        self.assert_fails(["driver", "-np", "1", "--", "true"], 2, "-H/--hosts or --hostfile")
        self.assert_fails(["driver", "-np", "1", "--hostfile", "/no/such/file", "--", "true"],
                          2, "cannot open hostfile /no/such/file")
        self.assert_fails(["run", "-np", "2"], 2, "no command given")
        self.assert_fails(["run", "-np", "0", "--", "true"], 2, "need at least 1 rank")
        self.assert_fails(["run", "-np", "1", "--env", "NOVALUE", "--", "true"], 2,
                          "'=' is missing")
        self.assert_fails(["run", "-np", "1", "--bogus", "--", "true"], 2, "bogus")
        self.assert_fails(["frobnicate"], 2, "unknown subcommand 'frobnicate'")
        self.assert_fails(["run", "-np", "2", "--", "no-such-command-xyz"], 127,
                          "cannot execute 'no-such-command-xyz': No such file or directory")
        self.assert_fails(["driver", "-np", "1", "-H", "no-such-host.invalid:1", "--", "true"],
                          2, "cannot resolve host 'no-such-host.invalid'")
        self.assert_fails(["run", "-np", "1", "--output-filename", "/proc/no/dir", "--", "true"],
                          2, "--output-filename /proc/no/dir: cannot create it")
        self.assert_fails(["node", "--port", str(port), "--bind", "127.0.0.1"], 1,
                          f"cannot listen on 127.0.0.1:{port}: Address already in use")
        self.assert_fails(["node", "--port", "70000"], 2, "--port 70000 is out of range")

    def test_command_line_as_horovodrun_and_torchrun_users_type_it(self):
        # The command starts at the first non-option; its own options are the program's.
        rc, out, err = self.c.run(["run", "-np", "2", "sh", "-c", "echo $HOROVOD_RANK"])
        self.assertEqual(rc, 0, err)
        self.assertEqual(sorted(l[0] for l in rank_lines(out).values()), ["0", "1"])
        rc, out, err = self.c.run(["run", "-np", "2", "/usr/bin/python3", "-c", "print(1)"])
        self.assertEqual(rc, 0, err)
        self.assertEqual(rank_lines(out), {0: ["1"], 1: ["1"]})
        rc, out, err = self.c.run(["run", "-np", "1", "sh", "-c", 'echo "$@"', "x", "--lr", "0.1",
                                   "-np", "5"])
        self.assertEqual(rc, 0, err)
        self.assertEqual(rank_lines(out)[0], ["--lr 0.1 -np 5"])
        # Every alias behaves as its canonical flag.
        def env_of(*flags):
            rc, out, err = self.c.run(["run", *flags, "env"])
            self.assertEqual(rc, 0, err)
            return rank_envs(out)
        canonical = env_of("-np", "2", "--network-interface", "lo")
        for flags in (["--num-proc", "2", "--network-interfaces", "lo"],
                      ["--nproc-per-node", "2", "--network-interface", "lo"],
                      ["--nproc_per_node=2", "--network-interface", "lo"],
                      ["-H", "localhost:2", "--network-interface", "lo"]):
            envs = env_of(*flags)
            self.assertEqual(sorted(envs), sorted(canonical), flags)
            for key in ("WORLD_SIZE", "HOROVOD_SIZE", "HOROVOD_GLOO_IFACE", "LOCAL_WORLD_SIZE"):
                self.assertEqual(envs[0][key], canonical[0][key], (flags, key))
        envs = env_of("-np", "1", "--gloo-timeout-seconds", "7", "--log-level", "warning",
                      "--timeline-filename", "/tmp/tl.json", "--autotune",
                      "--fusion-threshold-mb", "2", "--cycle-time-ms", "3",
                      "--cache-capacity", "4", "--gloo", "--disable-cache")
        for key, value in (("HOROVOD_GLOO_TIMEOUT_SECONDS", "7"), ("HOROVOD_LOG_LEVEL", "WARNING"),
                           ("HOROVOD_TIMELINE", "/tmp/tl.json"), ("HOROVOD_AUTOTUNE", "1"),
                           ("HOROVOD_FUSION_THRESHOLD", str(2 * 1024 * 1024)),
                           ("HOROVOD_CYCLE_TIME", "3"), ("HOROVOD_CACHE_CAPACITY", "4")):
            self.assertEqual(envs[0][key], value, key)
        rc, out, err = self.c.run(["run", "-np", "1", "--log-level", "debug", "true"])
        self.assertEqual(rc, 0, err)
        self.assertIn("caf-hvd [", err)  # DEBUG also turns on --verbose
        rc, out, err = self.c.run(["run", "-np", "2", "--prefix-output-with-timestamp", "echo",
                                   "hi"])
        self.assertEqual(rc, 0, err)
        for line in out.splitlines():
            self.assertRegex(line, r"^\w{3} \w{3} \d\d \d\d:\d\d:\d\d \d{4}\[\d\]<stdout>:hi$")
        # What caf-hvd does not do is said, with what to do instead.
        self.assert_fails(["run", "-H", "node9.invalid:2", "true"], 2, "runs on this machine only")
        self.assert_fails(["run", "-H", "localhost:2", "-np", "3", "true"], 2,
                          "-np 3 exceeds the 2 slots given")
        self.assert_fails(["run", "-np", "1", "-p", "22", "true"], 2,
                          "--ssh-port is not supported by caf-hvd run",
                          "caf-hvd driver --launcher ssh")
        self.assert_fails(["driver", "-np", "1", "-H", "h1:1", "-i", "key", "true"], 2,
                          "--ssh-identity-file belongs to --launcher ssh")
        self.assert_fails(["driver", "-np", "1", "-H", "h1:1", "--launcher", "rsh", "true"], 2,
                          "--launcher 'rsh': expected none, ssh or slurm")
        self.assert_fails(["run", "-np", "1", "--mpi", "true"], 2, "--mpi is not supported")
        self.assert_fails(["run", "-np", "1", "--log-level", "LOUD", "true"], 2,
                          "--log-level 'LOUD': expected one of")
        rc, out, _ = self.c.run(["run", "--help"])
        for group in ("the job:", "hosts:", "output:", "networking:", "torch.distributed:",
                      "horovodrun and torchrun spellings:"):
            self.assertIn(group, out)

    def test_unreachable_node(self):
        dead = free_port()
        t0 = time.monotonic()
        self.assert_fails(["driver", "-np", "1", "-H", f"127.0.0.1:{dead}:1", "--", "true"], 1,
                          f"node agent 127.0.0.1:{dead}: Connection refused")
        self.assertLess(time.monotonic() - t0, 10)

    def test_without_the_network_module_local_jobs_run_and_the_rest_says_why(self):
        # A binary whose network module (caf-hvd-net.so) is missing or broken: `run`
        # never needs it; what does needs it says so instead of crashing or hanging.
        with tempfile.TemporaryDirectory() as d:
            exe = os.path.dirname(os.path.realpath(harness.CAF_HVD))
            for f in ("caf-hvd", "caf-hvd-exec"):
                shutil.copy2(os.path.join(exe, f), os.path.join(d, f))
            self.assertTrue(os.path.exists(os.path.join(exe, "caf-hvd-net.so")))
            caf = os.path.join(d, "caf-hvd")
            env = dict(os.environ, CAF_HVD_CLUSTER_DIR=os.path.join(d, "cluster"))

            def run(*args):
                return subprocess.run([caf, *args], capture_output=True, text=True, timeout=30,
                                      env=env, stdin=subprocess.DEVNULL)

            r = run("run", "-np", "2", "--", "sh", "-c", "echo rank $HOROVOD_RANK")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(rank_lines(r.stdout), {0: ["rank 0"], 1: ["rank 1"]})
            for args in (["cluster", "init"], ["node", "--port", "0"],
                         ["driver", "-np", "1", "-H", "127.0.0.1:1:1", "--", "true"]):
                r = run(*args)
                self.assertEqual(r.returncode, 1, f"{args}: {r.stdout} {r.stderr}")
                self.assertIn("cannot load caf-hvd's network module (no caf-hvd-net.so in "
                              f"{d}/caf-hvd-net.so or {d}/", r.stderr)
            self.assertFalse(os.path.exists(os.path.join(d, "cluster")))
            # a file of that name that is no module: the loader's reason is named
            with open(os.path.join(d, "caf-hvd-net.so"), "w") as f:
                f.write("not a shared object\n" * 100)
            r = run("cluster", "init")
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn(f"cannot load caf-hvd's network module ({d}/caf-hvd-net.so: ",
                          r.stderr)
            self.assertIn("invalid ELF header", r.stderr)

    def test_start_timeout_names_the_silent_node(self):
        # A TCP peer that accepts and never speaks: the handshake never completes.
        import socket
        silent = socket.socket()
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        self.addCleanup(silent.close)
        port = silent.getsockname()[1]
        t0 = time.monotonic()
        rc, _, err = self.c.run(["driver", "-np", "1", "-H", f"127.0.0.1:{port}:1",
                                 "--start-timeout", "1.5", "--", "true"], timeout=30)
        self.assertEqual(rc, 1, err)
        self.assertIn(f"127.0.0.1:{port}", err)
        self.assertRegex(err, "start timeout|never completed the handshake")
        self.assertLess(time.monotonic() - t0, 6)

    def test_node_slot_limit_and_duplicate_names(self):
        self.c.node("small", slots=1)
        self.assert_fails(["driver", "-np", "2", "-H", self.c.spec("small", 2), "--", "true"], 1,
                          "offers 1 slots but the job places 2 ranks")
        self.c.node("twin")
        # A second agent that also calls itself 'twin' would corrupt per-host scopes.
        p = self.c.start(["node", "--port", "0", "--name", "twin", "--bind", "127.0.0.1"])
        port = int(re.search(r":(\d+) \(", p.stdout.readline()).group(1))
        self.assert_fails(["driver", "-np", "2", "-H",
                           f"{self.c.spec('twin', 1)},127.0.0.1:{port}:1", "--", "true"], 1,
                          "both call themselves 'twin'")

    def test_help_and_version(self):
        for sub in (["node"], ["driver"], ["run"]):
            rc, out, _ = self.c.run(sub + ["--help"])
            self.assertEqual(rc, 0)
            self.assertIn("usage: caf-hvd", out)
        rc, out, _ = self.c.run(["--version"])
        self.assertEqual(rc, 0)
        self.assertIn("caf-hvd", out)


if __name__ == "__main__":
    sys.exit(run_suite(ClusterTest, sys.argv[1:], harness.leftover_ranks))
