"""HorovodTrainer: Ray Train's trainer for Horovod loops, run as a caf-hvd worker group.
fit() starts num_workers ranks (RayExecutor), runs train_loop_per_worker on each,
collects the reports, persists checkpoints under storage_path/name/<trial>, and on a
failure restarts the whole group from the newest persisted checkpoint, up to
max_failures times."""

import concurrent.futures
import datetime
import inspect
import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass

from caf_hvd.executor import ExecutorError, WorkerError
from caf_hvd.ray_executor import RayExecutor
from caf_hvd.train import _session
from caf_hvd.train._config import (Checkpoint, CheckpointConfig, FailureConfig, Result,
                                   RunConfig, ScalingConfig, TrainingFailedError)


@dataclass
class HorovodConfig:
    """Ray Train's HorovodConfig. timeout_s: the Gloo timeout; nics: the interfaces
    between hosts; placement_group_timeout_s: seconds for the ranks to start;
    ssh_identity_file/ssh_str/ssh_port: the ssh launcher, with hosts. key and verbose
    below 2 have no effect (docs/executors.md, caf_hvd.train)."""

    nics: set = None
    verbose: int = 1
    key: str = None
    ssh_port: int = None
    ssh_identity_file: str = None
    ssh_str: str = None
    timeout_s: int = 300
    placement_group_timeout_s: int = 100


class HorovodTrainer:
    """Ray Train's HorovodTrainer without Ray. Besides Ray's arguments it takes where
    the ranks run, keyword-only: hosts/hostfile (node agents, as -H takes them), cluster
    (HOST[:PORT] of a cluster whose table places the ranks; default $CAF_HVD_CLUSTER, else
    the installed node agent's cluster, when no hosts are given), cluster_dir, insecure,
    and python/caf_hvd (the interpreter and binary)."""

    def __init__(self, train_loop_per_worker, *, train_loop_config=None, horovod_config=None,
                 scaling_config=None, dataset_config=None, run_config=None, datasets=None,
                 metadata=None, resume_from_checkpoint=None, hosts=None, hostfile=None,
                 cluster_dir=None, insecure=False, python=None, caf_hvd=None, cluster=None):
        if not callable(train_loop_per_worker):
            raise TypeError("train_loop_per_worker must be a function")
        required = [p for p in inspect.signature(train_loop_per_worker).parameters.values()
                    if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY,
                                                          p.POSITIONAL_OR_KEYWORD)]
        if len(required) > 1:
            raise ValueError(f"train_loop_per_worker takes at most one argument (the "
                             f"train_loop_config), not {len(required)}")
        if train_loop_config is not None and not isinstance(train_loop_config, dict):
            raise TypeError("train_loop_config must be a dict")
        if dataset_config is not None:
            raise ValueError("dataset_config configures Ray Data ingest; caf_hvd.train "
                             "shards in-memory datasets by rank and takes none")
        if resume_from_checkpoint is not None and not isinstance(resume_from_checkpoint,
                                                                 Checkpoint):
            raise TypeError("resume_from_checkpoint must be a caf_hvd.train.Checkpoint")
        from caf_hvd.data import Dataset
        for k, d in (datasets or {}).items():
            if not isinstance(d, Dataset):
                raise TypeError(f"datasets[{k!r}] must be a caf_hvd.data Dataset "
                                "(caf_hvd.data.from_items), not " + type(d).__name__)
        self.train_loop_per_worker = train_loop_per_worker
        self.train_loop_config = train_loop_config
        self.horovod_config = horovod_config or HorovodConfig()
        self.scaling_config = scaling_config or ScalingConfig()
        self.run_config = run_config or RunConfig()
        self.datasets = dict(datasets or {})
        self.metadata = metadata
        self.resume_from_checkpoint = resume_from_checkpoint
        self._where = dict(hosts=hosts, hostfile=hostfile, cluster_dir=cluster_dir,
                           insecure=insecure, cluster=cluster)
        self._python = python
        self._binary = caf_hvd
        # what fit() runs instead of a new group (the benchmark swaps it)
        self._executor_cls = RayExecutor

    # -- the group ---------------------------------------------------------------------

    def _executor(self):
        h, sc = self.horovod_config, self.scaling_config
        settings = RayExecutor.create_settings(
            timeout_s=h.timeout_s, ssh_identity_file=h.ssh_identity_file, ssh_str=h.ssh_str,
            placement_group_timeout_s=h.placement_group_timeout_s, nics=h.nics,
            verbose=h.verbose)
        if h.ssh_port:
            settings.extra_args.extend(["--ssh-port", str(h.ssh_port)])
        gpus = sc.gpus_per_worker
        return RayExecutor(settings, num_workers=sc.num_workers,
                           cpus_per_worker=sc.cpus_per_worker, use_gpu=bool(gpus),
                           gpus_per_worker=gpus or None, python=self._python,
                           caf_hvd=self._binary, **self._where)

    # -- fit ---------------------------------------------------------------------------

    def fit(self):
        """Runs the loop on every rank to its end; returns a Result, or raises
        TrainingFailedError once max_failures restarts are used up."""
        rc = self.run_config
        failure = rc.failure_config or FailureConfig()
        run = _Run(rc, self.scaling_config.num_workers, self.train_loop_config)
        if self.resume_from_checkpoint is not None:
            run.resume_from(self.resume_from_checkpoint)
        failures = []
        while True:
            attempt = len(failures)
            error = self._attempt(run, attempt)
            if error is None:
                run.check_complete()
                return run.result(None)
            failures.append(error)
            run.note_failure(attempt, error)
            if failure.max_failures != -1 and len(failures) > failure.max_failures:
                result = run.result(error)
                lines = [f"training failed {len(failures)} time(s); max_failures="
                         f"{failure.max_failures} allows {failure.max_failures} "
                         "restart(s)"]
                for i, f in enumerate(failures):
                    lines.append(f"  attempt {i + 1}: {_first_line(f)}")
                lines.append(f"the last failure:\n{f}")
                raise TrainingFailedError("\n".join(lines), failures, result) from error
            run.roll_back()

    def _attempt(self, run, attempt):
        """One worker group from start to end: None when every rank's loop returned,
        else the failure that ended it."""
        ex = self._executor()
        spec = run.spec(attempt, self.datasets)
        try:
            ex.start()
            futures = ex.run_remote(_session.run_loop,
                                    args=(self.train_loop_per_worker,
                                          self.train_loop_config, spec),
                                    callbacks=[run.on_record])
            done, _ = concurrent.futures.wait(futures,
                                              return_when=concurrent.futures.FIRST_EXCEPTION)
            if any(f.exception() for f in done):
                # what caused it may come a moment after its first echo (a peer's
                # HorovodInternalError before the death of the rank it lost)
                done, _ = concurrent.futures.wait(futures, timeout=_ROOT_CAUSE_WINDOW)
            errors = [f.exception() for f in futures if f in done and f.exception()]
            return _root_cause(errors) if errors else None
        except (WorkerError, ExecutorError) as e:
            return e
        finally:
            ex.shutdown()  # also runs every callback of the group's reports
            run.settle()


_ROOT_CAUSE_WINDOW = 5  # seconds the other ranks' answers are waited for after a failure


def _root_cause(errors):
    """The error that tells what happened: the loop's own raise, then a rank's death,
    then Horovod's echo of a lost peer, then a rank the launcher stopped because
    another failed, then 'the group ended'."""
    def kind(e):
        if isinstance(e, WorkerError) and e.exc_type and e.exc_type != "HorovodInternalError":
            return 0
        if isinstance(e, WorkerError) and e.cause and "group ended" not in e.cause \
                and "because the worker group failed" not in e.cause:
            return 1
        if isinstance(e, WorkerError) and e.exc_type:
            return 2
        return 3
    return min(errors, key=kind)


def _first_line(e):
    return str(e).splitlines()[0] if str(e) else type(e).__name__


class _Run:
    """The driver's record of a run: its directory, the reports of the current attempt,
    the metrics history and the persisted checkpoints."""

    def __init__(self, rc, num_workers, config):
        self.n = num_workers
        self.keep = rc.checkpoint_config or CheckpointConfig()
        storage = os.path.expanduser(rc.storage_path or "~/caf_hvd_results")
        stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
        self.experiment = rc.name or f"HorovodTrainer_{stamp}"
        self.trial = f"HorovodTrainer_{uuid.uuid4().hex[:5]}_00000_0_{stamp}"
        self.dir = os.path.abspath(os.path.join(storage, self.experiment, self.trial))
        os.makedirs(self.dir)
        with open(os.path.join(self.dir, "params.json"), "w") as f:
            json.dump(config or {}, f, default=repr, indent=2)
        self.started = time.time()
        self.history = []  # rank 0's metrics of every complete iteration, in order
        self.checkpoints = []  # (iteration, path, metrics) persisted and kept
        self.latest = None  # (iteration, path) of the newest persisted checkpoint
        self.pending = {}  # iteration -> {rank: record} of the current attempt
        self.attempt = 0
        self.initial = None  # resume_from_checkpoint's directory
        self.incomplete = []

    def resume_from(self, checkpoint):
        self.initial = checkpoint.path

    def spec(self, attempt, datasets):
        self.attempt = attempt
        self.pending = {}
        return {"attempt": attempt, "start_iteration": self.latest[0] + 1 if self.latest else 0,
                "checkpoint": self.latest[1] if self.latest else self.initial,
                "trial_dir": self.dir, "experiment_name": self.experiment,
                "trial_name": self.trial, "datasets": datasets}

    def on_record(self, record):
        """A callback of the group: a rank's report (other log records are ignored)."""
        if record.get(_session.RECORD) != self.attempt:
            return
        it = record["iteration"]
        got = self.pending.setdefault(it, {})
        got[record["rank"]] = record
        if len(got) == self.n:
            self._complete(it, got)

    def _complete(self, it, reports):
        metrics = dict(reports[0]["metrics"])
        metrics["training_iteration"] = len(self.history) + 1
        paths = {r["checkpoint"] for r in reports.values() if r["checkpoint"]}
        if paths:
            path = paths.pop()
            metrics["checkpoint_dir_name"] = os.path.basename(path)
            self.latest = (it, path)
            self.checkpoints.append((it, path, metrics))
            self._prune()
        self.history.append((it, metrics))
        with open(os.path.join(self.dir, "result.json"), "a") as f:
            f.write(json.dumps(metrics, default=repr) + "\n")
        del self.pending[it]

    def _prune(self):
        k = self.keep
        if not k.num_to_keep or len(self.checkpoints) <= k.num_to_keep:
            return
        newest = self.checkpoints[-1]
        if k.checkpoint_score_attribute:
            attr = k.checkpoint_score_attribute
            sign = 1 if k.checkpoint_score_order == "max" else -1
            ranked = sorted(self.checkpoints,
                            key=lambda c: sign * float(c[2].get(attr, float("-inf") * sign)),
                            reverse=True)
        else:
            ranked = sorted(self.checkpoints, key=lambda c: c[0], reverse=True)
        kept = ranked[:k.num_to_keep]
        if newest not in kept:
            kept = kept[:-1] + [newest]
        for c in self.checkpoints:
            if c not in kept:
                shutil.rmtree(c[1], ignore_errors=True)
        self.checkpoints = [c for c in self.checkpoints if c in kept]

    def settle(self):
        """After a group ended: iterations not every rank reported never happened."""
        self.incomplete = sorted(self.pending)

    def note_failure(self, attempt, error):
        with open(os.path.join(self.dir, "error.txt"), "a") as f:
            f.write(f"attempt {attempt + 1}: {error}\n")

    def roll_back(self):
        """Before a restart: the history goes back to the checkpoint it restarts from,
        and checkpoint directories that were never persisted are removed."""
        last = self.latest[0] if self.latest else -1
        self.history = [(it, m) for it, m in self.history if it <= last]
        kept = {c[1] for c in self.checkpoints}
        for name in os.listdir(self.dir):
            path = os.path.join(self.dir, name)
            if name.startswith("checkpoint_") and path not in kept:
                shutil.rmtree(path, ignore_errors=True)

    def check_complete(self):
        if self.incomplete:
            raise TrainingFailedError(
                f"the loop ended on some ranks after reports that others never made "
                f"(iterations {self.incomplete} were not reported by all "
                f"{self.n} ranks); every rank must call report() the same number of times",
                [], self.result(None))

    def result(self, error):
        latest = Checkpoint(self.latest[1]) if self.latest else None
        return Result(metrics=dict(self.history[-1][1]) if self.history else {},
                      checkpoint=latest, path=self.dir, error=error,
                      metrics_history=[dict(m) for _, m in self.history],
                      best_checkpoints=[(Checkpoint(p), dict(m))
                                        for _, p, m in self.checkpoints])
