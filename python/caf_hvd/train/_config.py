"""Plain data of caf_hvd.train: Ray Train's configs, Checkpoint and Result."""

import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass, field


class Checkpoint:
    """A directory of files (Ray Train's Checkpoint). Inside a training loop,
    `report(..., checkpoint=Checkpoint.from_directory(d))` copies d into the run's storage;
    `get_checkpoint()` and `Result.checkpoint` point at that persisted copy."""

    def __init__(self, path):
        self.path = os.path.abspath(os.fspath(path))

    @classmethod
    def from_directory(cls, path):
        path = os.fspath(path)
        if not os.path.isdir(path):
            raise ValueError(f"Checkpoint.from_directory({path!r}): not a directory")
        return cls(path)

    def to_directory(self, path=None):
        """Copies the checkpoint's files into `path` (a new temporary directory if None)."""
        dest = os.fspath(path) if path is not None else tempfile.mkdtemp(prefix="checkpoint-")
        shutil.copytree(self.path, dest, dirs_exist_ok=True)
        return dest

    @contextlib.contextmanager
    def as_directory(self):
        """The checkpoint's directory (it is local already: no copy is made)."""
        yield self.path

    def __eq__(self, other):
        return isinstance(other, Checkpoint) and other.path == self.path

    def __hash__(self):
        return hash(self.path)

    def __repr__(self):
        return f"Checkpoint(path={self.path!r})"


@dataclass
class ScalingConfig:
    """num_workers ranks, each with resources_per_worker {"CPU": n, "GPU": m}
    (use_gpu: one GPU each unless resources_per_worker says otherwise).
    trainer_resources, placement_strategy and accelerator_type are accepted and have no
    effect (docs/executors.md, caf_hvd.train)."""

    num_workers: int = 1
    use_gpu: bool = False
    resources_per_worker: dict = None
    trainer_resources: dict = None
    placement_strategy: str = "PACK"
    accelerator_type: str = None

    def __post_init__(self):
        if isinstance(self.num_workers, bool) or not isinstance(self.num_workers, int) \
                or self.num_workers < 1:
            raise ValueError(f"ScalingConfig.num_workers must be a positive integer, not "
                             f"{self.num_workers!r}")
        unknown = sorted(set(self.resources_per_worker or {}) - {"CPU", "GPU", "memory"})
        if unknown:
            raise ValueError(f"ScalingConfig.resources_per_worker: {unknown} are Ray custom "
                             "resources, which place workers on Ray nodes; caf-hvd places "
                             "ranks by hosts (HorovodTrainer(hosts=...)) and knows only CPU "
                             "and GPU")
        if self.placement_strategy not in ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"):
            raise ValueError(f"ScalingConfig.placement_strategy {self.placement_strategy!r}: "
                             "expected PACK, SPREAD, STRICT_PACK or STRICT_SPREAD")

    @property
    def cpus_per_worker(self):
        return (self.resources_per_worker or {}).get("CPU", 1)

    @property
    def gpus_per_worker(self):
        gpus = (self.resources_per_worker or {}).get("GPU")
        if gpus is None:
            return 1 if self.use_gpu else 0
        if gpus != int(gpus) or gpus < 0:
            raise ValueError(f"resources_per_worker GPU {gpus!r}: caf-hvd lends whole GPUs")
        return int(gpus)


@dataclass
class FailureConfig:
    """max_failures: how many times a failed worker group is restarted from the latest
    persisted checkpoint (-1: without limit)."""

    max_failures: int = 0
    fail_fast: bool = False

    def __post_init__(self):
        if not isinstance(self.max_failures, int) or self.max_failures < -1:
            raise ValueError(f"FailureConfig.max_failures must be -1 or more, not "
                             f"{self.max_failures!r}")


@dataclass
class CheckpointConfig:
    """num_to_keep: how many persisted checkpoints stay on disk (None: all); with
    checkpoint_score_attribute the best by that metric are kept, else the newest. The
    newest is always kept (a restart needs it)."""

    num_to_keep: int = None
    checkpoint_score_attribute: str = None
    checkpoint_score_order: str = "max"

    def __post_init__(self):
        if self.num_to_keep is not None and (not isinstance(self.num_to_keep, int)
                                             or self.num_to_keep < 1):
            raise ValueError(f"CheckpointConfig.num_to_keep must be None or at least 1, not "
                             f"{self.num_to_keep!r}")
        if self.checkpoint_score_order not in ("max", "min"):
            raise ValueError(f"CheckpointConfig.checkpoint_score_order "
                             f"{self.checkpoint_score_order!r}: expected 'max' or 'min'")


@dataclass
class RunConfig:
    """name: the run's directory under storage_path (default: HorovodTrainer_<time>);
    storage_path: where results and checkpoints persist (default ~/caf_hvd_results); it
    must be reachable at the same path from every worker (a shared file system with
    node agents), as Ray requires of a multi-node storage_path."""

    name: str = None
    storage_path: str = None
    failure_config: FailureConfig = None
    checkpoint_config: CheckpointConfig = None
    verbose: int = None
    stop: object = None
    callbacks: list = None
    sync_config: object = None

    def __post_init__(self):
        if self.name is not None and (not self.name or "/" in self.name):
            raise ValueError(f"RunConfig.name {self.name!r}: a directory name, without '/'")
        if self.stop is not None:
            raise ValueError("RunConfig.stop is Ray Tune's stopping criterion; a "
                             "HorovodTrainer run ends when its loop returns")
        if self.callbacks:
            raise ValueError("RunConfig.callbacks are Ray Tune callbacks, which caf-hvd "
                             "does not run")


class TrainingFailedError(RuntimeError):
    """fit() failed: max_failures restarts were used up (or none allowed). `failures`
    lists every failure (caf_hvd.WorkerError or ExecutorError), `result` is the Result
    with what was reported and persisted before."""

    def __init__(self, message, failures, result):
        super().__init__(message)
        self.failures = failures
        self.result = result


@dataclass
class Result:
    """What fit() returns: rank 0's last reported metrics, the newest persisted
    checkpoint, the run's directory, the error (None when fit() returned), every
    reported metrics dict in order (metrics_history), and the kept checkpoints with
    their metrics (best_checkpoints)."""

    metrics: dict
    checkpoint: Checkpoint
    path: str
    error: Exception = None
    metrics_history: list = field(default_factory=list)
    best_checkpoints: list = field(default_factory=list)

    @property
    def metrics_dataframe(self):
        """metrics_history as a pandas DataFrame (needs pandas)."""
        try:
            import pandas
        except ImportError as e:
            raise ImportError("Result.metrics_dataframe needs pandas, which is not "
                              "installed; Result.metrics_history holds the same rows as "
                              "dicts") from e
        return pandas.DataFrame(self.metrics_history)
