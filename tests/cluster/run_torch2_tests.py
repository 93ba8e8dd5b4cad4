"""Real torch 2.x under caf-hvd: Debian 13's python3-torch (2.6, built without libuv) in a
trixie chroot that scripts/setup-torch-chroot.sh builds once per machine into
/var/cache/caf-hvd/trixie-torch-2.6 (about 1.3 GB; minutes the first time, nothing
after). Ranks run as `scripts/in-torch-chroot.sh TREE -b tests/cluster -- /usr/bin/python3
torch2_program.py MODE`: the rank's own process, its environment, the host's network.

- env:// init_process_group("gloo") and all_reduce: under the default store such a torch
  fails, and caf-hvd names the fix once; with that fix (--torch-store off) it passes.
- Every query torch 2.6's client sends, against the job's store, and Gloo on top of it.
- torch 1.13 (/usr/bin/python3) and 2.6 ranks in one job, sharing the job's store.
- An elastic job whose generation 2 sees none of generation 1's keys.

Skips (saying why) only when the chroot cannot be built for want of a package mirror;
any other build failure fails every test. After the tests, nothing may still run in the
tree or have anything mounted there. Run by `meson test torch2`; prints a closing
'N passed, N failed' line."""

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.environ.get("CAF_HVD_SOURCE_ROOT") or os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from harness import Cluster, rank_lines, read_line, run_suite  # noqa: E402

PROGRAM = os.path.join(HERE, "torch2_program.py")
HOST_TORCH = ["/usr/bin/python3", PROGRAM]  # Debian 12's torch 1.13

_tree = None  # (dir, None) or (None, (skip?, reason)), once per suite


def torch_tree():
    """The chroot's directory, building it the first time; raises SkipTest when no
    package mirror answered, fails with the script's reason otherwise."""
    global _tree
    if _tree is None:
        t0 = time.monotonic()
        try:
            r = subprocess.run([os.path.join(ROOT, "scripts", "setup-torch-chroot.sh")],
                               capture_output=True, text=True, timeout=1800)
            lines = r.stdout.strip().splitlines()
            tree = lines[-1] if lines else ""
            sys.stderr.write(r.stderr)
            sys.stderr.write(f"torch2 suite: setup-torch-chroot.sh took "
                             f"{time.monotonic() - t0:.0f}s (exit {r.returncode})\n")
            if r.returncode == 0 and os.path.isdir(tree):
                _tree = (tree, None)
            else:
                _tree = (None, (r.returncode == 2, r.stderr.strip()[-1500:]))
        except subprocess.TimeoutExpired:
            _tree = (None, (False, "setup-torch-chroot.sh did not finish in 30 min"))
    tree, problem = _tree
    if problem:
        skip, reason = problem
        if skip:
            raise unittest.SkipTest(f"no Debian 13 chroot with torch 2.6: {reason}")
        raise AssertionError(f"the Debian 13 chroot with torch 2.6 could not be built: {reason}")
    return tree


def in_tree(*args):
    """A rank command that runs /usr/bin/python3 of the chroot (torch 2.6)."""
    return [os.path.join(ROOT, "scripts", "in-torch-chroot.sh"), torch_tree(), "-b", HERE,
            "--", "/usr/bin/python3", *args]


def leftovers():
    """Mounts in the tree seen from here and processes whose root is the tree."""
    tree = _tree[0] if _tree else None
    if not tree:
        return None
    found = []
    with open("/proc/self/mountinfo") as f:
        found += [l.split()[4] for l in f if l.split()[4].startswith(tree + "/")]
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/root") == tree:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    found.append(f"{pid}: " + f.read().replace(b"\0", b" ").decode())
        except OSError:
            pass
    return f"left behind in {tree}: {found}" if found else None


class Torch2Test(unittest.TestCase):
    def setUp(self):
        self.c = Cluster()
        self.addCleanup(self.c.close)
        self.prog = in_tree(PROGRAM)

    def assert_all_reduce(self, out, size):
        lines = rank_lines(out)
        self.assertEqual(sorted(lines), list(range(size)), out)
        total = float(sum(range(1, size + 1)))
        for r in range(size):
            self.assertRegex(lines[r][-1], rf"^rank {r}/{size} \(torch 2\.6\.\d[^)]*\): "
                             rf"all_reduce gave \[{total}, {float(size)}\]$")

    def test_env_init_under_the_default_store_names_the_fix(self):
        rc, out, err = self.c.run(["run", "-np", "2", "--", *self.prog, "allreduce"],
                                  timeout=180)
        self.assertNotEqual(rc, 0, out + err)
        self.assertIn("use_libuv was requested but PyTorch was build without libuv support", err)
        self.assertEqual(err.count("rerun with --torch-store off"), 1, err)
        self.assertRegex(err, r"caf-hvd: error: rank [01]'s torch was built without libuv")
        self.assertIn("caf-hvd sets USE_LIBUV=0 for it", err)
        # --torch-store on: the job ends at once for it
        rc, out, err = self.c.run(["run", "-np", "2", "--torch-store", "on",
                                   "--kill-grace-seconds", "1", "--", *self.prog, "allreduce"],
                                  timeout=180)
        self.assertNotEqual(rc, 0, out + err)
        self.assertIn("the torch store could not serve a client (--torch-store on)", err)

    def test_env_init_and_all_reduce_with_torch_store_off(self):
        # the fix the driver names: rank 0's torch 2.6 starts the store, USE_LIBUV=0
        rc, out, err = self.c.run(["run", "-np", "4", "--torch-store", "off", "--",
                                   *self.prog, "allreduce"], timeout=240)
        self.assertEqual(rc, 0, err)
        self.assert_all_reduce(out, 4)
        # the user's own USE_LIBUV wins: torch 2.6 then asks for libuv and fails
        rc, out, err = self.c.run(["run", "-np", "1", "--torch-store", "off", "--env",
                                   "USE_LIBUV=1", "--", *self.prog, "allreduce"], timeout=120)
        self.assertNotEqual(rc, 0, out)
        self.assertIn("use_libuv was requested", err)

    def test_every_query_of_torch_26_against_the_jobs_store(self):
        rc, out, err = self.c.run(["run", "-np", "4", "--torch-store", "on", "--",
                                   *self.prog, "queries"], timeout=240)
        self.assertEqual(rc, 0, err)
        lines = rank_lines(out)
        for r in range(4):
            want = [
                "get: b'1'", "wait: 'ok'", "add: 5", "add: 3", "append: b'xyz'",
                "multi_get: [b'v1', b'v2']",
                "compare_set: b'2'", "compare_set: b'2'", "compare_set: b'fresh'",
                "check: True", "check: False", "delete_key: True", "delete_key: False",
                "check: False", "wait timeout: 'DistStoreError, within its timeout: True'",
                "get after timeout: b'2'", "get: b'\\x00\\xffbinary'",
            ]
            self.assertEqual(lines[r][:len(want)], want, out)
            # every rank adds 1 to "all": each sees a distinct count of 1..4
            self.assertRegex(lines[r][len(want)], r"^add: [1-4]$")
            self.assertEqual(lines[r][-1], "all_reduce: 10.0")
        self.assertEqual(sorted(lines[r][len(want)] for r in range(4)),
                         [f"add: {n}" for n in range(1, 5)])
        # keys when rank 0 counts: 7 per rank (a n log m2 new b done/r), "all", and the
        # "init/" key every torch client with a world size adds to
        self.assertEqual(lines[0][len(want) + 1], "num_keys: 30", out)

    def test_torch_113_and_26_ranks_share_the_jobs_store(self):
        # even ranks: the host's torch 1.13, odd ranks: 2.6 in the chroot
        dispatch = ('if [ $((RANK % 2)) -eq 0 ]; then exec "$0" "$1" mixed; '
                    'else shift; exec "$@" mixed; fi')
        rc, out, err = self.c.run(["run", "-np", "4", "--", "sh", "-c", dispatch,
                                   *HOST_TORCH, *self.prog], timeout=240)
        self.assertEqual(rc, 0, err)
        lines = rank_lines(out)
        self.assertEqual(sorted(lines), [0, 1, 2, 3], out)
        for r in range(4):
            self.assertRegex(lines[r][-1], rf"^rank {r}/4 \(torch {'1.13' if r % 2 == 0 else '2.6'}"
                             r"[^)]*\) sees versions \['1\.13[^']*', '2\.6[^']*', '1\.13[^']*', "
                             r"'2\.6[^']*'\]$")

    def test_elastic_generation_2_sees_a_fresh_key_space(self):
        d = tempfile.mkdtemp(prefix="caf-hvd-torch2-")
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
                               "--discovery-interval", "0.1", "--min-np", "1",
                               "--start-timeout", "120", "--", *self.prog, "generations"])
        # the lone rank has finished generation 1
        first = read_line(driver.stdout.fileno(), time.monotonic() + 240)
        self.assertIn("slot ta:0 generation 1 rank 0/1 sees keys of earlier generations: []; "
                      "all_reduce 1.0", first, "no generation 1 line within 240 s")
        set_hosts("ta", "tb")
        out, err = driver.communicate(timeout=240)
        self.assertEqual(driver.returncode, 0, err)
        lines = sorted(l.split(":", 1)[1] for l in out.splitlines())
        self.assertEqual(lines, [
            "slot ta:0 generation 2 rank 0/2 sees keys of earlier generations: []; "
            "all_reduce 2.0",
            "slot tb:0 generation 2 rank 1/2 sees keys of earlier generations: []; "
            "all_reduce 2.0",
        ], out + err)


if __name__ == "__main__":
    sys.exit(run_suite(Torch2Test, sys.argv[1:], extra_check=leftovers))
