"""caf_hvd: horovod.ray's executor API on caf-hvd, without Ray.

    from caf_hvd import RayExecutor
    settings = RayExecutor.create_settings(timeout_s=30)
    executor = RayExecutor(settings, num_workers=4)
    executor.start(executable_cls=Trainer, executable_kwargs={"lr": 0.1})
    losses = executor.execute(lambda trainer: trainer.train_epoch())

Porting from horovod.ray is a change of import: `from horovod.ray import RayExecutor`
-> `from caf_hvd import RayExecutor` (the same for ElasticRayExecutor, from
horovod.ray.elastic, and ray_logger). Executor and ElasticExecutor are the same
machinery with caf-hvd's own argument names;
caf_hvd.train is Ray Train's HorovodTrainer without Ray.
"""

from caf_hvd._runtime import log
from caf_hvd.executor import ElasticExecutor, Executor, ExecutorError, WorkerError, find_binary
from caf_hvd.ray_executor import RayExecutor, RaySettings
from caf_hvd.ray_elastic import ElasticRayExecutor, RayHostDiscovery, TestDiscovery
from caf_hvd import data  # noqa: E402,F401 - caf_hvd.data, as ray.data
from caf_hvd import ray_logger  # noqa: E402,F401 - horovod.ray.ray_logger

__all__ = ["Executor", "ElasticExecutor", "ExecutorError", "WorkerError", "log", "find_binary",
           "RayExecutor", "RaySettings", "ElasticRayExecutor", "RayHostDiscovery",
           "TestDiscovery", "ray_logger"]
