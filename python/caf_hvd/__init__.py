"""caf_hvd: horovod.ray's executor API on caf-hvd, without Ray.

    from caf_hvd import Executor
    with Executor(num_workers=4) as ex:
        ex.start(executable_cls=Trainer, executable_kwargs={"lr": 0.1})
        losses = ex.execute(lambda trainer: trainer.train_epoch())

Porting from horovod.ray is a change of import: RayExecutor -> Executor,
ElasticRayExecutor -> ElasticExecutor, ray_logger.log -> caf_hvd.log.
"""

from caf_hvd._runtime import log
from caf_hvd.executor import ElasticExecutor, Executor, ExecutorError, WorkerError, find_binary

RayExecutor = Executor
ElasticRayExecutor = ElasticExecutor

__all__ = ["Executor", "ElasticExecutor", "ExecutorError", "WorkerError", "log", "find_binary",
           "RayExecutor", "ElasticRayExecutor"]
