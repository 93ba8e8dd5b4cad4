"""The worker side of a HorovodTrainer run: what `report`, `get_checkpoint`,
`get_context` and `get_dataset_shard` see inside train_loop_per_worker. A rank process
runs one loop of one attempt, so the session is this process's."""

import inspect
import os
import shutil
from dataclasses import dataclass

from caf_hvd import _runtime
from caf_hvd.train._config import Checkpoint

RECORD = "caf_hvd.train"  # the key that marks a report among a rank's log records

_session = None


@dataclass
class TrainContext:
    """Where this worker stands (Ray Train's TrainContext)."""

    world_rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    experiment_name: str
    trial_name: str
    trial_dir: str

    def get_world_rank(self):
        return self.world_rank

    def get_world_size(self):
        return self.world_size

    def get_local_rank(self):
        return self.local_rank

    def get_local_world_size(self):
        return self.local_world_size

    def get_node_rank(self):
        return self.node_rank

    def get_experiment_name(self):
        return self.experiment_name

    def get_trial_name(self):
        return self.trial_name

    def get_trial_dir(self):
        return self.trial_dir


class _Session:
    def __init__(self, spec):
        e = os.environ
        self.spec = spec
        self.iteration = spec["start_iteration"]
        self.context = TrainContext(
            world_rank=int(e["HOROVOD_RANK"]), world_size=int(e["HOROVOD_SIZE"]),
            local_rank=int(e["HOROVOD_LOCAL_RANK"]),
            local_world_size=int(e["HOROVOD_LOCAL_SIZE"]),
            node_rank=int(e.get("GROUP_RANK", e["HOROVOD_CROSS_RANK"])),
            experiment_name=spec["experiment_name"], trial_name=spec["trial_name"],
            trial_dir=spec["trial_dir"])


def _current(what):
    if _session is None:
        raise RuntimeError(f"caf_hvd.train.{what}() works only inside a HorovodTrainer's "
                           "train_loop_per_worker")
    return _session


def report(metrics, *, checkpoint=None):
    """Reports this iteration's metrics (rank 0's are the run's) and, optionally, a
    checkpoint directory, which is copied into the run's storage before this returns;
    the checkpoint counts as persisted once every rank has reported the iteration."""
    s = _current("report")
    if not isinstance(metrics, dict):
        raise TypeError(f"report() takes a dict of metrics, not {type(metrics).__name__}")
    persisted = None
    if checkpoint is not None:
        if not isinstance(checkpoint, Checkpoint):
            raise TypeError(f"report(checkpoint=...) takes a caf_hvd.train.Checkpoint, not "
                            f"{type(checkpoint).__name__}")
        dest = os.path.join(s.spec["trial_dir"], f"checkpoint_{s.iteration:06d}")
        if os.path.abspath(checkpoint.path) != dest:
            # several ranks may write into it: their files are merged, as in Ray
            shutil.copytree(checkpoint.path, dest, dirs_exist_ok=True)
        persisted = dest
    _runtime.log({RECORD: s.spec["attempt"], "iteration": s.iteration,
                  "metrics": dict(metrics), "checkpoint": persisted})
    s.iteration += 1


def get_checkpoint():
    """The newest persisted checkpoint when the run (re)started, or None."""
    path = _current("get_checkpoint").spec["checkpoint"]
    return Checkpoint(path) if path else None


def get_context():
    return _current("get_context").context


def get_dataset_shard(name=None):
    """This rank's share of the dataset given to HorovodTrainer(datasets=...)."""
    s = _current("get_dataset_shard")
    datasets = s.spec.get("datasets") or {}
    if name is None and len(datasets) == 1:
        name = next(iter(datasets))
    if name not in datasets:
        raise KeyError(f"no dataset {name!r}: HorovodTrainer(datasets=...) gave "
                       f"{sorted(datasets)}")
    c = s.context
    return datasets[name].shard(c.world_rank, c.world_size)


def run_loop(loop, config, spec):
    """The function each rank runs: the user's loop inside a session."""
    global _session
    _session = _Session(spec)
    try:
        if _takes_config(loop):
            return loop(config if config is not None else {})
        return loop()
    finally:
        _session = None


def _takes_config(loop):
    params = [p for p in inspect.signature(loop).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(params) >= 1
