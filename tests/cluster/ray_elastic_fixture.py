"""The fixture that stands in for `ray.init(num_cpus=8, resources={"node:host-N": 1})` in
the port of Horovod's test_ray_elastic.py: a cluster of node agents on this machine,
named host-1, host-2, ..., the first one holding the table and the others joined to it
over loopback; CAF_HVD_CLUSTER names it while the test runs. Everything it starts is
killed when the test ends, also when it fails."""

import contextlib
import json
import os
import subprocess

import harness
from harness import CAF_HVD, Cluster, free_port, wait_until


def _alive(port):
    r = subprocess.run([CAF_HVD, "status", "--cluster", f"127.0.0.1:{port}", "--json"],
                       capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        return set()
    return {n["name"] for n in json.loads(r.stdout)["nodes"] if n["state"] == "alive"}


@contextlib.contextmanager
def cluster_of(names, slots=4):
    names = list(names)
    c = Cluster()
    saved = os.environ.get("CAF_HVD_CLUSTER")
    try:
        port = free_port()
        for i, name in enumerate(names):
            extra = ["--slots", str(slots), "--link-timeout", "60"]
            if i == 0:
                args = [CAF_HVD, "node", "--port", str(port), "--name", name, "--bind",
                        "127.0.0.1"] + extra
            else:
                args = [CAF_HVD, "node", "--port", "0", "--name", name, "--bind", "127.0.0.1",
                        "--join", f"127.0.0.1:{port}"] + extra
            env = dict(os.environ, CAF_HVD_CLUSTER_DIR=harness.issue("node", name))
            p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 start_new_session=True, text=True, env=env)
            c.procs.append(p)
        wait_until(lambda: _alive(port) >= set(names), 60,
                   f"agents {', '.join(names)} in the cluster's table")
        os.environ["CAF_HVD_CLUSTER"] = f"127.0.0.1:{port}"
        yield f"127.0.0.1:{port}"
    finally:
        if saved is None:
            os.environ.pop("CAF_HVD_CLUSTER", None)
        else:
            os.environ["CAF_HVD_CLUSTER"] = saved
        c.close()
