"""horovod.ray's ElasticRayExecutor on caf-hvd, as Horovod's own tests and examples call it.

- Horovod's test/single/test_ray_elastic.py, read from the vendored source tarball at
  run time and changed only in its imports and fixtures (port_of_horovods_test() lists
  every change; each must apply, or the test fails naming it): ElasticRayExecutor,
  RayHostDiscovery and ray_logger from caf_hvd, the discovery frequency patched in
  caf_hvd.ray_elastic instead of Horovod's driver, and `ray.init(num_cpus=8, ...)`
  replaced by a cluster of node agents named host-1 .. host-6 on this machine
  (ray_elastic_fixture.py). Its elastic cases run under pytest with real Horovod and
  torch in the workers: test_fault_tolerance_hosts_added_and_removed, test_max_num_proc,
  test_min_num_proc, and test_fault_tolerance_hosts_remove_and_add, which Horovod skips
  as failing (its issue 3197): the skip mark is removed and it must pass here.
- The argument checks and deprecated names, against the messages in Horovod's source.
- Discovery objects that raise, hang, or name a host no agent has.
- examples/ray_elastic.py: horovod.ray's basic_ray_elastic.py __main__ block
  (create_settings, TestDiscovery, override_discovery=False, start, run with callbacks)
  on a small model.

Every process a test starts carries TAG in its environment; a test fails if one
outlives it. Run by `meson test horovod-ray-elastic`."""

import lzma
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import unittest
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.environ.get("CAF_HVD_SOURCE_ROOT") or os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))
from harness import horovod_site, none_left_with, run_suite  # noqa: E402
from ray_elastic_fixture import cluster_of  # noqa: E402

from caf_hvd import ElasticRayExecutor, ExecutorError  # noqa: E402

TARBALL = os.path.join(os.path.dirname(ROOT), "shared", "vendor", "horovod-0.28.1-src.tar.xz")
PYTHON = "/usr/bin/python3"
TAG = "CAF_HVD_RAY_ELASTIC_TEST_TAG"
os.environ[TAG] = f"{os.getpid()}-{time.monotonic_ns()}"


def vendored(path):
    """A file of the vendored Horovod source tarball, as text."""
    with lzma.open(TARBALL) as xz, tarfile.open(fileobj=xz) as tar:
        member = tar.getmember(f"horovod-0.28.1/{path}")
        return tar.extractfile(member).read().decode()


# Each change to Horovod's test: (what it is, Horovod's exact text, ours). A change that
# does not apply fails the test, so the port never drifts silently from Horovod's file.
CHANGES = [
    ("ray is not used: the fixture below stands in for ray.init",
     "import ray\n", ""),
    ("the executor and discovery class come from caf_hvd",
     "from horovod.ray.elastic import ElasticRayExecutor, RayHostDiscovery\n",
     "from caf_hvd import ElasticRayExecutor, RayHostDiscovery\n"
     "from ray_elastic_fixture import cluster_of\n"),
    ("ray_logger comes from caf_hvd",
     "from horovod.ray import ray_logger\n", "from caf_hvd import ray_logger\n"),
    ("the discovery frequency is caf_hvd.ray_elastic's",
     "'horovod.runner.elastic.driver.DISCOVER_HOSTS_FREQUENCY_SECS'",
     "'caf_hvd.ray_elastic.DISCOVER_HOSTS_FREQUENCY_SECS'"),
    ("Ray's 8 CPUs and host-N resources become node agents named host-1 .. host-6",
     re.compile(r"def ray_8_cpus\(\):\n    ray\.init\(num_cpus=8, resources=\{\n"
                r"        f\"node:host-\{i\}\": 1 for i in range\(10\)\}\)\n    yield\n"
                r"    # The code after the yield will run as teardown code\.\n"
                r"    ray\.shutdown\(\)\n"),
     "def ray_8_cpus():\n"
     "    with cluster_of(f\"host-{i}\" for i in range(1, 7)):\n"
     "        yield\n"),
    ("Horovod's skip of test_fault_tolerance_hosts_remove_and_add (its issue 3197) goes",
     "@pytest.mark.skip(reason='https://github.com/horovod/horovod/issues/3197')\n", ""),
]


def port_of_horovods_test():
    text = vendored("test/single/test_ray_elastic.py")
    for what, old, new in CHANGES:
        if isinstance(old, re.Pattern):
            text, n = old.subn(new.replace("\\", "\\\\"), text)
        else:
            n = text.count(old)
            text = text.replace(old, new)
        if n != 1:
            raise AssertionError(f"the port's change '{what}' applies {n} times to Horovod's "
                                 "test_ray_elastic.py, not once: the vendored file changed")
    return text


class Case(unittest.TestCase):
    def setUp(self):
        self.addCleanup(none_left_with, TAG, os.environ[TAG], 30)
        self.dir = tempfile.mkdtemp(prefix="caf-hvd-ray-elastic-test-")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def env(self):
        """Real Horovod and caf_hvd for the test's python and its workers."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([horovod_site(), os.path.join(ROOT, "python"),
                                             HERE])
        return env


class HorovodsTestTest(Case):
    """Horovod's test_ray_elastic.py elastic cases, imports and fixtures changed."""

    def pytest(self, name, timeout=420):
        path = os.path.join(self.dir, "test_ray_elastic.py")
        with open(path, "w") as f:
            f.write(port_of_horovods_test())
        # SHOW=1: the test's and the job's output also when it passes
        cmd = [PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--tb=short", "-rfEs",
               f"{path}::{name}"] + (["-s"] if os.environ.get("SHOW") else [])
        p = subprocess.Popen(cmd, cwd=self.dir, env=self.env(), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
            self.fail(f"{name} did not end within {timeout} s:\n{out[-6000:]}")
        self.assertEqual(p.returncode, 0, out[-8000:])
        self.assertRegex(out, r"\b1 passed\b", out[-4000:])
        self.assertNotRegex(out, r"\bskipped\b", out[-4000:])
        return out

    def test_fault_tolerance_hosts_added_and_removed(self):
        self.pytest("test_fault_tolerance_hosts_added_and_removed")

    def test_max_num_proc(self):
        self.pytest("test_max_num_proc")

    def test_min_num_proc(self):
        self.pytest("test_min_num_proc")

    def test_fault_tolerance_hosts_remove_and_add_which_horovod_skips(self):
        self.pytest("test_fault_tolerance_hosts_remove_and_add")

    def test_every_change_of_the_port_applies(self):
        """A change that no longer applies (Horovod's text differs) fails the port."""
        text = port_of_horovods_test()
        self.assertNotIn("import ray\n", text)
        self.assertNotIn("issues/3197", text)
        self.assertIn("from caf_hvd import ElasticRayExecutor", text)
        saved = list(CHANGES)
        try:
            CHANGES.append(("a text Horovod's file does not have", "import rayx\n", ""))
            with self.assertRaisesRegex(AssertionError, "applies 0 times"):
                port_of_horovods_test()
        finally:
            CHANGES[:] = saved


class ArgumentTest(Case):
    """horovod.ray's checks and messages (read from its elastic.py in the tarball)."""

    def test_checks_say_what_horovod_says(self):
        source = vendored("horovod/ray/elastic.py")
        settings = ElasticRayExecutor.create_settings(min_num_proc=1, cluster="127.0.0.1:1")
        with self.assertRaises(ValueError) as e:
            ElasticRayExecutor(settings, use_gpu=False, gpus_per_slot=1)
        self.assertIn('"gpus_per_slot is set, but use_gpu is False. "', source)
        self.assertEqual(str(e.exception), "gpus_per_slot is set, but use_gpu is False. "
                                           "use_gpu must be True if gpus_per_slot is set. ")
        with self.assertRaises(ValueError) as e:
            ElasticRayExecutor(settings, use_gpu=True, gpus_per_slot=-1)
        self.assertIn('f"gpus_per_slot must be >= 1: Got {gpus_per_slot}."', source)
        self.assertEqual(str(e.exception), "gpus_per_slot must be >= 1: Got -1.")

    def test_deprecated_min_np_and_max_np_warn_as_horovod_does(self):
        source = vendored("horovod/ray/elastic.py")
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            s = ElasticRayExecutor.create_settings(min_np=2, max_np=3)
        texts = [str(w.message) for w in seen if w.category is DeprecationWarning]
        for text in ("min_np is deprecated, use min_num_proc instead",
                     "max_np is deprecated, use max_num_proc instead"):
            self.assertIn(f"'{text}'", source)
            self.assertIn(text, texts)
        self.assertEqual((s.min_num_proc, s.max_num_proc, s.num_proc), (2, 3, 2))

    def test_settings_fields_and_defaults(self):
        s = ElasticRayExecutor.create_settings(verbose=2, cooldown_range=(1, 10))
        self.assertEqual((s.min_num_proc, s.max_num_proc, s.reset_limit, s.elastic_timeout,
                          s.start_timeout, s.verbose, s.cooldown_range, s.elastic),
                         (1, None, None, 600, 30, 2, (1, 10), True))
        self.assertIsNone(s.discovery)
        with self.assertRaisesRegex(TypeError, r"unexpected keyword argument\(s\) \['bogus'\]"):
            ElasticRayExecutor.create_settings(bogus=1)
        with self.assertRaisesRegex(ValueError, "max_num_proc 1 is below min_num_proc 2"):
            ElasticRayExecutor.create_settings(min_num_proc=2, max_num_proc=1)

    def test_override_discovery_false_needs_a_discovery_object(self):
        s = ElasticRayExecutor.create_settings()
        with self.assertRaisesRegex(ValueError, r"override_discovery=False needs "
                                                r"settings\.discovery"):
            ElasticRayExecutor(s, override_discovery=False)

    def test_run_before_start(self):
        s = ElasticRayExecutor.create_settings(cluster="127.0.0.1:1")
        with self.assertRaisesRegex(ExecutorError, r"call start\(\) before run\(\)"):
            ElasticRayExecutor(s).run(lambda: 1)

    def test_ray_logger_outside_a_worker_warns_once(self):
        from caf_hvd import ray_logger
        ray_logger.warning_raised = False
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            ray_logger.log({"a": 1})
            ray_logger.log({"a": 2})
        self.assertEqual([str(w.message) for w in seen],
                         ["`ray_logger.log` called but logging is not configured."])


DISCOVERY_PROGRAM = r'''
import os, sys, time
import caf_hvd.ray_elastic
from caf_hvd import ElasticRayExecutor, ray_logger

MODE = sys.argv[1]
caf_hvd.ray_elastic.DISCOVERY_CALL_TIMEOUT_SECS = 3  # a hung call counts after 3 s


class Discovery:
    def __init__(self):
        self.calls = 0

    def find_available_hosts_and_slots(self):
        self.calls += 1
        if MODE == "raises-first":
            raise ConnectionError("inventory service down")
        if MODE == "raises-later" and 3 <= self.calls <= 6:
            raise ConnectionError("inventory service down for a moment")
        if MODE == "hangs-later" and self.calls == 3:
            time.sleep(3600)
        hosts = {"host-1": 1}
        if MODE == "grows" and self.calls > 5:
            hosts["host-2"] = 1
        if MODE == "unknown-name":
            hosts["host-9"] = 1
        return hosts


def fn():
    import time
    ray_logger.log({"started": os.environ["HOROVOD_HOSTNAME"]})
    time.sleep(float(os.environ.get("FN_SECONDS", "4")))
    return os.environ["HOROVOD_HOSTNAME"] + "/" + os.environ.get("FROM_ENV_VARS", "-")


if MODE == "cluster":  # the cluster's nodes, 2 slots each: one slot of 2 CPUs per node
    settings = ElasticRayExecutor.create_settings(min_num_proc=2, max_num_proc=4,
                                                  elastic_timeout=20, discovery_interval=0.2)
    ex = ElasticRayExecutor(settings, cpus_per_slot=2)
    print("DISCOVERY", type(settings.discovery).__name__,
          sorted(settings.discovery.find_available_hosts_and_slots().items()), flush=True)
else:
    settings = ElasticRayExecutor.create_settings(min_num_proc=2 if MODE == "grows" else 1,
                                                  max_num_proc=2, elastic_timeout=20,
                                                  discovery_interval=0.2)
    settings.discovery = Discovery()
    ex = ElasticRayExecutor(settings, override_discovery=False,
                            env_vars={"FROM_ENV_VARS": "yes"})
try:
    ex.start()
    logged = []
    print("RESULT", ex.run(fn, callbacks=[logged.append]), logged, flush=True)
except Exception as e:
    print("ERROR", type(e).__name__, e, flush=True)
'''


class DiscoveryObjectTest(Case):
    """Discovery objects that fail: each gets a clear message, and the job goes on or
    ends as it would with a discovery script."""

    def run_program(self, mode, timeout=180, **env):
        path = os.path.join(self.dir, "program.py")
        with open(path, "w") as f:
            f.write(DISCOVERY_PROGRAM)
        e = self.env()
        e.update(env)
        with cluster_of(["host-1", "host-2"], slots=2):
            e["CAF_HVD_CLUSTER"] = os.environ["CAF_HVD_CLUSTER"]
            r = subprocess.run([PYTHON, path, mode], env=e, capture_output=True, text=True,
                               timeout=timeout)
        return r.stdout, r.stderr

    def test_override_discovery_counts_the_cluster_nodes_slots_per_cpus_per_slot(self):
        out, err = self.run_program("cluster", FN_SECONDS="1")
        self.assertIn("DISCOVERY RayHostDiscovery [('host-1', 1), ('host-2', 1)]", out, err)
        self.assertRegex(out, r"RESULT \['host-(1|2)/-', 'host-(1|2)/-'\]", err)
        self.assertIn("'host-1/-'", out.split("RESULT")[1].split("]")[0], out)
        self.assertIn("'host-2/-'", out.split("RESULT")[1].split("]")[0], out)

    def test_start_waits_for_min_num_proc_saying_what_it_waits_for(self):
        out, err = self.run_program("grows", FN_SECONDS="1")
        self.assertRegex(err, r"caf_hvd: waiting for 2 slots \(min_num_proc\) on at least 1 "
                              r"host\(s\), \d+ s left of elastic_timeout: "
                              r"Discovery\.find_available_hosts_and_slots\(\) lists host-1:1")
        self.assertIn("RESULT ['host-1/yes', 'host-2/yes']", out, err)  # env_vars reach them

    def test_a_first_call_that_raises_fails_start_naming_the_error(self):
        out, err = self.run_program("raises-first")
        self.assertIn("ERROR RuntimeError Discovery.find_available_hosts_and_slots() failed on "
                      "its first call: ConnectionError: inventory service down", out, err)

    def test_later_calls_that_raise_keep_the_hosts_and_the_job_ends_well(self):
        out, err = self.run_program("raises-later")
        self.assertIn("RESULT ['host-1/yes'] [{'started': 'host-1', 'rank': 0}]", out, err)
        self.assertIn("Discovery.find_available_hosts_and_slots() raised ConnectionError: "
                      "inventory service down for a moment", err)
        # the driver kept the last host set, as for a failing script
        self.assertRegex(err, r"failed \(keeping the last host set")

    def test_a_call_that_hangs_is_reported_and_the_job_goes_on(self):
        out, err = self.run_program("hangs-later", FN_SECONDS="10")
        self.assertIn("RESULT ['host-1/yes']", out, err)
        self.assertRegex(err, r"Discovery\.find_available_hosts_and_slots\(\) has not returned "
                              r"for \d+ s \(it is still running here\)")

    def test_a_name_no_agent_has_is_left_out_with_a_warning(self):
        out, err = self.run_program("unknown-name")
        self.assertIn("RESULT ['host-1/yes']", out, err)
        self.assertRegex(err, r"lists host 'host-9', which is no node of the cluster at "
                              r"127\.0\.0\.1:\d+ \(its nodes: host-1, host-2\) and not an "
                              r"agent's HOST:PORT; it is left out")
        self.assertEqual(err.count("'host-9'"), 1, err)  # said once, not at every call


class ExampleTest(Case):
    def test_forceful_removal_kills_the_hosts_ranks_and_the_job_goes_on(self):
        """TestDiscovery(_graceful=False): a removed host's ranks are killed at once (a
        node that dies); the job blacklists it and goes on from its last commit. Changes
        come every 6 s, after a returning host's join has ended: a rank killed while the
        others are inside a generation's rendezvous makes the job stop them (their Gloo
        context cannot finish), and with 3 hosts that can leave no holder of the state."""
        with cluster_of(["host-1", "host-2", "host-3"], slots=1) as where:
            r = subprocess.run([PYTHON, os.path.join(ROOT, "examples", "ray_elastic.py"),
                                "--epochs", "14", "--epoch-seconds", "1", "--forceful",
                                "--change-frequency-s", "6", "--max-hosts", "3"],
                               env=dict(self.env(), CAF_HVD_CLUSTER=where), capture_output=True,
                               text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-5000:])
        self.assertRegex(r.stderr, r"removed host host-\d forcefully: 1 of its ranks killed")
        self.assertRegex(r.stdout, r"finished 14 epochs on \d worker")
        epochs = [int(m) for m in re.findall(r"^epoch (\d+) ", r.stdout, re.M)]
        # never back, never twice; a killed rank 0 may take its last line with it
        self.assertEqual(epochs, sorted(set(epochs)), r.stdout)
        self.assertEqual(epochs[-1], 13, r.stdout)

    def test_basic_ray_elastic_main_block_shape(self):
        """examples/ray_elastic.py: create_settings, settings.discovery = TestDiscovery(...),
        override_discovery=False, start, run with callbacks; hosts come and go."""
        with cluster_of(["host-1", "host-2", "host-3"], slots=1) as where:
            r = subprocess.run([PYTHON, os.path.join(ROOT, "examples", "ray_elastic.py"),
                                "--epochs", "12", "--epoch-seconds", "1",
                                "--change-frequency-s", "3", "--max-hosts", "3"],
                               env=dict(self.env(), CAF_HVD_CLUSTER=where), capture_output=True,
                               text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-5000:])
        self.assertRegex(r.stdout, r"finished 12 epochs on \d worker")
        epochs = [int(m) for m in re.findall(r"^epoch (\d+) ", r.stdout, re.M)]
        self.assertEqual(epochs, list(range(12)), r.stdout)  # none lost, none done twice
        sizes = {int(m) for m in re.findall(r"^epoch \d+ world_size (\d+) ", r.stdout, re.M)}
        self.assertGreater(len(sizes), 1, f"the hosts never changed: {r.stdout}")


if __name__ == "__main__":
    code = 0
    for case in (ArgumentTest, DiscoveryObjectTest, HorovodsTestTest, ExampleTest):
        code |= run_suite(case, sys.argv[1:])
    sys.exit(code)
