"""RayExecutor: horovod.ray 0.28.1's RayExecutor, argument for argument, on caf-hvd.
One class serves both kinds of job, as in horovod.ray: `num_workers` (or `num_hosts`)
gives a static group of persistent workers (an Executor), `min_workers` an elastic job
(an ElasticExecutor per `run`). The settings say what Ray's settings say, mapped to
caf-hvd's flags, plus where the hosts come from, which Ray's cluster said."""

import os
import sys
import tempfile
from dataclasses import dataclass, field

from caf_hvd.executor import ElasticExecutor, Executor, ExecutorError, default_cluster


@dataclass
class RaySettings:
    """What RayExecutor.create_settings returns. Ray's fields (timeout_s,
    ssh_identity_file, placement_group_timeout_s, nics, verbose) and where the hosts come
    from: this machine (none given), `hosts` (as `-H` takes them), `hostfile`, a
    `discovery_script` (elastic), a `cluster` whose table places the ranks (default:
    $CAF_HVD_CLUSTER when no hosts are given), and the node agents'
    `cluster_dir`/`insecure`."""

    timeout_s: int = 30
    ssh_identity_file: str = None
    placement_group_timeout_s: int = 100
    nics: set = None
    verbose: int = 1
    hosts: object = None
    hostfile: str = None
    discovery_script: str = None
    discovery_interval: float = 1
    slots_per_host: int = None
    cluster_dir: str = None
    cluster: str = None
    insecure: bool = False
    launcher: str = None
    elastic: bool = False
    extra_args: list = field(default_factory=list)


_HOST_KEYS = ("hosts", "hostfile", "discovery_script", "discovery_interval", "slots_per_host",
              "cluster_dir", "insecure", "launcher", "cluster")


def _positive(name, value, allow_none=True):
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"{name} must be a positive number, not {value!r}")


class RayExecutor:
    """horovod.ray.RayExecutor on caf-hvd (the guide's executors page, docs/executors.md,
    says what each argument means here and which ones have no effect without Ray)."""

    @classmethod
    def create_settings(cls, timeout_s=30, ssh_identity_file=None, ssh_str=None,
                        placement_group_timeout_s=100, nics=None, *, verbose=1, hosts=None,
                        hostfile=None, discovery_script=None, discovery_interval=1,
                        slots_per_host=None, cluster_dir=None, insecure=False, launcher=None,
                        cluster=None):
        """timeout_s: the Gloo timeout of the ranks (HOROVOD_GLOO_TIMEOUT_SECONDS);
        placement_group_timeout_s: seconds for every rank to be placed and started
        (--start-timeout); nics: the interfaces between hosts (--network-interface);
        ssh_identity_file: the key of the ssh launcher (with hosts, agents are started
        over ssh); ssh_str: that key's text, written to ssh_identity_file (mode 0600)
        when the file does not exist yet."""
        _positive("timeout_s", timeout_s, allow_none=False)
        _positive("placement_group_timeout_s", placement_group_timeout_s, allow_none=False)
        if ssh_str:
            if not ssh_identity_file:
                raise ValueError("ssh_str needs ssh_identity_file: the path to write the "
                                 "private key to")
            if not os.path.exists(ssh_identity_file):
                fd = os.open(ssh_identity_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(ssh_str)
        if nics is not None:
            if isinstance(nics, str):
                nics = {n for n in nics.split(",") if n}
            nics = set(nics)
            if not nics or not all(isinstance(n, str) and n for n in nics):
                raise ValueError(f"nics must be a non-empty set of interface names, not {nics!r}")
        if launcher not in (None, "none", "ssh", "slurm"):
            raise ValueError(f"launcher {launcher!r}: expected None, 'ssh' or 'slurm'")
        return RaySettings(timeout_s=timeout_s, ssh_identity_file=ssh_identity_file,
                           placement_group_timeout_s=placement_group_timeout_s, nics=nics,
                           verbose=verbose, hosts=hosts, hostfile=hostfile,
                           discovery_script=discovery_script,
                           discovery_interval=discovery_interval, slots_per_host=slots_per_host,
                           cluster_dir=cluster_dir, insecure=insecure, launcher=launcher,
                           cluster=cluster)

    def __init__(self, settings, num_workers=None, num_hosts=None, num_workers_per_host=1,
                 cpus_per_worker=1, use_gpu=False, gpus_per_worker=None,
                 use_current_placement_group=True, min_workers=None, max_workers=None,
                 reset_limit=None, cooldown_range=None, elastic_timeout=600,
                 override_discovery=True, *, cpus_per_slot=None, python=None, caf_hvd=None,
                 **where):
        # horovod.ray's own checks, first, in its order
        if max_workers and (not min_workers or min_workers <= 0):
            raise ValueError(f"max_workers={max_workers} without a positive min_workers: an "
                             "elastic job needs min_workers >= 1")
        if min_workers and num_workers:
            raise ValueError(f"min_workers={min_workers} and num_workers={num_workers} both "
                             "given: a job is either elastic (min_workers) or not "
                             "(num_workers), give one")
        if gpus_per_worker and not use_gpu:
            raise ValueError(f"gpus_per_worker={gpus_per_worker} needs use_gpu=True")
        if use_gpu and isinstance(gpus_per_worker, int) and gpus_per_worker < 1:
            raise ValueError(f"gpus_per_worker must be >= 1 with use_gpu, not {gpus_per_worker}")
        # and the ones horovod.ray leaves to later failures
        if settings is None:
            raise TypeError("settings is required: RayExecutor.create_settings(...)")
        unknown = sorted(set(where) - set(_HOST_KEYS))
        if unknown:
            raise TypeError(f"RayExecutor() got unexpected keyword argument(s) {unknown}; "
                            f"besides horovod.ray's arguments it takes {list(_HOST_KEYS)}, "
                            "python and caf_hvd")
        if cpus_per_slot is not None:  # the old ElasticRayExecutor's name (docs/ray.rst)
            if cpus_per_worker not in (1, cpus_per_slot):
                raise ValueError(f"cpus_per_slot={cpus_per_slot} and cpus_per_worker="
                                 f"{cpus_per_worker} disagree; give one")
            cpus_per_worker = cpus_per_slot
        _positive("cpus_per_worker", cpus_per_worker, allow_none=False)
        if min_workers is None and num_workers is not None and num_hosts is not None:
            raise ValueError(f"num_workers={num_workers} and num_hosts={num_hosts} both given: "
                             "give num_workers, or num_hosts with num_workers_per_host")
        if min_workers is None and num_workers is None and num_hosts is None:
            raise ValueError("give num_workers, num_hosts (with num_workers_per_host), or "
                             "min_workers for an elastic job")
        if cooldown_range is not None:
            try:
                low, high = cooldown_range
            except (TypeError, ValueError):
                raise ValueError(f"cooldown_range must be (low, high) seconds, not "
                                 f"{cooldown_range!r}") from None
            if not (0 < low <= high):
                raise ValueError(f"cooldown_range {cooldown_range!r}: need 0 < low <= high")
        self.settings = settings
        self._where = {k: getattr(settings, k, None) for k in _HOST_KEYS}
        self._where.update({k: v for k, v in where.items()})
        if not any(self._where.get(k) for k in ("hosts", "hostfile", "discovery_script")):
            # an unchanged program runs over node agents when its environment says where
            self._where["hosts"] = os.environ.get("CAF_HVD_HOSTS") or None
            self._where["hostfile"] = os.environ.get("CAF_HVD_HOSTFILE") or None
        if any(self._where.get(k) for k in ("hosts", "hostfile", "discovery_script")):
            self._where["cluster"] = None  # given hosts always win over a cluster
        else:
            self._where["cluster"] = default_cluster(self._where.get("cluster"))
        self.elastic = min_workers is not None
        try:
            settings.elastic = self.elastic  # horovod.ray marks its settings so
        except AttributeError:
            pass
        self._params = dict(num_workers=num_workers, num_hosts=num_hosts,
                            num_workers_per_host=num_workers_per_host,
                            cpus_per_worker=cpus_per_worker, use_gpu=use_gpu,
                            gpus_per_worker=gpus_per_worker or int(bool(use_gpu)),
                            min_workers=min_workers, max_workers=max_workers,
                            reset_limit=reset_limit, cooldown_range=cooldown_range,
                            elastic_timeout=elastic_timeout)
        self._python = python
        self._binary = caf_hvd
        self._static = None  # the Executor of a started static group
        self._started = False
        self._start_args = None
        self._elastic_runs = []
        self._script_dir = None

    # -- what the settings mean here ---------------------------------------------------

    def _flags(self):
        s, w = self.settings, self._where
        flags = []
        timeout = getattr(s, "timeout_s", None)
        if timeout:
            flags += ["--gloo-timeout-seconds", str(max(1, int(round(timeout))))]
        if getattr(s, "verbose", 0) and int(getattr(s, "verbose")) >= 2:
            flags.append("--verbose")
        launcher = w.get("launcher")
        identity = getattr(s, "ssh_identity_file", None)
        remote = bool(w.get("hosts") or w.get("hostfile"))
        if identity and remote and launcher in (None, "ssh") and not self.elastic:
            launcher = "ssh"
        if launcher and launcher != "none":
            if not remote and not self.elastic and launcher == "ssh":
                raise ValueError("launcher='ssh' starts agents on the given hosts: give hosts "
                                 "or hostfile")
            flags += ["--launcher", launcher]
            if launcher == "ssh" and identity:
                flags += ["--ssh-identity-file", identity]
        flags += list(getattr(s, "extra_args", None) or [])
        return flags

    def _nics(self):
        nics = getattr(self.settings, "nics", None)
        return ",".join(sorted(nics)) if nics else None

    def _start_timeout(self):
        return getattr(self.settings, "placement_group_timeout_s", None) or 100

    # -- lifecycle ---------------------------------------------------------------------

    def start(self, executable_cls=None, executable_args=None, executable_kwargs=None,
              extra_env_vars=None):
        """Static: starts the workers and builds executable_cls in each. Elastic: records
        what each process of each generation builds before it runs a function."""
        if self._static is not None:
            raise ExecutorError("start() was called already; call shutdown() first")
        self._start_args = (executable_cls, executable_args, executable_kwargs,
                            extra_env_vars)
        self._started = True
        if self.elastic:
            self._discovery()  # a missing host source fails here, as Ray's would
            return
        p, w = self._params, self._where
        ex = Executor(num_workers=p["num_workers"], num_hosts=p["num_hosts"],
                      num_workers_per_host=p["num_workers_per_host"],
                      cpus_per_worker=p["cpus_per_worker"], use_gpu=p["use_gpu"],
                      gpus_per_worker=p["gpus_per_worker"] if p["use_gpu"] else 0,
                      hosts=w.get("hosts"), hostfile=w.get("hostfile"),
                      cluster_dir=w.get("cluster_dir"), insecure=bool(w.get("insecure")),
                      start_timeout=self._start_timeout(), network_interface=self._nics(),
                      python=self._python, caf_hvd=self._binary, extra_args=self._flags(),
                      cluster=w.get("cluster"))
        ex.start(executable_cls=executable_cls, executable_args=executable_args,
                 executable_kwargs=executable_kwargs, extra_env_vars=extra_env_vars)
        self._static = ex

    def _discovery(self):
        """The discovery script of an elastic job: the given one, else one that prints
        the fixed hosts or hostfile."""
        w = self._where
        if w.get("discovery_script"):
            return w["discovery_script"]
        if w.get("cluster"):
            return None  # the cluster's table lists the hosts
        lines = []
        if w.get("hosts"):
            hosts = w["hosts"]
            specs = hosts.split(",") if isinstance(hosts, str) else list(hosts)
            lines = [h.strip() for h in specs if h.strip()]
        elif w.get("hostfile"):
            with open(w["hostfile"]) as f:
                for raw in f:
                    line = raw.split("#", 1)[0].split()
                    if not line:
                        continue
                    slots = [t.split("=", 1)[1] for t in line[1:] if t.startswith("slots=")]
                    lines.append(line[0] + (f":{slots[0]}" if slots else ""))
        if not lines:
            raise ValueError(
                "an elastic RayExecutor (min_workers) needs hosts whose agents run: "
                "discovery_script=PATH (an executable printing HOST:PORT:SLOTS lines), or "
                "hosts=/hostfile= of running node agents (caf-hvd node), or a cluster of them "
                "(cluster=HOST[:PORT] or CAF_HVD_CLUSTER), as keyword arguments or on the "
                "settings; caf-hvd runs elastic jobs over node agents")
        if self._script_dir is None:
            self._script_dir = tempfile.mkdtemp(prefix="caf-hvd-discovery-")
        path = os.path.join(self._script_dir, "discover.sh")
        with open(path, "w") as f:
            f.write("#!/bin/sh\ncat <<'EOF'\n" + "\n".join(lines) + "\nEOF\n")
        os.chmod(path, 0o700)
        return path

    def shutdown(self):
        """Stops every worker; nothing of the group is left running. A started executor
        may be started again afterwards."""
        ex, self._static = self._static, None
        if ex is not None:
            ex.shutdown()
        for run in self._elastic_runs:
            run.shutdown()
        self._elastic_runs = []
        self._started = False
        if self._script_dir:
            import shutil
            shutil.rmtree(self._script_dir, ignore_errors=True)
            self._script_dir = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()
        return False

    def _group(self):
        if not self._started:
            raise ExecutorError("the executor is not started; call start() first")
        return self._static

    # -- calls -------------------------------------------------------------------------

    def execute(self, fn, callbacks=None, *, timeout=None):
        """fn(executable) on every worker; the values in rank order. Elastic: an elastic
        run of fn(executable) (see run)."""
        if self.elastic:
            self._group()
            return self._run_elastic(lambda executable=None: fn(executable), callbacks)
        return self._group().execute(fn, callbacks=callbacks, timeout=timeout)

    def run(self, fn, args=None, kwargs=None, callbacks=None, *, timeout=None):
        """``fn(*args, **kwargs)`` on every worker; the values in rank order. Elastic: every
        process of every generation runs it; run ends when the job ends (a function
        returned on the ranks of the final generation, or all failed) and gives the
        final generation's values in rank order."""
        if self.elastic:
            self._group()
            args, kwargs = tuple(args or ()), dict(kwargs or {})
            return self._run_elastic(lambda executable=None: fn(*args, **kwargs), callbacks)
        return self._group().run(fn, args=args, kwargs=kwargs, callbacks=callbacks,
                                 timeout=timeout)

    def run_remote(self, fn, args=None, kwargs=None, *, callbacks=None, timeout=None):
        """``fn(*args, **kwargs)`` on every worker; one concurrent.futures.Future per rank
        (horovod.ray returns Ray ObjectRefs)."""
        if self.elastic:
            raise NotImplementedError("run_remote has no elastic form: an elastic job's "
                                      "workers come and go; use run()")
        return self._group().run_remote(fn, args=args, kwargs=kwargs, callbacks=callbacks,
                                        timeout=timeout)

    def execute_single(self, fn, *, timeout=None):
        """fn(executable) on rank 0."""
        if self.elastic:
            raise NotImplementedError("execute_single has no elastic form (rank 0 changes "
                                      "with the hosts); use execute()")
        return self._group().execute_single(fn, timeout=timeout)

    @property
    def ranks(self):
        """The rank table of a static group (rank, host, local and cross rank and size)."""
        if self.elastic:
            raise ExecutorError("an elastic job's ranks change with its hosts")
        group = self._group()
        if group is None:
            raise ExecutorError("the executor was shut down")
        return group.ranks

    def _run_elastic(self, fn, callbacks):
        p, w = self._params, self._where
        cls, cargs, ckwargs, env = self._start_args
        cooldown = p["cooldown_range"]
        run = ElasticExecutor(
            min_workers=p["min_workers"], max_workers=p["max_workers"],
            discovery_script=self._discovery(), reset_limit=p["reset_limit"],
            cooldown_range=tuple(cooldown) if cooldown is not None else None,
            elastic_timeout=p["elastic_timeout"], cluster_dir=w.get("cluster_dir"),
            insecure=bool(w.get("insecure")), start_timeout=self._start_timeout(),
            network_interface=self._nics(), cpus_per_worker=p["cpus_per_worker"],
            slots_per_host=w.get("slots_per_host"),
            discovery_interval=w.get("discovery_interval") or 1, use_gpu=p["use_gpu"],
            gpus_per_worker=p["gpus_per_worker"] if p["use_gpu"] else 0,
            python=self._python or sys.executable, caf_hvd=self._binary,
            extra_args=self._flags(), cluster=w.get("cluster"))
        self._elastic_runs.append(run)
        run.start(executable_cls=cls, executable_args=cargs, executable_kwargs=ckwargs,
                  extra_env_vars=env)
        try:
            return run.run(fn, callbacks=callbacks)
        finally:
            self._elastic_runs.remove(run)
