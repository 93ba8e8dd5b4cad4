"""GPU slot tests without GPUs: node agents declare devices with --gpus, and each rank's
CUDA_VISIBLE_DEVICES (and the rest of the GPU contract) is read back from the rank's
own environment. Concurrent jobs on one agent, devices coming back after a job ends,
fails or loses its driver, refusals before start, elastic slot counts. Run by
`meson test`; prints a closing 'N passed, N failed' line."""

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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import CAF_HVD, Cluster, rank_envs, rank_lines, run_suite, wait_until  # noqa: E402

SHOW = ["sh", "-c", "echo CVD=${CUDA_VISIBLE_DEVICES-unset} HOST=$HOROVOD_HOSTNAME "
                    "LR=$HOROVOD_LOCAL_RANK OPS=${HOROVOD_GPU_OPERATIONS-unset} "
                    "ORDER=${CUDA_DEVICE_ORDER-unset} OMP=${OMP_NUM_THREADS-unset}"]
FIELDS = re.compile(r"CVD=(\S+) HOST=(\S+) LR=(\d+) OPS=(\S+) ORDER=(\S+) OMP=(\S+)")


def shown(out):
    """rank -> dict of what SHOW printed."""
    got = {}
    for rank, lines in rank_lines(out).items():
        m = FIELDS.search(lines[0])
        got[rank] = dict(zip(("cvd", "host", "lr", "ops", "order", "omp"), m.groups()))
    return got


class GpuTest(unittest.TestCase):
    def setUp(self):
        self.c = Cluster()
        self.addCleanup(self.c.close)

    def nodes(self, *specs):
        """specs: (name, gpus) pairs; starts agents declaring those devices."""
        for name, gpus in specs:
            self.c.node(name, extra=["--gpus", gpus])

    def driver(self, hosts, *flags, cmd=SHOW, timeout=60):
        h = ",".join(self.c.spec(n, s) for n, s in hosts)
        return self.c.run(["driver", "-H", h, "--quiet", *flags, "--", *cmd], timeout=timeout)

    def test_layouts_shared_and_per_rank(self):
        self.nodes(("g1", "0,1,2,3"), ("g2", "0,1,2,3"))
        cases = [
            # hosts, gpus per slot, mode, expected CUDA_VISIBLE_DEVICES per rank
            ([("g1", 2), ("g2", 2)], 1, "shared", ["0,1", "0,1", "0,1", "0,1"]),
            ([("g1", 2), ("g2", 2)], 1, "per-rank", ["0", "1", "0", "1"]),
            ([("g1", 2), ("g2", 2)], 2, "shared", ["0,1,2,3"] * 4),
            ([("g1", 2), ("g2", 2)], 2, "per-rank", ["0,1", "2,3", "0,1", "2,3"]),
            ([("g1", 3), ("g2", 1)], 1, "shared", ["0,1,2", "0,1,2", "0,1,2", "0"]),
            ([("g1", 3), ("g2", 1)], 1, "per-rank", ["0", "1", "2", "0"]),
        ]
        for hosts, g, mode, want in cases:
            with self.subTest(hosts=hosts, g=g, mode=mode):
                rc, out, err = self.driver(hosts, "-np", "4", "--gpus-per-slot", str(g),
                                           "--cuda-visible-devices", mode)
                self.assertEqual(rc, 0, err)
                got = shown(out)
                self.assertEqual([got[r]["cvd"] for r in range(4)], want)
                for r in range(4):
                    self.assertEqual(got[r]["ops"], "NCCL")
                    self.assertEqual(got[r]["order"], "PCI_BUS_ID")
                # shared: local rank i's own group is the i-th of the list
                if mode == "shared":
                    for r in range(4):
                        devs = got[r]["cvd"].split(",")
                        lr = int(got[r]["lr"])
                        self.assertLessEqual((lr + 1) * g, len(devs))

    def test_concurrent_jobs_get_disjoint_devices_which_come_back(self):
        self.nodes(("c1", "0,1,2,3"))
        hold = ["sh", "-c", "echo CVD=$CUDA_VISIBLE_DEVICES; exec sleep 60"]
        h = self.c.spec("c1", 2)

        def start_holding():
            p = self.c.start(["driver", "-H", h, "-np", "2", "--use-gpu", "--quiet",
                              "--cuda-visible-devices", "per-rank", "--", *hold])
            seen = {}
            while len(seen) < 2:
                line = p.stdout.readline()
                self.assertTrue(line, "the job ended before both ranks printed")
                m = re.match(r"\[(\d+)\]<stdout>:CVD=(\S+)", line)
                if m:
                    seen[int(m.group(1))] = m.group(2)
            return p, set(seen.values())

        a, devs_a = start_holding()
        b, devs_b = start_holding()
        self.assertEqual(len(devs_a | devs_b), 4, (devs_a, devs_b))
        self.assertEqual(devs_a & devs_b, set())
        # a third job finds none free: refused before start, naming the counts
        rc, out, err = self.driver([("c1", 1)], "-np", "1", "--use-gpu")
        self.assertNotEqual(rc, 0)
        self.assertEqual(rank_lines(out), {})
        self.assertIn("not enough GPUs for 1 rank with 1 GPU per slot: c1 has 0 free of 4 "
                      "(needs 1 for 1 slot x 1)", err)
        # a driver SIGKILLed: its devices come back once its ranks are gone
        os.killpg(a.pid, signal.SIGKILL)
        a.wait()

        def two_free():
            rc, out, err = self.driver([("c1", 2)], "-np", "2", "--use-gpu",
                                       "--cuda-visible-devices", "per-rank")
            return rc == 0 and {v["cvd"] for v in shown(out).values()} == devs_a
        wait_until(two_free, 20, "the killed driver's devices to come back")
        # a job that ends (here: fails) gives its devices back at once
        os.killpg(b.pid, signal.SIGTERM)
        b.wait(timeout=30)
        rc, out, err = self.driver([("c1", 4)], "-np", "4", "--use-gpu", cmd=["false"])
        self.assertNotEqual(rc, 0)
        rc, out, err = self.driver([("c1", 4)], "-np", "4", "--use-gpu")
        self.assertEqual(rc, 0, err)
        self.assertEqual(shown(out)[0]["cvd"], "0,1,2,3")

    def test_too_few_devices_refused_before_start(self):
        self.nodes(("t1", "0,1"), ("t2", "none"))
        rc, out, err = self.driver([("t1", 2), ("t2", 1)], "-np", "3", "--gpus-per-slot", "2")
        self.assertNotEqual(rc, 0)
        self.assertEqual(rank_lines(out), {})
        self.assertIn("not enough GPUs for 3 ranks with 2 GPUs per slot: t1 has 2 free of 2 "
                      "(needs 4 for 2 slots x 2); t2 has no GPUs (--gpus; declare them with "
                      "--gpus)", err)

    def test_head_node_cuda_visible_devices_does_not_leak(self):
        self.nodes(("l1", "0,1"))
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="5")
        rc, out, err = self.c.run(["driver", "-H", self.c.spec("l1", 2), "-np", "2", "--quiet",
                                   "--", "env"], env=env)
        self.assertEqual(rc, 0, err)
        for r, e in rank_envs(out).items():
            self.assertNotIn("CUDA_VISIBLE_DEVICES", e)
        rc, out, err = self.c.run(["driver", "-H", self.c.spec("l1", 2), "-np", "2", "--quiet",
                                   "--use-gpu", "--cpus-per-slot", "2", "--", *SHOW], env=env)
        self.assertEqual(rc, 0, err)
        self.assertEqual(sorted(v["cvd"] for v in shown(out).values()), ["0,1", "0,1"])
        self.assertEqual({v["omp"] for v in shown(out).values()}, {"2"})
        # --env still overrides
        rc, out, err = self.c.run(["driver", "-H", self.c.spec("l1", 2), "-np", "2", "--quiet",
                                   "--use-gpu", "--env", "CUDA_VISIBLE_DEVICES=9", "--", *SHOW])
        self.assertEqual({v["cvd"] for v in shown(out).values()}, {"9"})

    def test_local_run_and_bad_flags(self):
        rc, out, err = self.c.run(["run", "-np", "2", "--gpus", "0,1,2,3", "--gpus-per-slot", "2",
                                   "--cuda-visible-devices", "per-rank", "--quiet", "--", *SHOW])
        self.assertEqual(rc, 0, err)
        self.assertEqual([shown(out)[r]["cvd"] for r in range(2)], ["0,1", "2,3"])
        for args, msg in [
            (["run", "-np", "1", "--gpus", "0,0", "--", "true"], "device 0 is listed twice"),
            (["run", "-np", "1", "--gpus-per-slot", "-1", "--", "true"],
             "--gpus-per-slot -1: expected 0 to 64"),
            (["run", "-np", "1", "--cuda-visible-devices", "mine", "--", "true"],
             "expected shared or per-rank"),
            (["run", "-np", "1", "--use-gpu", "--gpus-per-slot", "2", "--", "true"],
             "--use-gpu means --gpus-per-slot 1"),
            (["run", "-np", "1", "--cpus-per-slot", "0", "--", "true"], "expected at least 1"),
            (["node", "--gpus", "a"], "'a' is not a device index"),
        ]:
            rc, out, err = self.c.run(args)
            self.assertNotEqual(rc, 0, args)
            self.assertIn(msg, err, args)

    def test_elastic_slots_bounded_by_free_devices(self):
        self.nodes(("e1", "0,1"), ("e2", "0,1,2"))
        d = tempfile.mkdtemp(prefix="caf-hvd-gpu-")
        self.addCleanup(shutil.rmtree, d, True)
        script = os.path.join(d, "discover.sh")
        with open(script, "w") as f:
            f.write(f"#!/bin/sh\necho 127.0.0.1:{self.c.nodes['e1'][1]}:4\n"
                    f"echo 127.0.0.1:{self.c.nodes['e2'][1]}:4\n")
        os.chmod(script, stat.S_IRWXU)
        rc, out, err = self.c.run(["driver", "--host-discovery-script", script, "--min-np", "3",
                                   "--discovery-interval", "0.1", "--use-gpu",
                                   "--cuda-visible-devices", "per-rank", "--", *SHOW])
        self.assertEqual(rc, 0, err)
        self.assertIn("generation 1: 5 ranks on e1:2,e2:3", err)
        got = shown(out)
        self.assertEqual(sorted((v["host"], v["cvd"]) for v in got.values()),
                         [("e1", "0"), ("e1", "1"), ("e2", "0"), ("e2", "1"), ("e2", "2")])


if __name__ == "__main__":
    sys.exit(run_suite(GpuTest, sys.argv[1:]))
