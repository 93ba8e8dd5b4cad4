"""caf_hvd.train: Ray Train's HorovodTrainer surface on caf-hvd, without Ray.

    from caf_hvd import train
    from caf_hvd.train import Checkpoint, RunConfig, ScalingConfig
    from caf_hvd.train.horovod import HorovodTrainer

Inside train_loop_per_worker: report(metrics, checkpoint=Checkpoint.from_directory(d)),
get_checkpoint(), get_context(), get_dataset_shard(name).
"""

from caf_hvd.train._config import (Checkpoint, CheckpointConfig, FailureConfig, Result,
                                   RunConfig, ScalingConfig, TrainingFailedError)
from caf_hvd.train._session import (TrainContext, get_checkpoint, get_context,
                                    get_dataset_shard, report)
from caf_hvd.train.horovod import HorovodConfig, HorovodTrainer

__all__ = ["Checkpoint", "CheckpointConfig", "FailureConfig", "Result", "RunConfig",
           "ScalingConfig", "TrainingFailedError", "TrainContext", "get_checkpoint",
           "get_context", "get_dataset_shard", "report", "HorovodConfig", "HorovodTrainer"]
