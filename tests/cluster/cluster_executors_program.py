"""The Python executors with no hosts on a configured cluster ($CAF_HVD_CLUSTER): a static
RayExecutor, an elastic ElasticRayExecutor and a HorovodTrainer, each printing where its
ranks ran as the ranks themselves saw it (one JSON line per part)."""

import json
import os

from caf_hvd import ElasticExecutor, RayExecutor
from caf_hvd.train import ScalingConfig, report
from caf_hvd.train.horovod import HorovodTrainer


def where():
    return {"rank": int(os.environ["HOROVOD_RANK"]), "size": int(os.environ["HOROVOD_SIZE"]),
            "host": os.environ["HOROVOD_HOSTNAME"], "slot": os.environ.get("CAF_HVD_SLOT")}


class Worker:
    def where(self):
        return where()


def loop():
    report(where())


def main():
    settings = RayExecutor.create_settings(timeout_s=30)
    ex = RayExecutor(settings, num_workers=3)
    ex.start(executable_cls=Worker)
    print(json.dumps({"static": ex.execute(lambda w: w.where()),
                      "ranks": [dict(r) if isinstance(r, dict) else r for r in ex.ranks]},
                     default=str), flush=True)
    ex.shutdown()
    elastic = ElasticExecutor(min_workers=2, max_workers=2, elastic_timeout=60)
    elastic.start()
    print(json.dumps({"elastic": elastic.run(where)}), flush=True)
    result = HorovodTrainer(loop, scaling_config=ScalingConfig(num_workers=2)).fit()
    print(json.dumps({"trainer": result.metrics}), flush=True)


if __name__ == "__main__":
    main()
