"""The cluster's membership on network-namespace hosts (tests/cluster/netns.py), with mutual
TLS and a certificate per node: agents join the one that holds the table, `caf-hvd status`
lists them and the jobs running, the table's holder can die and come back without a job
noticing, and joins that must not happen are refused. Skips with a clear message when not
run as root. Prints 'N passed, N failed'."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netns  # noqa: E402
from harness import (issue, leftover_ranks, pids_matching, rank_lines, read_line,  # noqa: E402
                     run_suite)

CAF_HVD = os.environ.get("CAF_HVD", "caf-hvd")
ALLREDUCE = os.environ.get("CAF_HVD_ALLREDUCE", "caf-hvd-allreduce")
WHY_NOT = netns.available()
PORT = 24780
CLUSTER = os.environ["CAF_HVD_CLUSTER_DIR"]



def line_reader(p):
    """until(pattern, timeout) reads p's stdout up to a line matching pattern (failing with
    the lines read when none comes, at the deadline even while no line comes), and the
    list of lines read so far. It never reads past the matched line (read_line). When
    p's stdout ends first, the failure says so, with p's exit code and the end of its
    stderr: until.stderr_lines when the caller reads p's stderr itself (a list its reader
    fills), else what is left of p.stderr."""
    seen = []

    def until(pattern, timeout=60):
        deadline = time.monotonic() + timeout
        while True:
            line = read_line(p.stdout.fileno(), deadline)
            if line:
                seen.append(line)
            if not line.endswith("\n"):
                break
            if re.search(pattern, line):
                return
        if time.monotonic() >= deadline:
            raise AssertionError(f"no {pattern!r} within {timeout} s:\n{''.join(seen)[-2000:]}")
        try:
            code = p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            code = "none yet: it still runs"
        if until.stderr_lines is not None:
            err = "".join(until.stderr_lines)
        elif p.stderr and isinstance(code, int):
            err = p.stderr.read()
        else:
            err = ""
        raise AssertionError(f"no {pattern!r}: the job's output ended first (exit code {code}):\n"
                             f"{''.join(seen)[-2000:]}\nits stderr:\n{err[-3000:]}")
    until.stderr_lines = None
    return until, seen


class Drain(threading.Thread):
    """Reads an agent's output so that it never blocks on a full pipe; keeps the lines."""

    def __init__(self, p):
        super().__init__(daemon=True)
        self.p, self.lines = p, []
        self.start()

    def run(self):
        for line in self.p.stdout:
            self.lines.append(line)

    def text(self):
        return "".join(self.lines)


class OnNetnsHosts:
    """Network-namespace hosts, each agent with its own node certificate; `count` hosts."""
    count = 3

    def setUp(self):
        self.h = netns.Hosts(self.count)
        self.addCleanup(self.h.close)
        self.head = self.h.hosts[0]["good_addr"]
        self.driver_dir = issue("driver", "alice")
        self.drains = {}

    def agent(self, i, *extra, join=True, cert=None, link_timeout="3"):
        """Starts host i's agent with its own node certificate (named as the host), joined
        to host 0's unless it is host 0 or join is False."""
        name = self.h.hosts[i]["name"]
        args = ["--cluster-dir", cert or issue("node", name), "--link-timeout", link_timeout,
                *extra]
        if join and i != 0:
            args += ["--join", f"{self.head}:{PORT}"]
        p = self.h.start_node(i, CAF_HVD, port=PORT, extra=args)
        self.drains[i] = Drain(p)
        return p

    def status(self, host=0, *extra, timeout=30):
        return self.h.run(host, [CAF_HVD, "status", "--cluster", f"{self.head}:{PORT}",
                                 "--cluster-dir", self.driver_dir, *extra], timeout=timeout)

    def table(self, host=0):
        rc, out, err = self.status(host, "--json")
        self.assertEqual(rc, 0, err)
        return {n["name"]: n for n in json.loads(out)["nodes"]}

    def wait_for(self, what, check, seconds=10):
        """Polls `check` (a function returning a value or None) until it returns one."""
        deadline = time.monotonic() + seconds
        last = None
        while time.monotonic() < deadline:
            try:
                last = check()
            except AssertionError as e:
                last = None
                why = str(e)
            else:
                why = ""
            if last:
                return last
            time.sleep(0.2)
        logs = "\n".join(f"agent {i}:\n{d.text()}" for i, d in sorted(self.drains.items()))
        raise AssertionError(f"waited {seconds}s for {what}; {why}\nlast: {last}\n{logs}")

    def elastic_allreduce(self, steps, *flags):
        """caf-hvd-allreduce --elastic (20 ms steps) driven from host 0 over the cluster with
        no host list; -> the driver, its line reader and the lines read."""
        p = subprocess.Popen(
            ["ip", "netns", "exec", self.h.hosts[0]["ns"], CAF_HVD, "driver", "--cluster-dir",
             self.driver_dir, "--cluster", f"{self.head}:{PORT}", *flags, "--", ALLREDUCE,
             "--elastic", "--steps", str(steps), "--step-ms", "20"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.h.procs.append(p)
        until, seen = line_reader(p)
        return p, until, seen

    def state_dirs(self, count):
        """`count` fresh --state-dir directories, removed after the test."""
        dirs = []
        for i in range(count):
            dirs.append(tempfile.mkdtemp(prefix=f"caf-hvd-state-{i}-"))
            self.addCleanup(shutil.rmtree, dirs[i], True)
        return dirs

    def as_admin(self, verb, i):
        """`caf-hvd drain|undrain` of host i's node, with an administrator's certificate."""
        rc, out, err = self.h.run(0, [CAF_HVD, verb, self.h.hosts[i]["name"], "--cluster",
                                      f"{self.head}:{PORT}", "--cluster-dir",
                                      issue("admin", "root-admin")])
        self.assertEqual(rc, 0, err)

    def all_alive(self, names):
        def check():
            t = self.table()
            return t if all(t.get(n, {}).get("state") == "alive" for n in names) else None
        return check


@unittest.skipIf(WHY_NOT, WHY_NOT or "")
class MembershipTest(OnNetnsHosts, unittest.TestCase):
    def test_agents_join_and_status_shows_them_and_where_a_jobs_ranks_run(self):
        names = [x["name"] for x in self.h.hosts]
        self.agent(0, "--slots", "4", "--label", "zone=a")
        self.agent(1, "--slots", "2", "--label", "zone=b", "--label", "disk=ssd")
        third = self.agent(2)
        t = self.wait_for("three nodes alive", self.all_alive(names))
        self.assertEqual(t[names[0]]["slots"], 4)
        self.assertEqual(t[names[1]]["slots"], 2)
        self.assertEqual(t[names[2]]["slots"], 0)
        self.assertEqual(t[names[1]]["labels"], ["disk=ssd", "zone=b"])
        self.assertEqual(t[names[1]]["address"], self.h.hosts[1]["good_addr"])
        self.assertEqual(t[names[2]]["port"], PORT)
        # each joined with its own certificate: the name is proven, not shared
        self.assertEqual(t[names[1]]["certificate"], names[1])
        self.assertFalse(t[names[1]]["shared_certificate"])
        # a job over hosts 0 and 1: status names where its ranks are, as the ranks see it
        spec = f"{self.h.hosts[0]['good_addr']}:{PORT}:2,{self.h.hosts[1]['good_addr']}:{PORT}:1"
        job = subprocess.Popen(
            ["ip", "netns", "exec", self.h.hosts[0]["ns"], CAF_HVD, "driver", "--cluster-dir",
             self.driver_dir, "-np", "3", "-H", spec, "--", "sh", "-c",
             'echo "on $HOROVOD_HOSTNAME"; exec sleep 5'],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.h.procs.append(job)
        seen = {}
        for _ in range(3):
            line = job.stdout.readline()
            self.assertIn("on ", line)
            host = line.split("on ", 1)[1].strip()
            seen[host] = seen.get(host, 0) + 1
        want = {(host, "alice", k) for host, k in seen.items()}

        def jobs():
            t = self.table()
            return t if {(n, j["owner"], j["ranks"]) for n, row in t.items()
                         for j in row["jobs"]} == want else None
        t = self.wait_for(f"the job's ranks in status: {want}", jobs, seconds=3)
        self.assertEqual(t[names[0]]["slots_used"], seen[names[0]])
        rc, out, err = self.status()
        self.assertEqual(rc, 0, err)
        self.assertIn("3 nodes alive, 3 slots in use of 6 and unlimited", out)
        self.assertRegex(out, rf"alice\s+3\s+{names[0]}:2,{names[1]}:1")
        out, err = job.communicate(timeout=60)
        self.assertEqual(job.returncode, 0, err)
        # the ranks are gone: so are the job and its slots
        self.wait_for("the job gone from status",
                      lambda: all(not r["jobs"] for r in self.table().values()))
        # a lost agent says so (its link broke), and an agent asked instead of the holder
        # sends status to the holder
        os.killpg(third.pid, 9)
        t = self.wait_for("host 2 lost", lambda: (lambda t: t if t[names[2]]["state"] == "lost"
                                                  else None)(self.table()))
        rc, out, err = self.h.run(0, [CAF_HVD, "status", "--cluster",
                                      f"{self.h.hosts[1]['good_addr']}:{PORT}", "--cluster-dir",
                                      self.driver_dir])
        self.assertEqual(rc, 0, err)
        self.assertIn(f"cluster held by '{names[0]}': 2 nodes alive", out)
        self.assertRegex(out, rf"{names[2]}\s+lost")

    def test_the_holder_dies_during_a_job_and_the_table_comes_back_from_re_joins(self):
        names = [x["name"] for x in self.h.hosts]
        holder = self.agent(0)
        self.agent(1)
        third = self.agent(2)
        self.wait_for("three nodes alive", self.all_alive(names))
        # a job on hosts 1 and 2 whose ranks, both running, end only after the holder died
        release = f"/tmp/caf-hvd-membership-{os.getpid()}-holder-gone"
        self.addCleanup(lambda: os.path.exists(release) and os.remove(release))
        spec = f"{self.h.hosts[1]['good_addr']}:{PORT}:1,{self.h.hosts[2]['good_addr']}:{PORT}:1"
        job = subprocess.Popen(
            ["ip", "netns", "exec", self.h.hosts[0]["ns"], CAF_HVD, "driver", "--cluster-dir",
             self.driver_dir, "-np", "2", "-H", spec, "--", "sh", "-c",
             f'echo up; while [ ! -e {release} ]; do sleep 0.05; done; '
             f'echo "rank $HOROVOD_RANK of $HOROVOD_SIZE done"'],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.h.procs.append(job)
        for _ in range(2):
            line = job.stdout.readline()
            self.assertIn("up", line, line or job.stderr.read())
        os.killpg(holder.pid, 9)
        holder.wait(timeout=10)
        rc, out, err = self.status()
        self.assertEqual(rc, 1)
        self.assertIn("caf-hvd status: error: cannot reach the cluster at", err)
        open(release, "w").close()
        out, err = job.communicate(timeout=60)
        self.assertEqual(job.returncode, 0, err)
        self.assertEqual(sorted(line[-1] for line in rank_lines(out).values()),
                         ["rank 0 of 2 done", "rank 1 of 2 done"])
        # the holder comes back: the members join it again on their own (they retry every
        # second), so the table is whole within a few seconds
        self.agent(0)
        started = time.monotonic()
        self.wait_for("every agent back in the table", self.all_alive(names), seconds=5)
        rebuilt = time.monotonic() - started
        self.assertLess(rebuilt, 5)
        self.assertIn("joined again the cluster at", self.drains[1].text())
        # an agent restarted under its name joins again; meanwhile it shows as left
        os.killpg(third.pid, 15)
        third.wait(timeout=30)
        t = self.wait_for("host 2 left", lambda: (lambda t: t if t[names[2]]["state"] == "left"
                                                  else None)(self.table()))
        self.agent(2)
        t = self.wait_for("host 2 back", self.all_alive(names))
        self.assertGreater(t[names[2]]["joined_ms"], t[names[1]]["joined_ms"] - 10_000)

    def start_job(self, np, *options, marker, name="job", after=None):
        """A driver in host 0's namespace with no host list; its ranks print their host and
        node-wide slot as they see them, then wait until `marker` exists. With `after`, a
        rank that starts before that file exists says so instead of its slot."""
        slot = 'echo "slot $HOROVOD_HOSTNAME $CAF_HVD_SLOT"'
        if after:
            slot = f'if [ -e {after} ]; then {slot}; else echo "started before {after}"; fi'
        p = subprocess.Popen(
            ["ip", "netns", "exec", self.h.hosts[0]["ns"], CAF_HVD, "driver", "--cluster-dir",
             self.driver_dir, "--cluster", f"{self.head}:{PORT}", "-np", str(np), *options, "--",
             "sh", "-c", f'{slot}; '
                         f'while [ ! -e {marker} ]; do sleep 0.1; done; echo "{name} done"'],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.h.procs.append(p)
        return p

    def slots_of(self, p, np):
        """The (host, node-wide slot) each rank of `p` printed."""
        got = set()
        for _ in range(np):
            line = p.stdout.readline()
            self.assertIn("slot ", line, p.stderr.read() if p.poll() is not None else "")
            host, slot = line.split("slot ", 1)[1].split()
            self.assertEqual(slot.split(":")[0], host)  # CAF_HVD_SLOT names the rank's node
            got.add((host, slot))
        self.assertEqual(len(got), np, f"two ranks share a slot: {got}")
        return got

    def test_a_job_is_cancelled_by_its_owner_or_an_administrator_and_by_no_other_driver(self):
        """`caf-hvd cancel JOB`: bob's driver certificate may not cancel alice's job (the
        table refuses, naming the owner; every rank runs on); alice's may, and so may an
        administrator's. Each node that runs the job stops its ranks, and the job's driver
        ends saying who cancelled it (not as a rank failure)."""
        names = [x["name"] for x in self.h.hosts[:2]]
        agents = [self.agent(i, "--slots", "2") for i in range(2)]
        self.wait_for("two nodes alive", self.all_alive(names))
        mark = f"{time.monotonic_ns() % 10**9}"

        def start(creds=self.driver_dir):
            p = subprocess.Popen(
                ["ip", "netns", "exec", self.h.hosts[0]["ns"], CAF_HVD, "driver",
                 "--cluster-dir", creds, "--cluster", f"{self.head}:{PORT}", "-np",
                 "4", "--", "sh", "-c", f"echo started; exec sleep 300.{mark}"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                start_new_session=True)
            self.h.procs.append(p)
            until, _ = line_reader(p)
            for _ in range(4):
                until("started")

            def listed():
                ids = {j["job"] for row in self.table().values() for j in row["jobs"]
                       if j["ranks"] == 2}
                return ids if len(ids) == 1 else None
            return p, self.wait_for("the job on both nodes", listed).pop()

        def cancel(job, creds, *extra):
            return self.h.run(0, [CAF_HVD, "cancel", job, "--cluster", f"{self.head}:{PORT}",
                                  "--cluster-dir", creds, *extra])

        def ranks():
            return len(pids_matching(f"sleep 300.{mark}", prefix=True))
        p, job = start()
        rc, out, err = cancel(job, issue("driver", "bob"))
        self.assertEqual(rc, 1, out)
        self.assertIn(f"the agent refused to cancel job {job}: job {job} is 'alice''s", err)
        self.assertEqual(ranks(), 4)
        self.assertIsNone(p.poll())
        rc, out, err = cancel(job, self.driver_dir)
        self.assertEqual(rc, 0, err)
        self.assertIn(f"cancelled job {job}: its ranks stop on {', '.join(sorted(names))}", out)
        out, err = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 1, err)
        # the job's first error is the cancel (not a rank's end, nor a lost node)
        first = next(line for line in err.splitlines() if "error:" in line)
        self.assertIn("error: the job was cancelled by 'alice' (its owner)", first)
        self.wait_for("the cancelled job's ranks gone", lambda: ranks() == 0)
        # an administrator's cancel; then the job is no longer anywhere
        p, job = start()
        rc, out, err = cancel(job, issue("admin", "root-admin"), "--admin")
        self.assertEqual(rc, 0, err)
        out, err = p.communicate(timeout=60)
        self.assertIn("error: the job was cancelled by 'root-admin' (administrator)", err)
        self.wait_for("the cancelled job's ranks gone", lambda: ranks() == 0)
        self.wait_for("the job gone from status",
                      lambda: all(not r["jobs"] for r in self.table().values()))
        rc, out, err = cancel(job, self.driver_dir)
        self.assertEqual(rc, 1)
        self.assertIn(f"no node runs job {job}", err)
        # a driver certificate revoked while its job runs: the job runs on (its connections
        # were admitted before), its owner can no longer cancel it, an administrator can
        carol = issue("driver", "carol")
        p, job = start(carol)
        subprocess.run([CAF_HVD, "cluster", "revoke", "carol", CLUSTER], check=True,
                       capture_output=True)
        for i, a in enumerate(agents):
            os.killpg(a.pid, signal.SIGHUP)
            self.wait_for(f"agent {i} reloaded", lambda i=i: "SIGHUP: reloaded the credentials"
                          in self.drains[i].text())
        self.assertEqual((p.poll(), ranks()), (None, 4))
        rc, out, err = cancel(job, carol)
        self.assertEqual(rc, 1, out)
        self.assertIn("revoked", err)
        rc, out, err = cancel(job, issue("admin", "root-admin"), "--admin")
        self.assertEqual(rc, 0, err)
        out, err = p.communicate(timeout=60)
        self.assertIn("error: the job was cancelled by 'root-admin' (administrator)", err)
        self.wait_for("the cancelled job's ranks gone", lambda: ranks() == 0)

    def test_jobs_with_no_host_list_get_slots_of_their_own(self):
        names = [x["name"] for x in self.h.hosts]
        for i in range(3):
            self.agent(i, "--slots", "2")
        self.wait_for("three nodes alive", self.all_alive(names))
        marks = [f"/tmp/caf-hvd-membership-{os.getpid()}-{k}" for k in "abcd"]
        for m in marks:
            self.addCleanup(lambda m=m: os.path.exists(m) and os.remove(m))
        a = self.start_job(4, marker=marks[0], name="a")
        a_slots = self.slots_of(a, 4)
        b = self.start_job(2, "--placement", "spread", marker=marks[1], name="b")
        b_slots = self.slots_of(b, 2)
        everything = {(n, f"{n}:{k}") for n in names for k in range(2)}
        self.assertEqual(a_slots | b_slots, everything)  # disjoint, and every slot used once
        self.assertFalse(a_slots & b_slots)
        # packed: a sits on two whole nodes; spread: b has one rank per node
        self.assertEqual(len({h for h, _ in a_slots}), 2)
        # an agent refuses an overlap whatever placed the job: -H onto a's full node
        a_host = sorted({h for h, _ in a_slots})[0]
        a_addr = next(x["good_addr"] for x in self.h.hosts if x["name"] == a_host)
        rc, out, err = self.h.run(0, [CAF_HVD, "driver", "--cluster-dir", self.driver_dir, "-np",
                                      "1", "-H", f"{a_addr}:{PORT}:1", "--", "true"])
        self.assertNotEqual(rc, 0)
        self.assertIn(f"node agent '{a_host}' cannot start 1 rank of this job: the node has 2 "
                      "slots for all jobs and 2 are held (2 by job", err)
        # a third job waits, says for what, and starts when a ends (its ranks check that a's
        # ranks were released first)
        c = self.start_job(2, "--slot-wait", "60", marker=marks[2], name="c", after=marks[0])
        line = c.stderr.readline()
        self.assertRegex(line, r"caf-hvd: waiting for 2 slots: 0 free of 6, 4 held by job \S+, "
                               r"2 held by job \S+")
        # `caf-hvd jobs`: a and b run where their ranks are, c waits in line
        rc, out, err = self.h.run(0, [CAF_HVD, "jobs", "--cluster", f"{self.head}:{PORT}",
                                      "--cluster-dir", self.driver_dir, "--json"])
        self.assertEqual(rc, 0, err)
        states = [(j["owner"], j["ranks"], j["waiting_for"], j["state"], sum(j["nodes"].values()))
                  for j in json.loads(out)["jobs"]]
        self.assertEqual(sorted(states), [("alice", 0, 2, "waiting", 0),
                                          ("alice", 2, 0, "running", 2),
                                          ("alice", 4, 0, "running", 4)], out)
        rc, out, err = self.h.run(0, [CAF_HVD, "jobs", "--cluster", f"{self.head}:{PORT}",
                                      "--cluster-dir", self.driver_dir])
        self.assertEqual(rc, 0, err)
        self.assertRegex(out, r"alice\s+0\s+-\s+\S+ ago\s+waiting for 2 slots")
        self.assertRegex(out, r"alice\s+4\s+\S+:2,\S+:2\s+\S+ ago\s+running")
        open(marks[0], "w").close()
        out, err = a.communicate(timeout=60)
        self.assertEqual(a.returncode, 0, err)
        c_slots = self.slots_of(c, 2)
        self.assertFalse(c_slots & b_slots)
        # b's driver is SIGKILLed: its slots come back (its agents stop its ranks)
        os.killpg(b.pid, 9)
        b.wait()
        d = self.start_job(4, "--slot-wait", "30", marker=marks[3], name="d")
        d_slots = self.slots_of(d, 4)
        self.assertEqual(d_slots | c_slots, everything)
        for m in marks:
            open(m, "w").close()
        for p in (c, d):
            out, err = p.communicate(timeout=60)
            self.assertEqual(p.returncode, 0, err)
        # one that cannot ever fit is told at once; one that waits too long is told why
        rc, out, err = self.h.run(0, [CAF_HVD, "driver", "--cluster-dir", self.driver_dir,
                                      "--cluster", f"{self.head}:{PORT}", "-np", "7", "--", "true"])
        self.assertEqual(rc, 1)
        self.assertIn("the cluster's live nodes have 6 slots in all; -np 7 cannot fit", err)

    def test_an_elastic_job_follows_the_cluster_a_joining_agent_adds_a_host(self):
        """An elastic job with --cluster and no discovery script: its hosts are the
        cluster's live nodes. A third agent joins mid-job: the job grows to it; an agent is
        SIGKILLed: the job goes on without it; no step is lost (the checksum). The job asks
        the table once (--discovery-interval 600): the table tells it of each change."""
        names = [x["name"] for x in self.h.hosts]
        self.agent(0, "--slots", "1")
        victim = self.agent(1, "--slots", "1")
        self.wait_for("two nodes alive", self.all_alive(names[:2]))
        p, until, seen = self.elastic_allreduce(300, "--min-np", "2", "--discovery-interval",
                                                "600")

        until(r"step 10 size 2 ")
        self.agent(2, "--slots", "1")  # joins the cluster, so the job's next discovery has it
        until(r"step \d+ size 3 ")
        os.killpg(victim.pid, 9)
        try:
            out, err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            out, err = p.communicate()
            raise AssertionError(f"the elastic job did not finish:\n{err[-3000:]}")
        text = "".join(seen) + out
        self.assertEqual(p.returncode, 0, err[-3000:])
        self.assertIn("elastic run done: 300 steps, checksum 45150", text)
        self.assertRegex(err, rf"generation 2: 3 ranks on .*\(added {names[2]}\)")
        self.assertRegex(err, rf"generation \d+: 2 ranks on .*\(removed {names[1]}\)")

    def test_an_elastic_job_leaves_a_joining_node_to_a_job_waiting_for_slots(self):
        """An elastic job holds every slot; a static job waits for 2; a node with 2 slots
        joins: the waiting job gets them, not the elastic job (which grows onto the node
        only once that job is done)."""
        names = [x["name"] for x in self.h.hosts]
        self.agent(0, "--slots", "2")
        self.agent(1, "--slots", "2")
        self.wait_for("two nodes alive", self.all_alive(names[:2]))
        p, until, seen = self.elastic_allreduce(600, "--min-np", "1", "--max-np", "8")
        until(r"step \d+ size 4 ")
        marker = f"/tmp/caf-hvd-membership-{os.getpid()}-yield"
        self.addCleanup(lambda: os.path.exists(marker) and os.remove(marker))
        waiting = self.start_job(2, "--slot-wait", "60", marker=marker, name="waiting")
        self.assertRegex(waiting.stderr.readline(), r"caf-hvd: waiting for 2 slots: 0 free of 4")
        self.agent(2, "--slots", "2")
        self.assertEqual({h for h, _ in self.slots_of(waiting, 2)}, {names[2]})
        self.assertNotRegex("".join(seen), r"size [56] ")
        open(marker, "w").close()
        out, err = waiting.communicate(timeout=60)
        self.assertEqual(waiting.returncode, 0, err)
        until(r"step \d+ size 6 ")  # the waiting job is gone: the elastic job grows
        out, err = p.communicate(timeout=120)
        self.assertEqual(p.returncode, 0, err[-3000:])
        self.assertIn("elastic run done: 600 steps, checksum 180300", "".join(seen) + out)

    def test_the_python_executors_with_no_hosts_use_the_configured_cluster(self):
        names = [x["name"] for x in self.h.hosts]
        for i in range(3):
            self.agent(i, "--slots", "1")
        self.wait_for("three nodes alive", self.all_alive(names))
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        # no $CAF_HVD_CLUSTER: the cluster is the one host 1's installed agent joins (a
        # file shaped as /etc/default/caf-hvd-node)
        conf = os.path.join(CLUSTER, f"defaults-py-{os.getpid()}")
        self.addCleanup(lambda: os.path.exists(conf) and os.remove(conf))
        with open(conf, "w") as f:
            f.write(f"CAF_HVD_NODE_PORT={PORT}\nCAF_HVD_NODE_JOIN='{self.head}:{PORT}'\n")
        env = ["env", f"CAF_HVD_NODE_DEFAULTS={conf}", f"CAF_HVD={CAF_HVD}",
               f"CAF_HVD_CLUSTER_DIR={self.driver_dir}", f"PYTHONPATH={os.path.join(root, 'python')}"]
        rc, out, err = self.h.run(1, env + ["/usr/bin/python3", os.path.join(
            os.path.dirname(os.path.abspath(__file__)), "cluster_executors_program.py")],
            timeout=240)
        self.assertEqual(rc, 0, err[-3000:])
        parts = {}
        for line in out.splitlines():
            if line.startswith("{"):
                parts.update(json.loads(line))
        # one rank per node (each agent has one slot): the table spread them over all three
        static = parts["static"]
        self.assertEqual(sorted(r["rank"] for r in static), [0, 1, 2])
        self.assertEqual(sorted(r["host"] for r in static), sorted(names))
        self.assertEqual(sorted(r["slot"] for r in static), sorted(f"{n}:0" for n in names))
        elastic = parts["elastic"]
        self.assertEqual([r["rank"] for r in elastic], [0, 1])
        self.assertEqual({r["size"] for r in elastic}, {2})
        self.assertTrue(all(r["host"] in names for r in elastic), elastic)
        self.assertEqual(len({r["host"] for r in elastic}), 2)
        trainer = parts["trainer"]
        self.assertEqual(trainer["rank"], 0)
        self.assertEqual(trainer["size"], 2)
        self.assertIn(trainer["host"], names)

    def test_drain_moves_an_elastic_job_off_a_node_and_sigterm_with_a_grace_drains_first(self):
        names = [x["name"] for x in self.h.hosts]
        admin = issue("admin", "root-admin")
        self.agent(0, "--slots", "1")
        self.agent(1, "--slots", "1")
        spot = self.agent(2, "--slots", "1", "--drain-grace", "60")
        self.wait_for("three nodes alive", self.all_alive(names))
        p, until, seen = self.elastic_allreduce(700, "--min-np", "1", "--discovery-interval",
                                                "600")

        def drain(verb, node, creds=admin):
            return self.h.run(0, [CAF_HVD, verb, node, "--cluster", f"{self.head}:{PORT}",
                                  "--cluster-dir", creds])

        until(r"step \d+ size 3 ")
        # a driver's certificate cannot drain; an unknown node is named
        rc, out, err = drain("drain", names[1], creds=self.driver_dir)
        self.assertEqual(rc, 1)
        self.assertIn("holds no admin certificate", err)
        rc, out, err = drain("drain", "nope")
        self.assertEqual(rc, 1)
        self.assertIn("no node named 'nope' in the cluster", err)
        # drain host 1: the job shrinks to the others at its next commit
        rc, out, err = drain("drain", names[1])
        self.assertEqual(rc, 0, err)
        self.assertIn(f"drained '{names[1]}'", out)
        until(r"step \d+ size 2 ")
        self.wait_for("host 1 drained", lambda: self.table()[names[1]]["state"] == "drained")
        # nothing new is placed there: a one-rank job finds no free slot (the others are the
        # job's, as their agents reported when its ranks started)
        self.wait_for("the job's ranks on hosts 0 and 2 in the table", lambda: all(
            self.table()[names[i]]["slots_used"] == 1 for i in (0, 2)))
        rc, out, err = self.h.run(0, [CAF_HVD, "driver", "--cluster-dir", self.driver_dir,
                                      "--cluster", f"{self.head}:{PORT}", "-np", "1",
                                      "--slot-wait", "1", "--", "true"])
        self.assertEqual(rc, 1)
        self.assertIn("waited for 1 slot: 0 free of 2", err)
        # undrain: the job grows back onto it
        rc, out, err = drain("undrain", names[1])
        self.assertEqual(rc, 0, err)
        until(r"step \d+ size 3 ")
        # SIGTERM to an agent with --drain-grace (a spot VM's notice): the job leaves it, the
        # agent exits once its rank is gone, well before the grace
        os.killpg(spot.pid, 15)
        until(r"step \d+ size 2 ")
        self.assertEqual(spot.wait(timeout=30), 0)
        self.assertIn("drained: no ranks left", self.drains[2].text())
        out, err = p.communicate(timeout=120)
        text = "".join(seen) + out
        self.assertEqual(p.returncode, 0, err[-3000:])
        self.assertIn("elastic run done: 700 steps, checksum 245350", text)
        self.assertRegex(err, rf"\(removed {names[1]}\)")
        self.assertRegex(err, rf"\(removed {names[2]}\)")

    def test_draining_the_only_node_of_an_elastic_job_carries_its_state_to_another(self):
        # Both ranks run on host 0; host 1 joins; host 0 is drained. Its rank 0 stays in one
        # more plan beside host 1's newcomer, which is sent the state; then the job leaves
        # host 0 and goes on at size 2 on host 1 from the step it was at (before: "no host
        # of generation 1 is left to carry the job's state over" at the drain).
        names = [x["name"] for x in self.h.hosts]
        self.agent(0, "--slots", "2")
        self.wait_for("host 0 alive", self.all_alive(names[:1]))
        steps = 1500
        p, until, seen = self.elastic_allreduce(steps, "--min-np", "1", "--max-np", "2",
                                                "--discovery-interval", "600")
        until(r"step \d+ size 2 ")
        self.agent(1, "--slots", "2")
        self.wait_for("host 1 alive", self.all_alive(names[:2]))
        self.as_admin("drain", 0)
        until(rf"rank 0 of 2 on {names[1]} resumes at step", 90)
        self.wait_for("host 0's ranks gone", lambda: self.table()[names[0]]["slots_used"] == 0
                      or None, 30)
        out, err = p.communicate(timeout=120)
        text = "".join(seen) + out
        self.assertEqual(p.returncode, 0, err[-3000:])
        self.assertIn(f"elastic run done: {steps} steps, checksum {steps * (steps + 1) // 2}",
                      text)
        # every step once, in order, across the three plans: no state lost, no step again
        stepped = [int(m.group(1)) for m in re.finditer(r"step (\d+) size \d+ ", text)]
        self.assertEqual(stepped, list(range(1, steps + 1)), text[-3000:])
        self.assertIn(f"node {names[0]} drains and its ranks hold the job's only training state",
                      err)
        self.assertRegex(err, rf"generation \d+: 2 ranks on {names[0]}:1,{names[1]}:1")
        self.assertRegex(err, rf"generation \d+: 2 ranks on {names[1]}:2 \(removed {names[0]}\)")
        self.assertNotIn("blacklisted", err)
        self.assertNotIn("is left to carry", err)

    def test_a_static_job_on_a_drained_node_is_told_and_its_ranks_run_on(self):
        names = [x["name"] for x in self.h.hosts]
        admin = issue("admin", "root-admin")
        self.agent(0, "--slots", "1")
        self.agent(1, "--slots", "1")
        self.wait_for("two nodes alive", self.all_alive(names[:2]))
        marker = f"/tmp/caf-hvd-membership-{os.getpid()}-static-drain"
        self.addCleanup(lambda: os.path.exists(marker) and os.remove(marker))
        job = self.start_job(2, marker=marker)
        self.slots_of(job, 2)
        rc, out, err = self.h.run(0, [CAF_HVD, "drain", names[1], "--cluster",
                                      f"{self.head}:{PORT}", "--cluster-dir", admin])
        self.assertEqual(rc, 0, err)
        self.assertEqual(job.stderr.readline().strip(),
                         f"caf-hvd: warning: node {names[1]} drains (drained by the cluster's "
                         "administrator 'root-admin'); this job's 1 rank there run on, and the "
                         "job fails if the node stops them")
        open(marker, "w").close()
        out, err = job.communicate(timeout=60)
        self.assertEqual(job.returncode, 0, err)
        self.assertEqual(sorted(l[-1] for l in rank_lines(out).values()), ["job done"] * 2)

    def test_gpus_and_cpus_per_slot_go_into_placement(self):
        names = [x["name"] for x in self.h.hosts]
        self.agent(0, "--slots", "4", "--gpus", "none")
        self.agent(1, "--slots", "4", "--gpus", "0,1")
        self.wait_for("two nodes alive", self.all_alive(names[:2]))
        marker = f"/tmp/caf-hvd-membership-{os.getpid()}-gpus"
        self.addCleanup(lambda: os.path.exists(marker) and os.remove(marker))
        # ranks of 1 GPU go where the GPUs are, although the other node has more free slots
        job = self.start_job(2, "--gpus-per-slot", "1", marker=marker)
        self.assertEqual({h for h, _ in self.slots_of(job, 2)}, {names[1]})
        # a third GPU rank waits (the 2 devices are lent), one that can never fit is told
        rc, out, err = self.h.run(0, [CAF_HVD, "driver", "--cluster-dir", self.driver_dir,
                                      "--cluster", f"{self.head}:{PORT}", "-np", "1",
                                      "--gpus-per-slot", "1", "--slot-wait", "1", "--", "true"])
        self.assertEqual(rc, 1)
        self.assertIn("waited for 1 slot (1 GPU each): 0 free of 2", err)
        rc, out, err = self.h.run(0, [CAF_HVD, "driver", "--cluster-dir", self.driver_dir,
                                      "--cluster", f"{self.head}:{PORT}", "-np", "3",
                                      "--gpus-per-slot", "1", "--", "true"])
        self.assertEqual(rc, 1)
        self.assertIn("the cluster's live nodes fit 2 ranks (1 GPU each) in all; -np 3 cannot "
                      "fit", err)
        open(marker, "w").close()
        out, err = job.communicate(timeout=60)
        self.assertEqual(job.returncode, 0, err)
        # CPUs: a node's processors are shared out by --cpus-per-slot (each netns host is
        # this machine: its processor count)
        cpus = os.cpu_count()
        rc, out, err = self.h.run(0, [CAF_HVD, "driver", "--cluster-dir", self.driver_dir,
                                      "--cluster", f"{self.head}:{PORT}", "-np", "3",
                                      "--cpus-per-slot", str(cpus), "--", "true"])
        self.assertEqual(rc, 1)
        self.assertIn(f"the cluster's live nodes fit 2 ranks ({cpus} CPUs each) in all", err)
        rc, out, err = self.h.run(0, [CAF_HVD, "driver", "--cluster-dir", self.driver_dir,
                                      "--cluster", f"{self.head}:{PORT}", "-np", "2",
                                      "--cpus-per-slot", str(cpus), "--", "sh", "-c",
                                      "echo $HOROVOD_HOSTNAME $OMP_NUM_THREADS"])
        self.assertEqual(rc, 0, err)
        self.assertEqual(sorted(l[0] for l in rank_lines(out).values()),
                         sorted(f"{n} {cpus}" for n in names[:2]))

    def test_the_installed_agents_configuration_names_the_default_cluster(self):
        """On a head node whose package configuration runs the table's agent (it joins
        nobody), or on a node that joins one, jobs, `status` and `hosts` need no
        --cluster: they take it from /etc/default/caf-hvd-node (here a file of that shape
        that $CAF_HVD_NODE_DEFAULTS names)."""
        names = [x["name"] for x in self.h.hosts]
        self.agent(0, "--slots", "1")
        self.agent(1, "--slots", "1")
        self.wait_for("two nodes alive", self.all_alive(names[:2]))
        conf = os.path.join(CLUSTER, f"defaults-{os.getpid()}")
        self.addCleanup(lambda: os.path.exists(conf) and os.remove(conf))

        def installed(text):
            with open(conf, "w") as f:
                f.write("# as packaging/caf-hvd-node.default.in\n" + text)
            return ["env", f"CAF_HVD_NODE_DEFAULTS={conf}", CAF_HVD]

        head = installed(f"CAF_HVD_NODE_PORT={PORT}\nCAF_HVD_NODE_JOIN=\n")
        rc, out, err = self.h.run(0, head + ["status", "--cluster-dir", self.driver_dir])
        self.assertEqual(rc, 0, err)
        self.assertIn(f"cluster held by '{names[0]}': 2 nodes alive", out)
        rc, out, err = self.h.run(0, head + ["driver", "--cluster-dir", self.driver_dir, "-np",
                                             "2", "--verbose", "--", "sh", "-c",
                                             "echo $HOROVOD_HOSTNAME"])
        self.assertEqual(rc, 0, err)
        self.assertEqual(sorted(l[0] for l in rank_lines(out).values()), sorted(names[:2]))
        self.assertIn(f"the hosts come from the cluster at 127.0.0.1:{PORT} (the installed "
                      f"agent's configuration {conf} (this host's agent, which joins no other))",
                      err)
        # a member node's configuration names the agent it joins, quoted as systemd allows
        member = installed(f'CAF_HVD_NODE_PORT={PORT}\nCAF_HVD_NODE_JOIN="{self.head}:{PORT}"\n')
        rc, out, err = self.h.run(1, member + ["hosts"])
        self.assertEqual(rc, 0, err)
        self.assertIn(f"the hosts come from the cluster at {self.head}:{PORT} (the installed "
                      f"agent's configuration {conf} (CAF_HVD_NODE_JOIN))", err)
        # given ones win: --cluster, then $CAF_HVD_CLUSTER
        rc, out, err = self.h.run(1, member[:-1] + ["CAF_HVD_CLUSTER=127.0.0.1:1", CAF_HVD,
                                                    "status", "--cluster-dir", self.driver_dir])
        self.assertEqual(rc, 1)
        self.assertIn("cannot reach the cluster at 127.0.0.1:1", err)

    def test_an_agent_on_a_host_whose_name_does_not_resolve_warns(self):
        """Real Horovod's hvd.init() ends with SIGSEGV on such a host (its process sets'
        Gloo device looks the host name up): the agent says so when it starts. The netns
        hosts' own names resolve (netns.py), and their agents say nothing."""
        a0 = self.agent(0)
        p = subprocess.Popen(
            ["ip", "netns", "exec", self.h.hosts[1]["ns"], "unshare", "--uts", "sh", "-c",
             'hostname nowhere-to-be-found.invalid && exec "$0" "$@"', CAF_HVD, "node",
             "--port", str(PORT), "--cluster-dir", issue("node", self.h.hosts[1]["name"])],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.h.procs.append(p)
        self.assertIn("listening", p.stdout.readline())
        said = p.stderr.readline()
        while "warning" not in said and said:
            said = p.stderr.readline()
        # (the resolver's words depend on whether a DNS server answers)
        self.assertRegex(said.strip(),
                         r"^caf-hvd node 'nowhere-to-be-found\.invalid': warning: this host's "
                         r"name 'nowhere-to-be-found\.invalid' does not resolve \([^)]+\): real "
                         r"Horovod's hvd\.init\(\) ends with SIGSEGV on such a host; add the "
                         r"name to /etc/hosts or the DNS$")
        # agent 0 would have warned at its start: a SIGHUP's reload, which its signal loop
        # takes only after the start, says when everything of the start has been said
        os.kill(a0.pid, signal.SIGHUP)
        self.wait_for("agent 0's SIGHUP reload",
                      lambda: "SIGHUP: reloaded the credentials" in self.drains[0].text())
        self.assertNotIn("warning", self.drains[0].text())

    def test_joins_that_must_not_happen_are_refused_with_one_line_and_exit_1(self):
        names = [x["name"] for x in self.h.hosts]
        self.agent(0)
        self.agent(1)
        self.wait_for("two nodes alive", self.all_alive(names[:2]))

        def refused_join(i, *args, seconds=30):
            r = self.h.run(i, ["unshare", "--uts", "sh", "-c",
                               f'hostname {self.h.hosts[i]["name"]} && exec "$0" "$@"',
                               CAF_HVD, "node", "--port", str(PORT + 1), "--link-timeout", "2",
                               *args], timeout=seconds)
            return r[0], r[2].strip().splitlines()[-1] if r[2].strip() else ""

        # another cluster's credentials
        other = os.path.join(os.path.dirname(CLUSTER), "other-cluster")
        if not os.path.exists(other):
            subprocess.run([CAF_HVD, "cluster", "init", other], check=True, capture_output=True)
        rc, line = refused_join(2, "--cluster-dir", other, "--join", f"{self.head}:{PORT}")
        self.assertEqual(rc, 1)
        self.assertIn("error: cannot join the cluster at", line)
        self.assertIn("not signed by this cluster's CA", line)
        # a certificate issued for host 2 joining under another name
        rc, line = refused_join(2, "--cluster-dir", issue("node", names[2]), "--name", "h-fake",
                                "--join", f"{self.head}:{PORT}")
        self.assertEqual(rc, 1)
        self.assertIn(f"its certificate was issued for '{names[2]}', so it cannot join as "
                      "'h-fake'", line)
        # a name a live agent holds (a shared certificate may claim any name, not a held one):
        # refused for the link timeout and a bit (it may be its own earlier run), then the end
        rc, line = refused_join(2, "--name", names[1], "--join", f"{self.head}:{PORT}")
        self.assertEqual(rc, 1)
        self.assertIn(f"the name '{names[1]}' is held by a live agent at "
                      f"{self.h.hosts[1]['good_addr']}:{PORT}", line)
        # a join to something that is not a caf-hvd agent: a web server (it reads the
        # request, here a TLS hello, before it answers; one that closed with the hello
        # unread would reset the connection, which a first join waits out like a busy
        # agent's dropped handshake)
        listener = subprocess.Popen(
            ["ip", "netns", "exec", self.h.hosts[0]["ns"], sys.executable, "-c",
             "import socket,time\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,"
             "socket.SO_REUSEADDR,1);s.bind(('0.0.0.0',9999));s.listen()\nprint('up',flush=True)\n"
             "while True:\n c,_=s.accept();c.settimeout(5)\n try:\n  c.recv(4096)\n"
             "  c.sendall(b'HTTP/1.0 200 OK\\r\\n\\r\\nhello');c.shutdown(socket.SHUT_WR)\n"
             "  c.recv(4096)\n except OSError:\n  pass\n c.close()"],
            stdout=subprocess.PIPE, text=True, start_new_session=True)
        self.h.procs.append(listener)
        self.assertEqual(listener.stdout.readline().strip(), "up")
        rc, line = refused_join(2, "--join", f"{self.head}:9999")
        self.assertEqual(rc, 1)
        self.assertIn(f"error: cannot join the cluster at {self.head}:9999", line)
        # labels that do not parse, a join address that is not one
        rc, out, err = self.h.run(2, [CAF_HVD, "node", "--label", "zone b", "--join", self.head])
        self.assertEqual(rc, 2)
        self.assertIn("--label 'zone b': give KEY=VALUE", err)
        rc, out, err = self.h.run(2, [CAF_HVD, "node", "--join", f"{self.head}:70000"])
        self.assertEqual(rc, 2)
        self.assertIn("'70000' is not a port", err)
        # status needs a driver's credentials: a node's directory has none
        rc, out, err = self.h.run(0, [CAF_HVD, "status", "--cluster", f"{self.head}:{PORT}",
                                      "--cluster-dir", issue("node", names[1])])
        self.assertEqual(rc, 1)
        self.assertIn("holds no driver certificate", err)
        # none of them got in
        t = self.table()
        self.assertEqual(sorted(t), sorted(names[:2]))

    def test_a_node_drained_while_its_agent_was_away_is_drained_when_it_joins_again(self):
        """An administrator drains a node whose agent is down (the table keeps the row as
        lost): the restarted agent learns it at its join and takes no new job, even one
        that names it with -H (which the table's placement never sees); an undrain
        frees it."""
        names = [x["name"] for x in self.h.hosts]
        admin = issue("admin", "root-admin")
        self.agent(0)
        self.agent(1)
        away = self.agent(2)
        self.wait_for("three nodes alive", self.all_alive(names))
        os.killpg(away.pid, signal.SIGKILL)
        away.wait(timeout=30)
        self.wait_for(f"{names[2]} lost", lambda: self.table()[names[2]]["state"] == "lost")

        def admin_cmd(verb):
            rc, out, err = self.h.run(0, [CAF_HVD, verb, names[2], "--cluster",
                                          f"{self.head}:{PORT}", "--cluster-dir", admin])
            self.assertEqual(rc, 0, err)
        admin_cmd("drain")
        self.agent(2)
        self.wait_for(f"{names[2]} joined again and drained", lambda: (
            "drained by the cluster's administrator while it was away" in self.drains[2].text()
            and self.table()[names[2]]["state"] == "drained"))
        spec = f"{self.h.hosts[2]['good_addr']}:{PORT}:1"
        rc, out, err = self.h.run(0, [CAF_HVD, "driver", "--cluster-dir", self.driver_dir,
                                      "-np", "1", "-H", spec, "--", "echo", "ran"])
        self.assertNotEqual(rc, 0, out)
        self.assertIn(f"node agent '{names[2]}' is drained: it takes no new jobs", err)
        admin_cmd("undrain")
        self.wait_for(f"{names[2]} undrained", lambda: "undrained" in self.drains[2].text())
        rc, out, err = self.h.run(0, [CAF_HVD, "driver", "--cluster-dir", self.driver_dir,
                                      "-np", "1", "-H", spec, "--", "echo", "ran"])
        self.assertEqual(rc, 0, err)
        self.assertEqual(rank_lines(out)[0], ["ran"])

    def test_a_job_waiting_for_slots_outlives_a_restart_of_the_tables_agent(self):
        """Issue 50 item 2: a static job waits for slots another job holds; the agent that
        holds the table restarts meanwhile (an upgrade's step). The waiting driver asks the
        new table once it is back instead of failing; the new table, which starts empty,
        neither refuses the job while the members join again nor gives it the slots the
        first job still holds; the job starts when they are freed."""
        names = [x["name"] for x in self.h.hosts]
        state = self.state_dirs(1)[0]
        holder = self.agent(0, "--label", "zone=a", "--state-dir", state)
        members = [self.agent(i, "--slots", "1", "--label", "zone=b") for i in (1, 2)]
        self.wait_for("three nodes alive", self.all_alive(names))
        marks = [f"/tmp/caf-hvd-membership-{os.getpid()}-{k}" for k in "ac"]
        for m in marks:
            self.addCleanup(lambda m=m: os.path.exists(m) and os.remove(m))
        a = self.start_job(2, "--node-label", "zone=b", marker=marks[0], name="a")
        a_slots = self.slots_of(a, 2)
        c = self.start_job(2, "--node-label", "zone=b", "--slot-wait", "120", marker=marks[1],
                           name="c", after=marks[0])
        self.assertRegex(c.stderr.readline(), r"caf-hvd: waiting for 2 slots labelled zone=b: "
                                              r"0 free of 2, 2 held by job \S+")

        def waiting():
            rc, out, err = self.h.run(0, [CAF_HVD, "jobs", "--cluster", f"{self.head}:{PORT}",
                                          "--cluster-dir", self.driver_dir, "--json"])
            self.assertEqual(rc, 0, err)
            return [(j["job"], j["since_ms"]) for j in json.loads(out)["jobs"]
                    if j["state"] == "waiting"]
        in_line = waiting()
        self.assertEqual(len(in_line), 1, in_line)
        # node 2's agent is paused across the restart (for less than its links' timeouts),
        # so the new table first knows only node 1: one slot labelled zone=b where c needs 2
        os.kill(members[1].pid, signal.SIGSTOP)
        try:
            os.killpg(holder.pid, signal.SIGTERM)
            self.assertEqual(holder.wait(timeout=60), 0)
            self.agent(0, "--label", "zone=a", "--state-dir", state)
            said = []
            while not any("the cluster's table restarted" in x for x in said):
                line = c.stderr.readline()
                self.assertTrue(line, "".join(said))
                said.append(line)
        finally:
            os.kill(members[1].pid, signal.SIGCONT)
        while not any("waiting for 2 slots labelled zone=b: 0 free of 2, 2 held by job" in x
                      for x in said[1:]):
            line = c.stderr.readline()
            self.assertTrue(line, "".join(said))
            said.append(line)
        # not refused for the slots the table did not know yet
        self.assertRegex(said[-2], r"caf-hvd: waiting for 2 slots labelled zone=b: the "
                                   r"cluster's table restarted \d+\.\d s ago and waits up to 10 "
                                   rf"s for its members to join again: 1 of 2 have \(not yet: "
                                   rf"{names[2]}\)")
        # (its link's end is seen at the next ask; a request in flight would time out)
        at = f"{re.escape(self.head)}:{PORT}"
        self.assertRegex(said[0], rf"caf-hvd: the cluster(\'s table at {at} went away \(its link "
                                  rf"broke\)| at {at} did not answer: .*); asking it again "
                                  r"until --slot-wait ends")
        self.assertIn(f"caf-hvd: the cluster at {self.head}:{PORT} answers again\n", said)
        self.assertIsNone(c.poll())
        # the new table read the waiting line from its agent's state directory: c is in it
        # since it first asked the old table, not since it asked the new one
        self.assertEqual(waiting(), in_line)
        open(marks[0], "w").close()
        out, err = a.communicate(timeout=60)
        self.assertEqual(a.returncode, 0, err)
        self.assertEqual(self.slots_of(c, 2), a_slots)  # the only two slots labelled zone=b
        open(marks[1], "w").close()
        out, err = c.communicate(timeout=60)
        self.assertEqual(c.returncode, 0, err)

    def test_jobs_started_while_the_tables_agent_restarts_wait_for_it(self):
        """A static and an elastic job started while the agent that holds the table is down
        (an upgrade's step) wait for it, saying so, and run once it is back; they failed
        at once ("cannot reach the cluster")."""
        names = [x["name"] for x in self.h.hosts]
        state = self.state_dirs(1)[0]
        holder = self.agent(0, "--state-dir", state)
        self.agent(1)
        self.wait_for("two nodes alive", self.all_alive(names[:2]))
        os.killpg(holder.pid, signal.SIGTERM)
        self.assertEqual(holder.wait(timeout=60), 0)
        static = subprocess.Popen(
            ["ip", "netns", "exec", self.h.hosts[0]["ns"], CAF_HVD, "driver", "--cluster-dir",
             self.driver_dir, "--cluster", f"{self.head}:{PORT}", "-np", "2", "--placement", "spread", "--",
             "sh", "-c", 'echo "ran on $HOROVOD_HOSTNAME"'],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.h.procs.append(static)
        elastic, until, seen = self.elastic_allreduce(100, "--min-np", "1")
        for p, said in ((static, r"cannot reach the cluster at .*: connection refused or host "
                                 r"unreachable .*; trying again until --slot-wait \(60 s\) ends"),
                        (elastic, r"waiting for the cluster's table at .*: could not reach it: "
                                  r"connection refused or host unreachable .*; trying again every "
                                  r"second for up to \d+ s \(--start-timeout\)")):
            line = p.stderr.readline()
            self.assertRegex(line, said, line + (p.stderr.read() if p.poll() is not None else ""))
        self.assertIsNone(static.poll())
        self.assertIsNone(elastic.poll())
        self.agent(0, "--state-dir", state)
        out, err = static.communicate(timeout=60)
        self.assertEqual(static.returncode, 0, err[-3000:])
        self.assertIn("the cluster at", err)
        self.assertEqual(sorted(x[0] for x in rank_lines(out).values()),
                         sorted(f"ran on {n}" for n in names[:2]))
        until(r"elastic run done", timeout=120)
        elastic.wait(timeout=60)
        self.assertEqual(elastic.returncode, 0, elastic.stderr.read()[-3000:])

    def test_an_elastic_job_keeps_its_hosts_while_the_tables_agent_restarts(self):
        """Issue 50 item 1: an elastic job on two members; the agent that holds the table
        restarts while one member's agent is paused, so the new table first knows one
        member only. The job keeps both hosts (the table says its answer is not final
        while members join again) instead of shrinking to the one it hears of first."""
        names = [x["name"] for x in self.h.hosts]
        state = self.state_dirs(1)[0]
        holder = self.agent(0, "--label", "zone=a", "--state-dir", state)
        members = [self.agent(i, "--slots", "1", "--label", "zone=b", link_timeout="10")
                   for i in (1, 2)]
        self.wait_for("three nodes alive", self.all_alive(names))
        steps = 1500
        p, until, seen = self.elastic_allreduce(steps, "--min-np", "1", "--node-label",
                                                "zone=b")
        errs = []
        reader = threading.Thread(target=lambda: errs.extend(iter(p.stderr.readline, "")),
                                  daemon=True)
        reader.start()
        until.stderr_lines = errs
        until(r"step \d+ size 2 ")
        os.kill(members[1].pid, signal.SIGSTOP)
        try:
            os.killpg(holder.pid, signal.SIGTERM)
            self.assertEqual(holder.wait(timeout=60), 0)
            self.agent(0, "--label", "zone=a", "--state-dir", state)
            # the job asks the new table while it knows node 1 only
            self.wait_for("the job's discovery during the table's rejoin window",
                          lambda: any("could not list its nodes yet" in x for x in errs))
        finally:
            os.kill(members[1].pid, signal.SIGCONT)
        until(r"elastic run done", timeout=120)
        text = "".join(seen) + p.stdout.read()
        p.wait(timeout=60)
        reader.join(timeout=10)
        err = "".join(errs)
        self.assertEqual(p.returncode, 0, err[-3000:])
        self.assertIn(f"elastic run done: {steps} steps, checksum {steps * (steps + 1) // 2}",
                      text)
        self.assertNotRegex(text, r"step \d+ size 1 ", "the job shrank to the first member "
                                                       "the new table knew")
        self.assertRegex(err, r"could not list its nodes yet: the cluster's table restarted "
                              r"\d+\.\d s ago and waits up to 10 s for its members to join "
                              rf"again: 1 of 2 have \(not yet: {names[2]}\)")

    def test_a_drain_outlives_its_agents_restart_and_an_undrain_given_while_away_ends_it(self):
        """Issue 50 item 3: with --state-dir, an administrator's drain is the node's own. The
        table's agent, drained and restarted (the table starts empty), comes back drained
        and takes no job until undrained; a member drained, then undrained while its
        agent was down, comes back drained from its own mark and is undrained by the
        table's word at its join."""
        names = [x["name"] for x in self.h.hosts]
        state = self.state_dirs(3)
        agents = [self.agent(i, "--state-dir", state[i]) for i in range(3)]
        self.wait_for("three nodes alive", self.all_alive(names))

        def job_on(i):
            return self.h.run(0, [CAF_HVD, "driver", "--cluster-dir", self.driver_dir, "-np",
                                  "1", "-H", f"{self.h.hosts[i]['good_addr']}:{PORT}:1", "--",
                                  "echo", "ran"])

        def restart(i, kill=signal.SIGTERM):
            os.killpg(agents[i].pid, kill)
            agents[i].wait(timeout=60)
            agents[i] = self.agent(i, "--state-dir", state[i])

        # the table's own node: drained, restarted, still drained in the new table
        self.as_admin("drain", 0)
        self.wait_for("the drain kept in node 0's state directory",
                      lambda: os.path.exists(os.path.join(state[0], "drained")))
        restart(0)
        self.wait_for("agent 0 saying it starts drained",
                      lambda: "drained, as before this start" in self.drains[0].text())
        self.assertIn("drained by the cluster's administrator 'root-admin'",
                      self.drains[0].text())
        self.wait_for("the rebuilt table with node 0 drained and the others back", lambda: (
            self.table()[names[0]]["state"] == "drained"
            and all(self.table().get(n, {}).get("state") == "alive" for n in names[1:])),
            seconds=30)
        rc, out, err = job_on(0)
        self.assertNotEqual(rc, 0, out)
        self.assertIn(f"node agent '{names[0]}' is drained: it takes no new jobs", err)
        self.as_admin("undrain", 0)
        self.assertFalse(os.path.exists(os.path.join(state[0], "drained")))
        rc, out, err = job_on(0)
        self.assertEqual(rc, 0, err)
        # a member: drained, its agent killed, undrained while it is away
        self.as_admin("drain", 2)
        self.wait_for("node 2 drained", lambda: "drained by the cluster's administrator"
                      in self.drains[2].text())
        os.killpg(agents[2].pid, signal.SIGKILL)
        agents[2].wait(timeout=30)
        self.wait_for(f"{names[2]} lost", lambda: self.table()[names[2]]["state"] == "lost")
        self.as_admin("undrain", 2)
        agents[2] = self.agent(2, "--state-dir", state[2])
        self.wait_for("agent 2 undrained at its join", lambda: (
            "undrained by the cluster's administrator while it was away"
            in self.drains[2].text()), seconds=30)
        self.assertIn("drained, as before this start", self.drains[2].text())
        self.assertFalse(os.path.exists(os.path.join(state[2], "drained")))
        rc, out, err = job_on(2)
        self.assertEqual(rc, 0, err)
        self.assertEqual(rank_lines(out)[0], ["ran"])

    def test_a_rolling_upgrade_of_every_node_ends_with_the_elastic_job_at_full_size(self):
        """Issue 50 item 3: under an elastic job with a rank on each of three nodes, each
        node in turn (the table's own last) is drained, its agent restarted (an upgrade's
        step) and undrained: the job leaves it, does not take it back while it is drained
        after its restart, grows back onto it after the undrain, and ends at full size with
        every step's data right (the program checks its state at each resume)."""
        names = [x["name"] for x in self.h.hosts]
        state = self.state_dirs(3)
        agents = [self.agent(i, "--slots", "1", "--state-dir", state[i]) for i in range(3)]
        self.wait_for("three nodes alive", self.all_alive(names))
        steps = 2500  # 50 s: the three rounds take a few seconds each
        p, until, seen = self.elastic_allreduce(steps, "--min-np", "1")
        until(r"step \d+ size 3 ")

        for i in (1, 2, 0):
            self.as_admin("drain", i)
            until(r"step \d+ size 2 ")
            os.killpg(agents[i].pid, signal.SIGTERM)
            self.assertEqual(agents[i].wait(timeout=60), 0)
            agents[i] = self.agent(i, "--slots", "1", "--state-dir", state[i])
            self.wait_for(f"node {i} back and drained", lambda i=i: (
                "drained, as before this start" in self.drains[i].text()
                and self.table().get(names[i], {}).get("state") == "drained"), seconds=30)
            # drained after its restart: the job stays at 2 for steps it makes meanwhile
            mark = len(seen)
            until(r"step \d+ size 2 ")
            until(r"step \d+ size 2 ")
            self.assertFalse([line for line in seen[mark:] if re.search(r"size 3 ", line)])
            self.as_admin("undrain", i)
            until(r"step \d+ size 3 ")
        out, err = p.communicate(timeout=180)
        text = "".join(seen) + out
        self.assertEqual(p.returncode, 0, err[-3000:])
        self.assertIn(f"elastic run done: {steps} steps, checksum {steps * (steps + 1) // 2}",
                      text)
        for n in names:
            self.assertRegex(err, rf"\(removed {n}\)")
        self.assertNotIn("blacklisted", err)

    def test_the_operators_page_from_enrolment_to_revocation_and_cancel(self):
        """docs/operating.md followed on network-namespace hosts, as far as a test can (the
        package's install and systemd are the package suite's): a cluster of its own made
        with `cluster init`, each host given only its issued directory, the table and joins,
        a first job placed by the table, status, an operator's drain, a job cancelled by
        its driver's SIGTERM, and a revocation that the agents' reload makes final."""
        import shutil
        import tempfile
        names = [x["name"] for x in self.h.hosts]
        work = tempfile.mkdtemp(prefix="caf-hvd-operator-")
        self.addCleanup(shutil.rmtree, work, True)
        ca = os.path.join(work, "ca")

        def cluster(*args):
            r = subprocess.run([CAF_HVD, "cluster", *args], capture_output=True, text=True,
                               timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
        # 3. the credentials, and a directory per host that holds no CA or driver key
        cluster("init", ca)
        hosts = {}
        for n in names:
            cluster("add-node", n, ca)
            hosts[n] = os.path.join(work, "hosts", n, "cluster")
            shutil.copytree(os.path.join(ca, "issued", n), hosts[n])
            self.assertEqual(sorted(os.listdir(hosts[n])), ["ca.pem", "node.key", "node.pem"])
        # 4. the head node holds the table, the others join it
        agents = [self.agent(i, "--slots", "2", cert=hosts[n]) for i, n in enumerate(names)]
        alice, bob, ops = (os.path.join(work, x) for x in ("alice", "bob", "ops"))
        cluster("add-driver", "alice", ca, "--out", alice)
        cluster("add-driver", "bob", ca, "--out", bob)
        cluster("add-admin", "ops", ca, "--out", ops)
        self.driver_dir = bob  # status (7.) as bob
        self.wait_for("three nodes alive", self.all_alive(names))
        # 5. a first job, placed by the table
        on_head = [CAF_HVD, "driver", "--cluster", f"{self.head}:{PORT}"]
        rc, out, err = self.h.run(0, [*on_head, "--cluster-dir", alice, "-np", "4", "--",
                                      ALLREDUCE])
        self.assertEqual(rc, 0, err)
        self.assertIn("caf-hvd-allreduce: all sums correct", out)
        # 8. an operator's drain: status says so; undrain brings the node back
        for verb, state in (("drain", "drained"), ("undrain", "alive")):
            rc, out, err = self.h.run(0, [CAF_HVD, verb, names[2], "--cluster",
                                          f"{self.head}:{PORT}", "--cluster-dir", ops])
            self.assertEqual(rc, 0, err)
            self.wait_for(f"{names[2]} {state}",
                          lambda: self.table()[names[2]]["state"] == state)
        # 10. cancelling: SIGTERM to the driver ends the job with 143 and its ranks
        mark = f"{time.monotonic_ns() % 10**9}"
        job = subprocess.Popen(
            ["ip", "netns", "exec", self.h.hosts[0]["ns"], *on_head, "--cluster-dir", alice,
             "-np", "4", "--", "sh", "-c", f"echo started; exec sleep 300.{mark}"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.h.procs.append(job)
        until, _ = line_reader(job)
        for _ in range(4):
            until("started")
        os.killpg(job.pid, signal.SIGTERM)
        out, err = job.communicate(timeout=60)
        self.assertEqual(job.returncode, 143, err)
        self.wait_for("the cancelled job's ranks gone",
                      lambda: not pids_matching(f"sleep 300.{mark}", prefix=True))
        # 9. revocation: the list in every host's directory, the agents reloaded
        cluster("revoke", "alice", ca)
        for i, n in enumerate(names):
            shutil.copy(os.path.join(ca, "crl.pem"), os.path.join(hosts[n], "crl.pem"))
            os.killpg(agents[i].pid, signal.SIGHUP)
        for i in range(len(names)):
            self.wait_for(f"agent {i} reloaded", lambda i=i: "SIGHUP: reloaded the credentials"
                          in self.drains[i].text())
        rc, out, err = self.h.run(0, [*on_head, "--cluster-dir", alice, "-np", "1", "--",
                                      "true"])
        self.assertNotEqual(rc, 0, err)
        self.assertIn("the cluster revoked it", err)
        rc, out, err = self.h.run(0, [*on_head, "--cluster-dir", bob, "-np", "1", "--",
                                      "echo", "bob"])
        self.assertEqual(rc, 0, err)
        self.assertEqual(rank_lines(out)[0], ["bob"])


@unittest.skipIf(WHY_NOT, WHY_NOT or "")
class HorovodOnTheCluster(OnNetnsHosts, unittest.TestCase):
    """Real Horovod 0.28.1 (scripts/setup-horovod.sh) in an elastic job that follows the
    cluster's table: the program of the horovod-elastic suite (hvd.elastic.run, TorchState,
    a commit every 5 steps) with --cluster and no discovery script."""
    count = 4

    def read_until(self, pred, timeout, what):
        """Reads the driver's stdout until pred(events) holds; fails with its output."""
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
        os.killpg(self.driver.pid, 9)
        out, err = self.driver.communicate()
        logs = "\n".join(f"agent {i}:\n{d.text()[-1500:]}" for i, d in sorted(self.drains.items()))
        raise AssertionError(f"no {what} within {timeout}s:\n{''.join(self.lines)[-3000:]}"
                             f"{out[-1000:]}\n{err[-4000:]}\n{logs}")

    @staticmethod
    def committed_at(size, after):
        """A commit of rank 0 after it resumed at `size`, both after event `after`."""
        def pred(events):
            at = [i for i, e in enumerate(events)
                  if i >= after and e[0] == "resume" and e[1] == size]
            return bool(at) and any(e[0] == "commit" for e in events[at[0]:])
        return pred

    def train(self, steps, max_np):
        """Starts the training program on host 0's driver over the cluster, --min-np 1."""
        from run_horovod_elastic_tests import TRAIN, Horovod, horovod_site
        self.program = Horovod()
        env = self.program.env(steps, {"TRAIN_STEP_MS": "100", "PYTHONPATH": horovod_site()})
        args = ["ip", "netns", "exec", self.h.hosts[0]["ns"], CAF_HVD, "driver",
                "--cluster-dir", self.driver_dir, "--cluster", f"{self.head}:{PORT}",
                "--min-np", "1", "--max-np", str(max_np), "--discovery-interval", "600",
                "--kill-grace-seconds", "2"]
        for k, v in env.items():
            args += ["--env", f"{k}={v}"]
        self.driver = subprocess.Popen(args + ["--", "/usr/bin/python3", TRAIN],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True, start_new_session=True)
        self.h.procs.append(self.driver)
        self.lines = []

    def finish(self):
        """Waits for the job's end (exit 0); checks that no generation resumed before a
        committed step; -> (events, done lines, stdout text, stderr)."""
        try:
            out, err = self.driver.communicate(timeout=150)
        except subprocess.TimeoutExpired:
            os.killpg(self.driver.pid, 9)
            out, err = self.driver.communicate()
            raise AssertionError(f"the job did not finish:\n{err[-4000:]}")
        text = "".join(self.lines) + out
        self.assertEqual(self.driver.returncode, 0, err[-4000:])
        events, done = self.program.parse(text)
        last_commit = 0
        for e in events:
            if e[0] == "commit":
                last_commit = max(last_commit, e[1])
            elif e[0] == "resume":
                self.assertGreaterEqual(e[2], last_commit, f"a generation resumed at step "
                                        f"{e[2]} after step {last_commit} was committed")
        return events, done, text, err

    def test_real_horovod_grows_onto_a_joining_agent_and_leaves_drained_nodes(self):
        names = [x["name"] for x in self.h.hosts]
        admin = issue("admin", "root-admin")
        for i in (0, 1, 3):
            self.agent(i, "--slots", "1")
        self.wait_for("three nodes alive", self.all_alive([names[i] for i in (0, 1, 3)]))
        steps = 500
        self.train(steps, 4)
        events = self.read_until(self.committed_at(3, 0), 120, "a commit at size 3")

        # an agent joins mid-job: the job grows onto it at a commit
        joiner = self.agent(2, "--slots", "1", "--drain-grace", "60")
        events = self.read_until(self.committed_at(4, len(events)), 90, "a commit at size 4")
        # SIGTERM with --drain-grace: the job leaves the node at its next commit, the agent
        # exits once its rank is gone
        os.killpg(joiner.pid, signal.SIGTERM)
        events = self.read_until(self.committed_at(3, len(events)), 90,
                                 "a commit at size 3 after the drain")
        self.assertEqual(joiner.wait(timeout=30), 0, self.drains[2].text())
        self.assertIn("drained: no ranks left", self.drains[2].text())
        # rank 0's node is drained by an administrator
        rank0_host = [e for e in events if e[0] == "resume"][-1][3]
        rc, out, err = self.h.run(0, [CAF_HVD, "drain", rank0_host, "--cluster",
                                      f"{self.head}:{PORT}", "--cluster-dir", admin])
        self.assertEqual(rc, 0, err)
        events = self.read_until(self.committed_at(2, len(events)), 90,
                                 "a commit at size 2 after rank 0's node was drained")
        self.wait_for("rank 0's node drained",
                      lambda: self.table()[rank0_host]["state"] == "drained")
        # no step was done twice: the drains cost no rollback
        stepped = [e[1] for e in events if e[0] == "step"]
        again = [b for a, b in zip(stepped, stepped[1:]) if b <= a]
        self.assertFalse(again, f"steps done again: {again}\n{''.join(self.lines)[-3000:]}")
        # another agent is SIGKILLed: a lost host; the job goes on on the last one
        rank0_now = [e for e in events if e[0] == "resume"][-1][3]
        victim = next(i for i in (1, 3, 0) if names[i] not in (rank0_host, rank0_now))
        os.killpg(self.drains[victim].p.pid, signal.SIGKILL)
        events, done, text, err = self.finish()
        self.assertEqual(done, [(0, 1, steps, "equal")], text[-2000:])
        sizes = [e[1] for e in events if e[0] == "resume"]
        self.assertEqual(sizes, [3, 4, 3, 2, 1], text[-3000:])
        self.assertRegex(err, rf"generation 2: 4 ranks on .*\(added {names[2]}\)")
        self.assertRegex(err, rf"generation 3: 3 ranks on .*\(removed {names[2]}\)")
        self.assertRegex(err, rf"generation 4: 2 ranks on .*\(removed {rank0_host}\)")
        self.assertRegex(err, rf"node agent {names[victim]} \(\S+\) was lost")
        # drained nodes are not at fault: never blacklisted, their agents' exits are no
        # loss, their ranks' ends (Horovod's re-init aborts a removed worker) no failure
        for n in (names[2], rank0_host):
            self.assertNotIn(f"host {n} is blacklisted", err)
            self.assertRegex(err, rf"caf-hvd:   hosts .*\b{n} removed\b")
        self.assertNotIn(f"node agent {names[2]} ", err)
        ends = re.search(r"caf-hvd:   processes +\d+ \((.*)\);", err).group(1)
        removed = [int(m.group(1)) for m in re.finditer(r"(\d+) x (?:code \d+ on a removed "
                                                         r"host|exit 0)", ends)]
        self.assertEqual(sum(removed), 3, ends)  # the drained nodes' ranks and the last one


    def test_real_horovod_moves_off_a_drained_node_that_held_every_rank(self):
        # Both ranks run on host 0; host 1 joins; host 0 is drained. Its rank 0 carries the
        # state into one more plan beside host 1's newcomer (state.sync() after its
        # hvd.init()), then the job leaves host 0 and ends at size 2 on host 1, no step
        # done twice, every rank's parameters equal.
        names = [x["name"] for x in self.h.hosts]
        self.agent(0, "--slots", "2")
        self.wait_for("host 0 alive", self.all_alive(names[:1]))
        steps = 200
        self.train(steps, 2)
        self.read_until(self.committed_at(2, 0), 120, "a commit at size 2")
        self.agent(1, "--slots", "2")
        self.wait_for("host 1 alive", self.all_alive(names[:2]))
        self.as_admin("drain", 0)

        def on_host_1(events):
            at = [i for i, e in enumerate(events) if e[0] == "resume" and e[3] == names[1]]
            return bool(at) and any(e[0] == "commit" for e in events[at[0]:])
        self.read_until(on_host_1, 120, "a commit with rank 0 on host 1")
        events, done, text, err = self.finish()
        self.assertEqual(sorted(done), [(0, 2, steps, "equal"), (1, 2, steps, "equal")],
                         text[-2000:])
        stepped = [e[1] for e in events if e[0] == "step"]
        again = [b for a, b in zip(stepped, stepped[1:]) if b <= a]
        self.assertFalse(again, f"steps done again: {again}\n{text[-3000:]}")
        self.assertEqual([(e[1], e[3]) for e in events if e[0] == "resume"],
                         [(2, names[0]), (2, names[0]), (2, names[1])], text[-3000:])
        self.assertIn(f"node {names[0]} drains and its ranks hold the job's only training state",
                      err)
        self.assertRegex(err, rf"generation \d+: 2 ranks on {names[0]}:1,{names[1]}:1")
        self.assertRegex(err, rf"generation \d+: 2 ranks on {names[1]}:2 \(removed {names[0]}\)")
        self.assertNotIn("blacklisted", err)


if __name__ == "__main__":
    if WHY_NOT:
        print(f"membership tests skipped: {WHY_NOT}")
    # --horovod: the real-Horovod class (its own meson suite, after Horovod is built)
    horovod = "--horovod" in sys.argv
    sys.exit(run_suite(HorovodOnTheCluster if horovod else MembershipTest,
                       [a for a in sys.argv[1:] if a != "--horovod"], leftover_ranks))
