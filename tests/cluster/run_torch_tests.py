"""torch store tests: real drivers and node agents, ranks that are torch (Debian's 1.13)
and torch 2.x wire clients of the job's TCPStore, the messages when a client speaks a
protocol the store does not serve, --torch-store off, and a fresh key space per
elastic generation. Run by `meson test`; prints a closing 'N passed, N failed' line."""

import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Cluster, rank_envs, rank_lines, read_line, run_suite  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENT = ["/usr/bin/python3", os.path.join(HERE, "torch_store_client.py")]
ROOT = os.path.dirname(os.path.dirname(HERE))


class TorchStoreTest(unittest.TestCase):
    def setUp(self):
        self.c = Cluster()
        self.addCleanup(self.c.close)

    def test_torch_113_and_a_2x_client_share_the_jobs_store(self):
        setup = subprocess.run([os.path.join(ROOT, "scripts", "setup-torch.sh")],
                               capture_output=True, text=True)
        if setup.returncode != 0:
            self.skipTest("Debian's python3-torch could not be installed: "
                          + setup.stderr[-500:])
        rc, out, err = self.c.run(["run", "-np", "2", "--", *CLIENT, "mixed"], timeout=120)
        self.assertEqual(rc, 0, err)
        lines = rank_lines(out)
        self.assertRegex(lines[0][0], r"^rank 0 \(torch 1\.13[^)]*\) got: the 2\.x wire client$")
        self.assertRegex(lines[1][0], r"^rank 1 \(2\.x wire client\) got: torch 1\.13")

    def test_a_flood_of_the_jobs_servers_hurts_neither_the_agent_nor_its_other_jobs(self):
        allreduce = os.environ.get("CAF_HVD_ALLREDUCE", "caf-hvd-allreduce")
        self.c.node("shared")
        bystander = self.c.start(["driver", "-np", "1", "-H", self.c.spec("shared", 1), "--",
                                  "sh", "-c", "sleep 6; echo bystander done"])
        with tempfile.TemporaryDirectory() as d:
            rc, out, err = self.c.run(["driver", "-np", "2", "-H", self.c.spec("shared", 2),
                                       "--", *CLIENT, "flood", d, allreduce], timeout=180)
        self.assertEqual(rc, 0, err)
        lines = {r: "\n".join(v) for r, v in rank_lines(out).items()}
        # The budgets held: 7 x 64 MiB fit the store's 512 MiB, 24 x 8 MiB the ad-hoc
        # scopes' 192 MiB (the rest is kept for the planned scopes, where Gloo's
        # rendezvous of both ranks then still happened).
        self.assertIn("flood: 7 store SETs of 64 MiB kept, then the store closed the client; "
                      "24 rendezvous PUTs of 8 MiB, then 413", lines[1])
        for r in (0, 1):
            self.assertIn(f"rank {r}: a fresh store client sees the flood's first key: True",
                          lines[r])
        self.assertIn("caf-hvd-allreduce: all sums correct (2 sizes x global/local/cross)",
                      lines[0])
        self.assertIn("over the job's torch store budget", err)
        # the rendezvous server's refusal is named too, once and not once a PUT
        refusals = re.findall(r"the rendezvous server refused a PUT in scope junk from \S+: "
                              r"413 store full", err)
        self.assertEqual(len(refusals), 1, err[-3000:])
        self.assertIn("the store and the job's other clients go on", err)
        b_out, b_err = bystander.communicate(timeout=60)
        self.assertEqual(bystander.returncode, 0, b_err)
        self.assertEqual(rank_lines(b_out)[0], ["bystander done"])
        self.assertIsNone(self.c.nodes["shared"][0].poll())  # the agent is still there
        rc, out, err = self.c.run(["driver", "-np", "1", "-H", self.c.spec("shared", 1), "--",
                                   "echo", "after"])
        self.assertEqual(rc, 0, err)

    def test_unsupported_protocol_is_named_with_the_fix(self):
        # auto (the default): the store says what happened and what to do; the rank
        # decides the job's fate (here: exit 3).
        rc, out, err = self.c.run(["run", "-np", "1", "--", *CLIENT, "garbage"])
        self.assertEqual(rc, 3, err)
        self.assertEqual(rank_lines(out)[0], ["store closed the connection: True"])
        self.assertIn("query type 99 is not part of the torch 2.2+ store protocol", err)
        self.assertIn("store protocol that caf-hvd's torch store does not support; rerun with "
                      "--torch-store off", err)
        self.assertEqual(err.count("rerun with --torch-store off"), 1, err)

    def test_torch_store_on_fails_the_job_at_once(self):
        # The rank would wait 60 s (as a torch client waits out its timeout); with
        # --torch-store on the job ends now, with the store's reason.
        t0 = time.monotonic()
        rc, out, err = self.c.run(["run", "-np", "2", "--torch-store", "on",
                                   "--kill-grace-seconds", "1", "--",
                                   *CLIENT, "garbage", "60"], timeout=40)
        self.assertNotEqual(rc, 0, err)
        self.assertNotEqual(rc, 3, err)  # stopped by the launcher, not ended by itself
        self.assertLess(time.monotonic() - t0, 30, err)
        self.assertIn("rerun with --torch-store off", err)
        self.assertIn("the torch store could not serve a client (--torch-store on)", err)

    def test_torch_store_off_leaves_master_port_to_rank_0(self):
        prog = ("import os, socket; s = socket.socket(); "
                "s.bind((os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT']))); "
                "print('bound', os.environ.get('TORCHELASTIC_USE_AGENT_STORE', 'unset'))")
        for flag in (["--torch-store", "off"], ["--free-master-port"]):
            rc, out, err = self.c.run(["run", "-np", "1", *flag, "--", "/usr/bin/python3", "-c",
                                       prog])
            self.assertEqual(rc, 0, err)
            self.assertEqual(rank_lines(out)[0], ["bound unset"])
        # served (the default): the port is taken by the store, the agent store is named
        rc, out, err = self.c.run(["run", "-np", "1", "--", "env"])
        self.assertEqual(rc, 0, err)
        env = rank_envs(out)[0]
        self.assertEqual(env["TORCHELASTIC_USE_AGENT_STORE"], "True")
        self.assertEqual(env["TORCHELASTIC_RESTART_COUNT"], "0")

    def test_bad_torch_store_flags(self):
        rc, _, err = self.c.run(["run", "-np", "1", "--torch-store", "sometimes", "--", "true"])
        self.assertEqual(rc, 2)
        self.assertIn("--torch-store 'sometimes': expected auto, on or off", err)
        rc, _, err = self.c.run(["run", "-np", "1", "--torch-store", "on", "--free-master-port",
                                 "--", "true"])
        self.assertEqual(rc, 2)
        self.assertIn("--free-master-port means --torch-store off", err)

    def test_elastic_generations_get_a_fresh_key_space(self):
        d = tempfile.mkdtemp(prefix="caf-hvd-torch-")
        self.addCleanup(shutil.rmtree, d, True)
        hosts = os.path.join(d, "hosts")
        script = os.path.join(d, "discover.sh")
        with open(script, "w") as f:
            f.write(f"#!/bin/sh\ncat {hosts}\n")
        os.chmod(script, stat.S_IRWXU)
        self.c.node("ta")
        self.c.node("tb")

        def set_hosts(*names):
            with open(hosts + ".tmp", "w") as f:
                for n in names:
                    f.write(f"127.0.0.1:{self.c.nodes[n][1]}:1\n")
            os.replace(hosts + ".tmp", hosts)

        set_hosts("ta")
        driver = self.c.start(["driver", "--host-discovery-script", script,
                               "--discovery-interval", "0.1", "--min-np", "1", "--",
                               *CLIENT, "generations"])
        first = read_line(driver.stdout.fileno(), time.monotonic() + 60)
        self.assertIn("slot ta:0 restart_count 0 generation 1 rank 0/1 sees stale key: False",
                      first, "no generation 1 line within 60 s")
        set_hosts("ta", "tb")
        out, err = driver.communicate(timeout=60)
        self.assertEqual(driver.returncode, 0, err)
        lines = sorted(l.split(":", 1)[1] for l in out.splitlines())
        self.assertEqual(lines, [
            # the survivor keeps its start environment; the new rank has generation 2's
            "slot ta:0 restart_count 0 generation 2 rank 0/2 sees stale key: False",
            "slot tb:0 restart_count 1 generation 2 rank 1/2 sees stale key: False",
        ], out + err)


if __name__ == "__main__":
    sys.exit(run_suite(TorchStoreTest, sys.argv[1:]))
