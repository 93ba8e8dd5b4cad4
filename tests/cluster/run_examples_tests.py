"""The guide's examples (examples/), each run as its page shows it, with real Horovod
(scripts/setup-horovod.sh) and Debian's torch: on this machine and over node agents.
Every example checks its own result and exits 1 when a check fails; the tests also read
what it printed. (examples/horovod_trainer_quickstart.py and examples/executor_torch.py
run in the horovod-ray and executor suites.) Prints 'N passed, N failed'."""

import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import (Cluster, horovod_site, pid_with_env, rank_lines, read_line,  # noqa: E402
                     run_suite)

ROOT = os.path.dirname(os.path.dirname(HERE))
EXAMPLES = os.path.join(ROOT, "examples")
PYTHON = "/usr/bin/python3"


class ExamplesTest(unittest.TestCase):
    def setUp(self):
        self.c = Cluster()
        self.addCleanup(self.c.close)
        self.dir = tempfile.mkdtemp(prefix="caf-hvd-examples-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.saved = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "python"),
                                                    horovod_site()])
        self.addCleanup(self.restore_path)

    def restore_path(self):
        if self.saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = self.saved

    def example(self, name):
        return os.path.join(EXAMPLES, name)

    def test_horovod_train_as_horovodrun_runs_it(self):
        rc, out, err = self.c.run(["run", "-np", "2", "--", PYTHON,
                                   self.example("horovod_train.py")], timeout=120)
        self.assertEqual(rc, 0, err)
        lines = rank_lines(out)
        self.assertEqual(sorted(lines), [0, 1])
        checksums = set()
        for r in (0, 1):
            m = re.match(rf"rank {r} of 2: loss \S+ -> \S+, weights checksum (\S+) ok$",
                         lines[r][-1])
            self.assertTrue(m, lines[r])
            checksums.add(m.group(1))
        self.assertEqual(len(checksums), 1, lines)

    def test_horovod_train_over_two_agents(self):
        self.c.node("ea")
        self.c.node("eb")
        rc, out, err = self.c.run(["driver", "-np", "4", "-H",
                                   f"{self.c.spec('ea', 2)},{self.c.spec('eb', 2)}", "--",
                                   PYTHON, self.example("horovod_train.py")], timeout=120)
        self.assertEqual(rc, 0, err)
        lines = rank_lines(out)
        self.assertEqual(sorted(lines), [0, 1, 2, 3])
        for r, got in lines.items():
            self.assertTrue(got[-1].startswith(f"rank {r} of 4:") and got[-1].endswith(" ok"),
                            got)

    def test_ray_executor_stateless_and_stateful(self):
        r = subprocess.run([PYTHON, self.example("ray_executor.py"), "--workers", "2"],
                           capture_output=True, text=True, timeout=180)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertTrue(r.stdout.strip().splitlines()[-1].startswith("ranks [(0, 2), (1, 2)]; "),
                        r.stdout)
        self.assertTrue(r.stdout.strip().endswith("; ok"), r.stdout)

    def test_ray_executor_over_agents(self):
        self.c.node("ra")
        self.c.node("rb")
        hosts = f"{self.c.spec('ra', 1)},{self.c.spec('rb', 1)}"
        r = subprocess.run([PYTHON, self.example("ray_executor.py"), "--workers", "2",
                            "--hosts", hosts, "--cluster-dir", os.environ["CAF_HVD_CLUSTER_DIR"]],
                           capture_output=True, text=True, timeout=180)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertTrue(r.stdout.strip().endswith("; ok"), r.stdout)

    def test_torch_ddp_gloo_under_env(self):
        rc, out, err = self.c.run(["run", "-np", "2", "--", PYTHON,
                                   self.example("torch_ddp_gloo.py")], timeout=120)
        self.assertEqual(rc, 0, err)

    def test_horovod_elastic_grows_and_goes_on_after_a_killed_rank(self):
        """Starts on one host, a second joins (the job grows at a commit), then the
        second host's rank is killed: the job goes on from its last commit on one host and
        ends at the last step; rank 0's steps never go below a commit it resumed from."""
        self.c.node("xa")
        self.c.node("xb")
        hosts = os.path.join(self.dir, "hosts")
        script = os.path.join(self.dir, "discover.sh")
        with open(hosts, "w") as f:
            f.write(self.c.spec("xa", 1) + "\n")
        with open(script, "w") as f:
            f.write(f"#!/bin/sh\ncat {hosts}\n")
        os.chmod(script, stat.S_IRWXU)
        env = dict(os.environ, STEPS="80", COMMIT="5", STEP_MS="100")
        p = self.c.start(["driver", "--host-discovery-script", script, "--min-np", "1",
                          "--discovery-interval", "0.2", "--", PYTHON,
                          self.example("horovod_elastic.py")], env=env)
        out_lines = []

        def read_until(pattern, timeout):
            # never past the matched line (read_line): communicate() gets every line after it
            deadline = time.monotonic() + timeout
            while True:
                line = read_line(p.stdout.fileno(), deadline)
                if line:
                    out_lines.append(line.rstrip("\n"))
                if not line.endswith("\n"):
                    break
                if re.search(pattern, line):
                    return
            raise AssertionError(f"no line matching {pattern!r}:\n" + "\n".join(out_lines[-30:]))

        read_until(r"step 10 size 1$", 90)
        with open(hosts, "w") as f:
            f.write(self.c.spec("xa", 1) + "\n" + self.c.spec("xb", 1) + "\n")
        read_until(r"step \d+ size 2$", 90)
        read_until(r"step \d+ size 2$", 30)
        victim = pid_with_env(PYTHON, HOROVOD_HOSTNAME="xb")
        self.assertIsNotNone(victim, "no rank on xb")
        os.kill(victim, signal.SIGKILL)
        out, err = p.communicate(timeout=180)
        out_lines += out.splitlines()
        self.assertEqual(p.returncode, 0, err[-3000:])
        zero = [l.split(":", 1)[1] for l in out_lines if l.startswith("[0]<stdout>:")]
        steps, sizes, resumed = [], [], []
        for l in zero:
            m = re.match(r"step (\d+) size (\d+)$", l)
            if m:
                steps.append(int(m.group(1)))
                if not sizes or sizes[-1] != int(m.group(2)):
                    sizes.append(int(m.group(2)))
            m = re.match(r"resumed at (\d+) with", l)
            if m:
                resumed.append((len(steps), int(m.group(1))))
        self.assertEqual(sizes, [1, 2, 1], zero[-20:])
        # between resumes the steps rise by one; a resume restarts at a commit (a multiple
        # of COMMIT) no later than where rank 0 had got
        for (at, step), nxt in zip(resumed, resumed[1:] + [(len(steps), None)]):
            self.assertEqual(step % 5, 0, resumed)
            run = steps[at:nxt[0]]
            self.assertEqual(run, list(range(step + 1, step + 1 + len(run))), (resumed, zero))
            if at > 0:
                self.assertLessEqual(step, steps[at - 1], resumed)
        self.assertEqual(steps[-1], 80)
        done = [l for l in out_lines if "done: rank" in l]
        self.assertTrue(done and all(l.endswith(" ok") for l in done), done)
        self.assertIn("host xb is blacklisted", err)


if __name__ == "__main__":
    sys.exit(run_suite(ExamplesTest, sys.argv[1:]))
