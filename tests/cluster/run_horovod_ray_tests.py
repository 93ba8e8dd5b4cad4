"""horovod.ray and Ray Train programs on caf-hvd with only their imports changed.

- Signatures: every argument of horovod.ray 0.28.1's RayExecutor (its constructor,
  create_settings and methods, read with `ast` from runner.py in the vendored source
  tarball) is accepted by caf_hvd.RayExecutor, in the same position with the same
  default; and horovod.ray's validation errors.
- Horovod's docs/ray.rst snippets with real Horovod inside (scripts/setup-horovod.sh
  builds it; a failed build fails these tests): stateless run, stateful execute with an
  executable class, and elastic with min_workers and hvd.elastic.run over node agents.
  Where the snippets leave things out (`...`, NeuralNet, _train) they are filled in, and
  GPUs are off.
- caf_hvd.train.HorovodTrainer.fit() with real Horovod: metrics per epoch in order, a
  checkpoint per epoch under the storage path, a worker killed mid-run (the group
  restarts from the newest persisted checkpoint and resumes at the next epoch),
  max_failures used up, a loop that raises; and examples/horovod_trainer_quickstart.py
  here and over node agents.

Every process a test starts carries TAG in its environment; a test fails if one
outlives it. Run by `meson test horovod-ray`."""

import ast
import glob
import inspect
import json
import lzma
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.environ.get("CAF_HVD_SOURCE_ROOT") or os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))
from harness import (Cluster, horovod_site, none_left_with, pids_with_env_entry,  # noqa: E402
                     run_suite, wait_until)

import caf_hvd  # noqa: E402
from caf_hvd import RayExecutor, WorkerError  # noqa: E402
from caf_hvd import train  # noqa: E402
from caf_hvd.train import (Checkpoint, CheckpointConfig, FailureConfig, RunConfig,  # noqa: E402
                           ScalingConfig, TrainingFailedError)
from caf_hvd.train.horovod import HorovodTrainer  # noqa: E402

TARBALL = os.path.join(os.path.dirname(ROOT), "shared", "vendor",
                       "horovod-0.28.1-src.tar.xz")
if not os.path.exists(TARBALL):
    TARBALL = os.path.join(ROOT, "..", "shared", "vendor", "horovod-0.28.1-src.tar.xz")
PYTHON = "/usr/bin/python3"
TAG = "CAF_HVD_RAY_TEST_TAG"
os.environ[TAG] = f"{os.getpid()}-{time.monotonic_ns()}"  # inherited by all we start


def tagged_pids():
    return pids_with_env_entry(TAG, os.environ[TAG])


class Case(unittest.TestCase):
    """Real Horovod on the ranks' PYTHONPATH; nothing the test started may outlive it."""

    def setUp(self):
        self.addCleanup(self.nothing_left)
        self.saved_path = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = horovod_site()
        self.dir = tempfile.mkdtemp(prefix="caf-hvd-ray-test-")

    def nothing_left(self):
        if self.saved_path is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = self.saved_path
        none_left_with(TAG, os.environ[TAG], 20)
        subprocess.run(["rm", "-rf", self.dir])

    def agents(self, *names):
        c = Cluster()
        self.addCleanup(c.close)
        for n in names:
            c.node(n)
        return c


# -- signatures --------------------------------------------------------------------------


def horovod_ray_executor():
    """{method: [(name, default source or None), ...]} of horovod.ray.RayExecutor, read
    from runner.py in the vendored tarball."""
    with tarfile.open(fileobj=lzma.open(TARBALL)) as tar:
        member = tar.getmember("horovod-0.28.1/horovod/ray/runner.py")
        source = tar.extractfile(member).read().decode()
    cls = next(n for n in ast.parse(source).body
               if isinstance(n, ast.ClassDef) and n.name == "RayExecutor")
    methods = {}
    for fn in cls.body:
        if not isinstance(fn, ast.FunctionDef) or (fn.name.startswith("_")
                                                   and fn.name != "__init__"):
            continue
        args = fn.args.args[1:]  # self or cls
        defaults = [None] * (len(args) - len(fn.args.defaults)) + list(fn.args.defaults)
        empty = inspect.Parameter.empty
        methods[fn.name] = [(a.arg, ast.literal_eval(d) if d is not None else empty)
                            for a, d in zip(args, defaults)]
    return methods


class SignatureTest(unittest.TestCase):
    def test_every_horovod_ray_argument_is_accepted_in_place_with_its_default(self):
        theirs = horovod_ray_executor()
        self.assertEqual(sorted(theirs), ["__init__", "create_settings", "execute",
                                          "execute_single", "run", "run_remote", "shutdown",
                                          "start"])
        for name, params in theirs.items():
            ours = list(inspect.signature(getattr(RayExecutor, name)).parameters.values())
            if ours and ours[0].name == "self":
                ours = ours[1:]
            positional = [p for p in ours if p.kind == p.POSITIONAL_OR_KEYWORD]
            self.assertEqual([(p.name, p.default) for p in positional], params,
                             f"RayExecutor.{name}: (name, default) of each positional "
                             "argument must be horovod.ray's")
            for p in ours[len(positional):]:
                self.assertIn(p.kind, (p.KEYWORD_ONLY, p.VAR_KEYWORD),
                              f"RayExecutor.{name}: {p.name} is an addition, keyword-only")

    def test_the_constructor_takes_each_argument_by_name(self):
        theirs = dict(horovod_ray_executor()["__init__"])
        settings = RayExecutor.create_settings(**{
            k: v for k, v in horovod_ray_executor()["create_settings"]})
        static = {k: v for k, v in theirs.items() if k != "settings"}
        static["num_workers"] = 2
        RayExecutor(settings, **static)
        elastic = dict(static, num_workers=None, min_workers=1, max_workers=2,
                       reset_limit=3, cooldown_range=[1, 10], elastic_timeout=60,
                       override_discovery=False)
        self.assertTrue(RayExecutor(settings, **elastic).elastic)

    def test_horovod_ray_validation_errors(self):
        s = RayExecutor.create_settings()
        cases = [
            (dict(max_workers=4), "max_workers=4 without a positive min_workers"),
            (dict(num_workers=2, min_workers=1), "both given"),
            (dict(num_workers=2, gpus_per_worker=1), "needs use_gpu=True"),
            (dict(num_workers=2, use_gpu=True, gpus_per_worker=0), "must be >= 1"),
            (dict(num_workers=2, num_hosts=2), "num_workers=2 and num_hosts=2"),
            (dict(), "give num_workers"),
            (dict(min_workers=1, cooldown_range=(5, 1)), "need 0 < low <= high"),
            (dict(num_workers=2, cpus_per_worker=0), "cpus_per_worker must be a positive"),
        ]
        for kwargs, text in cases:
            with self.subTest(kwargs=kwargs):
                with self.assertRaises(ValueError) as cm:
                    RayExecutor(s, **kwargs)
                self.assertIn(text, str(cm.exception))
        with self.assertRaises(TypeError) as cm:
            RayExecutor(s, num_workers=2, num_slots=3)
        self.assertIn("num_slots", str(cm.exception))

    def test_settings(self):
        with self.assertRaises(ValueError) as cm:
            RayExecutor.create_settings(ssh_str="KEY")
        self.assertIn("ssh_str needs ssh_identity_file", str(cm.exception))
        with tempfile.TemporaryDirectory() as d:
            key = os.path.join(d, "id")
            s = RayExecutor.create_settings(ssh_identity_file=key, ssh_str="SECRET")
            self.assertEqual(open(key).read(), "SECRET")
            self.assertEqual(os.stat(key).st_mode & 0o777, 0o600)
            ex = RayExecutor(s, num_workers=2, hosts="a:1,b:1")
            flags = ex._flags()
            self.assertEqual(flags[flags.index("--launcher") + 1], "ssh")
            self.assertEqual(flags[flags.index("--ssh-identity-file") + 1], key)
        with self.assertRaises(ValueError):
            RayExecutor.create_settings(timeout_s=0)
        with self.assertRaises(ValueError):
            RayExecutor.create_settings(nics=set())

    def test_elastic_needs_agents_and_has_no_run_remote_or_execute_single(self):
        env = {k: os.environ.pop(k) for k in ("CAF_HVD_HOSTS", "CAF_HVD_HOSTFILE")
               if k in os.environ}
        self.addCleanup(os.environ.update, env)
        ex = RayExecutor(RayExecutor.create_settings(), min_workers=1)
        with self.assertRaises(ValueError) as cm:
            ex.start()
        self.assertIn("discovery_script=PATH", str(cm.exception))
        ex = RayExecutor(RayExecutor.create_settings(hosts="127.0.0.1:1:2"), min_workers=1)
        ex.start()
        with self.assertRaises(NotImplementedError):
            ex.run_remote(print)
        with self.assertRaises(NotImplementedError):
            ex.execute_single(print)
        ex.shutdown()


# -- docs/ray.rst -----------------------------------------------------------------------


def simple_fn():
    import horovod.torch as hvd
    hvd.init()
    print("hvd rank", hvd.rank())
    return hvd.rank()


class NeuralNet:
    def __new__(cls):
        import torch
        torch.manual_seed(3)
        return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(),
                                   torch.nn.Linear(8, 1))


class MyModel:
    def __init__(self, learning_rate):
        import torch
        import horovod.torch as hvd
        hvd.init()
        self.model = NeuralNet()
        optimizer = torch.optim.SGD(
            self.model.parameters(),
            lr=learning_rate,
        )
        self.optimizer = hvd.DistributedOptimizer(
            optimizer, named_parameters=self.model.named_parameters())

    def get_weights(self):
        return dict(self.model.named_parameters())

    def train(self):
        return self._train(self.model, self.optimizer)

    def _train(self, model, optimizer):
        import torch
        import horovod.torch as hvd
        x = torch.full((8, 4), float(hvd.rank() + 1))  # a different shard per rank
        optimizer.zero_grad()
        loss = (model(x) ** 2).mean()
        loss.backward()
        optimizer.step()
        return loss.item()


def elastic_training_fn():
    import torch
    import horovod.torch as hvd
    epochs = 6
    hvd.init()
    model = NeuralNet()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())
    resets = []

    def on_state_reset():
        resets.append(hvd.size())

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            x = torch.full((4, 4), float(hvd.rank() + 1))
            optimizer.zero_grad()
            (model(x) ** 2).mean().backward()
            optimizer.step()
            state.commit()

    state = hvd.elastic.TorchState(model, optimizer, batch=0, epoch=0)
    state.register_reset_callbacks([on_state_reset])
    train(state)
    mine = float(sum(p.detach().double().sum() for p in model.parameters()))
    same = hvd.broadcast_object(mine, root_rank=0, name="final") == mine
    return hvd.rank(), hvd.size(), state.epoch, same


class RayDocsTest(Case):
    def test_stateless_run(self):
        num_workers = hosts = 3
        num_slots = 1
        settings = RayExecutor.create_settings(timeout_s=30)
        executor = RayExecutor(settings, num_workers=num_workers, use_gpu=False)
        self.addCleanup(executor.shutdown)
        executor.start()
        result = executor.run(simple_fn)
        assert len(set(result)) == hosts * num_slots
        self.assertEqual(result, [0, 1, 2])
        # the settings reached the ranks
        self.assertEqual(executor.run(lambda: os.environ["HOROVOD_GLOO_TIMEOUT_SECONDS"]),
                         ["30"] * 3)
        executor.shutdown()
        with self.assertRaises(caf_hvd.ExecutorError):
            executor.run(simple_fn)

    def test_stateful_execute_with_an_executable_class(self):
        executor = RayExecutor(RayExecutor.create_settings(nics={"lo"}), num_workers=2)
        self.addCleanup(executor.shutdown)
        executor.start(executable_cls=MyModel, executable_args=(0.05,))
        losses = []
        for i in range(5):
            losses.append(executor.execute(lambda worker: worker.train()))
        result = executor.execute(lambda worker: worker.get_weights())
        assert all(isinstance(res, dict) for res in result)
        for name, tensor in result[0].items():  # hvd.DistributedOptimizer kept them equal
            self.assertTrue(bool((tensor == result[1][name]).all()), name)
        self.assertLess(sum(losses[-1]), sum(losses[0]))
        self.assertEqual(executor.execute_single(lambda w: os.environ["HOROVOD_RANK"]), "0")
        self.assertEqual(executor.run(lambda: os.environ["HOROVOD_GLOO_IFACE"]), ["lo", "lo"])
        futures = executor.run_remote(lambda: int(os.environ["HOROVOD_RANK"]) * 10)
        self.assertEqual([f.result(timeout=60) for f in futures], [0, 10])
        executor.shutdown()

    def test_elastic_with_min_workers_and_hvd_elastic_run(self):
        c = self.agents("ra", "rb")
        settings = RayExecutor.create_settings(
            verbose=True, hosts=f"{c.spec('ra', 1)},{c.spec('rb', 1)}")
        executor = RayExecutor(
            settings, min_workers=1, use_gpu=False, cpus_per_slot=2)
        self.addCleanup(executor.shutdown)
        executor.start()
        values = executor.run(elastic_training_fn)
        self.assertEqual(values, [(0, 2, 5, True), (1, 2, 5, True)])
        executor.shutdown()


# -- HorovodTrainer -----------------------------------------------------------------------


def epoch_loop(config):
    """Trains config["epochs"] epochs with an allreduce each, from the checkpoint it is
    given; rank 1 may stop to be killed (config["kill_at"]) or exit (config["exit_at"])."""
    import torch
    import horovod.torch as hvd
    hvd.init()
    ctx = train.get_context()
    rank = ctx.get_world_rank()
    start, resumed = 0, None
    checkpoint = train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            with open(os.path.join(d, "state.json")) as f:
                start = json.load(f)["epoch"] + 1
        resumed = os.path.basename(checkpoint.path)
    total = 0.0
    for epoch in range(start, config["epochs"]):
        total = hvd.allreduce(torch.tensor([float(epoch + 1)]), op=hvd.Sum).item()
        if rank == 1 and epoch == config.get("kill_at") and checkpoint is None:
            with open(config["pid_file"] + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.replace(config["pid_file"] + ".tmp", config["pid_file"])
            time.sleep(120)  # killed here by the test
        if rank == 1 and epoch == config.get("exit_at"):
            os._exit(3)
        if rank == 0 and epoch == config.get("raise_at"):
            def load_batch(i):
                raise ValueError(f"bad batch {i}")
            load_batch(7)
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, f"rank{rank}.txt"), "w") as f:
                f.write(str(epoch))
            if rank == 0:
                with open(os.path.join(d, "state.json"), "w") as f:
                    json.dump({"epoch": epoch}, f)
            train.report({"epoch": epoch, "sum": total, "rank": rank, "start": start,
                          "resumed": resumed,
                          "place": (ctx.get_world_size(), ctx.get_local_rank(),
                                    ctx.get_local_world_size(), ctx.get_node_rank())},
                         checkpoint=Checkpoint.from_directory(d))
    return total


class TrainerTest(Case):
    def trainer(self, loop=epoch_loop, workers=2, max_failures=0, num_to_keep=None, **config):
        return HorovodTrainer(
            loop, train_loop_config=config,
            scaling_config=ScalingConfig(num_workers=workers),
            run_config=RunConfig(name="exp", storage_path=self.dir,
                                 failure_config=FailureConfig(max_failures=max_failures),
                                 checkpoint_config=CheckpointConfig(num_to_keep=num_to_keep)))

    def test_metrics_per_epoch_in_order_and_a_checkpoint_per_epoch(self):
        result = self.trainer(epochs=4).fit()
        self.assertIsNone(result.error)
        h = result.metrics_history
        self.assertEqual([m["epoch"] for m in h], [0, 1, 2, 3])
        self.assertEqual([m["training_iteration"] for m in h], [1, 2, 3, 4])
        self.assertEqual([m["sum"] for m in h], [2.0, 4.0, 6.0, 8.0])  # 2 ranks x epoch+1
        self.assertTrue(all(m["rank"] == 0 for m in h), "rank 0's metrics are the run's")
        self.assertEqual(h[0]["place"], (2, 0, 2, 0))
        self.assertEqual(result.metrics, h[-1])
        trial = result.path
        self.assertEqual(os.path.dirname(os.path.dirname(trial)), self.dir)
        self.assertEqual(os.path.basename(os.path.dirname(trial)), "exp")
        names = sorted(n for n in os.listdir(trial) if n.startswith("checkpoint_"))
        self.assertEqual(names, [f"checkpoint_00000{i}" for i in range(4)])
        for i, n in enumerate(names):  # every rank's files, merged
            self.assertEqual(sorted(os.listdir(os.path.join(trial, n))),
                             ["rank0.txt", "rank1.txt", "state.json"])
            with open(os.path.join(trial, n, "state.json")) as f:
                self.assertEqual(json.load(f)["epoch"], i)
        self.assertEqual(result.checkpoint, Checkpoint(os.path.join(trial, "checkpoint_000003")))
        with open(os.path.join(trial, "result.json")) as f:
            self.assertEqual([json.loads(line)["epoch"] for line in f], [0, 1, 2, 3])

    def test_num_to_keep(self):
        result = self.trainer(epochs=4, num_to_keep=2).fit()
        self.assertEqual(sorted(n for n in os.listdir(result.path)
                                if n.startswith("checkpoint_")),
                         ["checkpoint_000002", "checkpoint_000003"])
        self.assertEqual(len(result.metrics_history), 4)

    def test_a_killed_worker_restarts_the_group_from_the_last_checkpoint(self):
        pid_file = os.path.join(self.dir, "pid")
        trainer = self.trainer(epochs=5, max_failures=1, kill_at=2, pid_file=pid_file)
        out = {}
        t = threading.Thread(target=lambda: out.update(result=trainer.fit()))
        t.start()
        try:
            wait_until(lambda: os.path.exists(pid_file) or not t.is_alive(), 120,
                       "rank 1 at epoch 2")
            # the driver has both ranks' reports of epoch 1 (its checkpoint is the last)
            # once the trial's result.json has that epoch's line
            def epochs_recorded():
                got = glob.glob(os.path.join(self.dir, "exp", "*", "result.json"))
                return len(open(got[0]).readlines()) if got else 0
            wait_until(lambda: epochs_recorded() >= 2, 60, "the driver's record of epoch 1")
            os.kill(int(open(pid_file).read()), signal.SIGKILL)
        finally:
            t.join(180)
        self.assertFalse(t.is_alive(), "fit() did not return")
        result = out["result"]
        h = result.metrics_history
        self.assertEqual([m["epoch"] for m in h], [0, 1, 2, 3, 4])
        self.assertEqual([m["start"] for m in h], [0, 0, 2, 2, 2])
        self.assertEqual([m["resumed"] for m in h],
                         [None, None, "checkpoint_000001", "checkpoint_000001",
                          "checkpoint_000001"])
        self.assertEqual(result.metrics["sum"], 10.0)
        self.assertEqual(sorted(n for n in os.listdir(result.path)
                                if n.startswith("checkpoint_")),
                         [f"checkpoint_00000{i}" for i in range(5)])
        with open(os.path.join(result.path, "error.txt")) as f:
            self.assertRegex(f.read(), r"rank 1 on host \S+.*signal 9")

    def test_max_failures_used_up_names_the_failure(self):
        trainer = self.trainer(epochs=4, max_failures=1, exit_at=1)
        with self.assertRaises(TrainingFailedError) as cm:
            trainer.fit()
        text = str(cm.exception)
        self.assertIn("training failed 2 time(s); max_failures=1", text)
        self.assertRegex(text, r"attempt 2: rank 1 on host \S+: .*exit code 3")
        self.assertEqual(len(cm.exception.failures), 2)
        r = cm.exception.result
        self.assertIsNotNone(r.error)
        self.assertEqual([m["epoch"] for m in r.metrics_history], [0])

    def test_a_loop_that_raises_gives_the_remote_traceback(self):
        trainer = self.trainer(epochs=4, raise_at=1)
        with self.assertRaises(TrainingFailedError) as cm:
            trainer.fit()
        text = str(cm.exception)
        self.assertIn("rank 0 on host", text)
        self.assertIn("raised ValueError: bad batch 7", text)
        self.assertIn("remote traceback:", text)
        self.assertIn("in load_batch", text)
        failure = cm.exception.failures[0]
        self.assertIsInstance(failure, WorkerError)
        self.assertEqual((failure.rank, failure.exc_type), (0, "ValueError"))
        self.assertEqual(cm.exception.result.metrics["epoch"], 0)

    def test_report_outside_a_loop_and_bad_arguments(self):
        with self.assertRaises(RuntimeError):
            train.report({"x": 1})
        with self.assertRaises(ValueError):
            HorovodTrainer(lambda a, b: None)
        with self.assertRaises(ValueError):
            ScalingConfig(num_workers=2, resources_per_worker={"TPU": 1})


class ExampleTest(Case):
    def run_example(self, env=None):
        e = dict(os.environ, HOME=self.dir, **(env or {}))
        e["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "python"), horovod_site()])
        p = subprocess.run([PYTHON, os.path.join(ROOT, "examples",
                                                 "horovod_trainer_quickstart.py")],
                           capture_output=True, text=True, timeout=300, env=e)
        self.assertEqual(p.returncode, 0, p.stdout[-3000:] + p.stderr[-3000:])
        return p.stdout

    def check(self, out):
        self.assertIn("Result(metrics={'loss':", out)
        self.assertIn("'training_iteration': 3", out)
        for r in range(3):
            self.assertIn(f"[{r}]<stdout>:epoch: 2, loss:", out)
        results = os.path.join(self.dir, "caf_hvd_results")
        (exp,) = os.listdir(results)
        (trial,) = os.listdir(os.path.join(results, exp))
        names = sorted(os.listdir(os.path.join(results, exp, trial)))
        self.assertEqual([n for n in names if n.startswith("checkpoint_")],
                         ["checkpoint_000000", "checkpoint_000001", "checkpoint_000002"])

    def test_quickstart_on_this_machine(self):
        self.check(self.run_example())

    def test_quickstart_over_agents(self):
        c = self.agents("qa", "qb")
        self.check(self.run_example({"CAF_HVD_HOSTS": f"{c.spec('qa', 2)},{c.spec('qb', 1)}"}))


if __name__ == "__main__":
    argv = sys.argv[1:]
    code = 0
    for case in (SignatureTest, RayDocsTest, TrainerTest, ExampleTest):
        code |= run_suite(case, argv)
    left = tagged_pids()
    if left:
        print(f"leftover processes: {left}")
        code = 1
    sys.exit(code)
