"""ElasticRayExecutor: horovod.ray 0.28.1's elastic executor, member for member, on
caf-hvd. Its settings come from `create_settings` (Horovod's ElasticSettings fields),
its hosts from a discovery object (`settings.discovery`, any object with
`find_available_hosts_and_slots() -> {name: slots}`, with `override_discovery=False`)
or from the cluster's live nodes (the default, as Ray's own nodes were), and `run`
runs a function on every worker of every generation, handing the callbacks every dict
the workers log.

The discovery object lives in this process. A thread here calls it every discovery
interval, as Horovod's driver does; `caf-hvd driver` reads the latest answer through a
small script (its --host-discovery-script) that asks this process over a private Unix
socket. A name the object returns is a node of the cluster by its name (as `caf-hvd
status` shows it) or an agent's HOST:PORT."""

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass

from caf_hvd.executor import ElasticExecutor, ExecutorError, default_cluster, find_binary

# How often the discovery object is called and the driver reads its answer (Horovod's
# horovod.runner.elastic.driver.DISCOVER_HOSTS_FREQUENCY_SECS; its tests set it to 0.1).
# Read when start() runs; create_settings(discovery_interval=...) overrides it.
DISCOVER_HOSTS_FREQUENCY_SECS = 1.0
# A call of the discovery object that has not returned after this long counts as a
# failed discovery (as a discovery script that is killed after 30 s).
DISCOVERY_CALL_TIMEOUT_SECS = 30.0

_HOROVOD_SETTINGS = ("num_proc", "verbose", "ssh_port", "ssh_identity_file", "extra_mpi_args",
                     "tcp_flag", "binding_args", "key", "start_timeout", "output_filename",
                     "run_func_mode", "nics", "elastic", "prefix_output_with_timestamp",
                     "cooldown_range")
_OWN_SETTINGS = ("discovery_interval", "cluster", "cluster_dir", "insecure", "caf_hvd",
                 "python", "extra_args")


class HostDiscovery:
    """The shape of a discovery object (Horovod's horovod.runner.elastic.discovery
    .HostDiscovery; a subclass of Horovod's own works as well)."""

    def find_available_hosts_and_slots(self):
        """Returns a dict mapping host name -> number of slots."""
        raise NotImplementedError()


class ElasticSettings:
    """What ElasticRayExecutor.create_settings returns: Horovod's ElasticSettings fields
    (set them afterwards as Horovod's users do: settings.discovery above all) and where
    the cluster is."""

    def __init__(self, discovery=None, min_num_proc=1, max_num_proc=None, elastic_timeout=600,
                 reset_limit=None, cooldown_range=None, num_proc=None, verbose=0,
                 ssh_port=None, ssh_identity_file=None, extra_mpi_args=None, tcp_flag=None,
                 binding_args=None, key=None, start_timeout=30, output_filename=None,
                 run_func_mode=None, nics=None, elastic=True, prefix_output_with_timestamp=False,
                 discovery_interval=None, cluster=None, cluster_dir=None, insecure=False,
                 caf_hvd=None, python=None, extra_args=()):
        self.discovery = discovery
        self.min_num_proc = min_num_proc
        self.max_num_proc = max_num_proc
        self.elastic_timeout = elastic_timeout
        self.reset_limit = reset_limit
        self.cooldown_range = cooldown_range
        self.num_proc = num_proc if num_proc is not None else min_num_proc
        self.verbose = verbose
        self.ssh_port = ssh_port
        self.ssh_identity_file = ssh_identity_file
        self.extra_mpi_args = extra_mpi_args
        self.tcp_flag = tcp_flag
        self.binding_args = binding_args
        self.key = key
        self.start_timeout = start_timeout  # seconds (Horovod keeps a Timeout object)
        self.output_filename = output_filename
        self.run_func_mode = run_func_mode
        self.nics = nics
        self.elastic = elastic
        self.prefix_output_with_timestamp = prefix_output_with_timestamp
        # caf-hvd's own: None reads DISCOVER_HOSTS_FREQUENCY_SECS when start() runs
        self.discovery_interval = discovery_interval
        self.cluster = cluster
        self.cluster_dir = cluster_dir
        self.insecure = insecure
        self.caf_hvd = caf_hvd
        self.python = python
        self.extra_args = tuple(extra_args)

    def __getstate__(self):  # as Horovod's: the discovery object is not sent anywhere
        state = self.__dict__.copy()
        state["discovery"] = None
        return state


def _cluster_nodes(binary, cluster, cluster_dir, timeout=10):
    """The cluster's nodes as `caf-hvd status --json` lists them."""
    args = [binary, "status", "--cluster", cluster, "--json"]
    if cluster_dir:
        args += ["--cluster-dir", cluster_dir]
    try:
        r = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"caf-hvd status --cluster {cluster} did not answer within "
                           f"{timeout} s") from None
    if r.returncode != 0:
        said = r.stderr.strip().splitlines()
        raise RuntimeError(f"caf-hvd status --cluster {cluster} failed: "
                           f"{said[-1] if said else 'exit code %d' % r.returncode}")
    return json.loads(r.stdout)["nodes"]


class RayHostDiscovery(HostDiscovery):
    """The cluster's live nodes and their slots, as horovod.ray's RayHostDiscovery counts
    a Ray node's resources: a node's slots (`caf-hvd node --slots`, else its processors)
    divided by cpus_per_slot, and with use_gpu at most its free GPUs divided by
    gpus_per_slot. The cluster is `cluster`, else $CAF_HVD_CLUSTER, else the installed
    agent's. Drained and draining nodes are left out."""

    def __init__(self, use_gpu=False, cpus_per_slot=1, gpus_per_slot=1, *, cluster=None,
                 cluster_dir=None, caf_hvd=None):
        self.use_gpu = use_gpu
        self.cpus_per_slot = cpus_per_slot
        self.gpus_per_slot = gpus_per_slot
        self.cluster = cluster
        self.cluster_dir = cluster_dir
        self.caf_hvd = caf_hvd

    def find_available_hosts_and_slots(self):
        cluster = default_cluster(self.cluster)
        if not cluster:
            raise RuntimeError("no cluster to list nodes from: give cluster=HOST[:PORT] or set "
                               "CAF_HVD_CLUSTER")
        mapping = {}
        for node in _cluster_nodes(self.caf_hvd or find_binary(), cluster, self.cluster_dir):
            if node.get("state") != "alive":
                continue
            slots = node.get("slots", 0) // max(1, self.cpus_per_slot)
            if self.use_gpu:
                slots = min(slots, node.get("gpus_free", 0) // max(1, self.gpus_per_slot))
            if slots:
                mapping[node["name"]] = int(slots)
        return mapping


class TestDiscovery(RayHostDiscovery):
    """horovod.ray's host churn for trying elasticity: every change_frequency_s, one of
    the cluster's nodes leaves the listing or one that left comes back, keeping between
    min_hosts and max_hosts. Graceful removal (the default) leaves a host out of the
    listing (its ranks end at their next commit); forceful (_graceful=False) also makes
    the running job count the host as failed at once: its ranks are killed and the host
    is blacklisted, as a node that dies (Horovod kills a Ray node)."""

    __test__ = False  # not a pytest test class

    def __init__(self, min_hosts, max_hosts, change_frequency_s, use_gpu=False, cpus_per_slot=1,
                 gpus_per_slot=1, verbose=True, _graceful=True, **where):
        super().__init__(use_gpu=use_gpu, cpus_per_slot=cpus_per_slot,
                         gpus_per_slot=gpus_per_slot, **where)
        self._min_hosts = min_hosts
        self._graceful = _graceful
        self._max_hosts = max_hosts
        self._change_frequency_s = change_frequency_s
        self._last_reset_t = None
        self.verbose = verbose
        self._removed_hosts = set()
        self.executor = None  # set by ElasticRayExecutor: forceful removal goes through it

    def add_host(self, hosts):
        available = self._removed_hosts & hosts.keys()
        if available:
            self._removed_hosts.remove(random.choice(sorted(available)))
        else:
            print("No hosts to add.")

    def remove_host(self, hosts):
        good = sorted(k for k in hosts if k not in self._removed_hosts)
        if not good:
            return
        host = random.choice(good)
        if not self._graceful and self.executor is not None:
            self.executor._fail_host(host)
        self._removed_hosts.add(host)

    def change_hosts(self, hosts):
        self._removed_hosts &= set(hosts)
        current = len(hosts) - len(self._removed_hosts)
        if current <= self._min_hosts:
            self.add_host(hosts)
        elif current >= self._max_hosts:
            self.remove_host(hosts)
        elif random.random() < 0.5:
            self.add_host(hosts)
        else:
            self.remove_host(hosts)

    def find_available_hosts_and_slots(self):
        t = time.time()
        if self._last_reset_t is None:
            self._last_reset_t = t
        hosts = super().find_available_hosts_and_slots()
        if t - self._last_reset_t >= self._change_frequency_s:
            self.change_hosts(hosts)
            self._last_reset_t = t
        if self.verbose:
            print(f"Total hosts: {len(hosts)}")
        remaining = {k: v for k, v in hosts.items() if k not in self._removed_hosts}
        if self.verbose:
            print(f"Remaining hosts: {len(remaining)} -- {remaining}")
        return remaining


@dataclass
class SlotInfo:
    """Horovod's SlotInfo: where a rank of the current generation runs (hostname "" for
    none)."""
    hostname: str = ""
    rank: int = -1
    local_rank: int = -1
    cross_rank: int = -1
    size: int = -1
    local_size: int = -1
    cross_size: int = -1


class _DriverView:
    """The parts of Horovod's ElasticDriver that discovery objects look at
    (`executor.driver`): a host's slot is assigned once the job runs and the driver has
    it in its plan (listed, within max_num_proc), and its worker has registered once the
    generation holding it was released (every rank of it reached the rendezvous)."""

    def __init__(self, executor):
        self._ex = executor

    def _released(self):
        job = self._ex._elastic._job if self._ex._elastic is not None else None
        return list(job.ranks or []) if job is not None else []

    def get_slot_info(self, host, local_rank):
        ranks = self._released()
        for row in ranks:
            if self._ex._same_host(row["host"], host) and row["local_rank"] == local_rank:
                return SlotInfo(host, row["rank"], row["local_rank"], row["cross_rank"],
                                len(ranks), row["local_size"], row["cross_size"])
        if self._ex._running and local_rank < self._ex._planned().get(host, 0):
            return SlotInfo(hostname=host, local_rank=local_rank)
        return SlotInfo()

    def get_worker_client(self, slot):
        if not slot.hostname:
            return None
        for row in self._released():
            if self._ex._same_host(row["host"], slot.hostname) and \
                    row["local_rank"] == slot.local_rank:
                return (row["host"], row["local_rank"])
        return None


class _Discovery:
    """Calls the discovery object every interval in a thread and serves its latest answer
    (as discovery script lines, names resolved) on a private Unix socket."""

    def __init__(self, executor, obj, interval):
        self.ex = executor
        self.obj = obj
        self.interval = interval
        self.cond = threading.Condition()
        self.latest = None  # the last mapping returned, names as the object gave them
        self.error = None  # why the last call failed (None: it returned)
        self.calls = 0
        self.call_started = None  # monotonic time of the call in progress
        self.stopped = False
        self.warned = set()
        self.dir = tempfile.mkdtemp(prefix="caf-hvd-discovery-")  # 0700: this user only
        self.path = os.path.join(self.dir, "s")
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(self.path)
        self.server.listen(16)
        self.script = os.path.join(self.dir, "discover")
        with open(self.script, "w") as f:
            f.write(f"#!{sys.executable} -S\n" + _SHIM.format(path=repr(self.path)))
        os.chmod(self.script, 0o700)
        self.caller = threading.Thread(target=self._loop, name="caf-hvd-discovery", daemon=True)
        self.serve = threading.Thread(target=self._serve, name="caf-hvd-discovery-server",
                                      daemon=True)
        self.caller.start()
        self.serve.start()

    def name(self):
        return f"{type(self.obj).__name__}.find_available_hosts_and_slots()"

    def _loop(self):
        while True:
            with self.cond:
                if self.stopped:
                    return
                self.call_started = time.monotonic()
            try:
                got = self.obj.find_available_hosts_and_slots()
                got = _checked_mapping(got)
                error = None
            except BaseException as e:  # noqa: BLE001 - the user's code: reported, retried
                got, error = None, f"{type(e).__name__}: {e}"
            with self.cond:
                self.call_started = None
                self.calls += 1
                if error is None:
                    self.latest, self.error = got, None
                else:
                    self.error = error
                self.cond.notify_all()
                if self.stopped:
                    return
            if error is not None:
                print(f"caf_hvd: warning: {self.name()} raised {error} (trying again in "
                      f"{self.interval} s)", file=sys.stderr, flush=True)
            with self.cond:
                self.cond.wait_for(lambda: self.stopped, timeout=self.interval)

    def answer(self):
        """('ok', lines) or ('err', why), for the driver's discovery script."""
        with self.cond:
            started, error, latest, calls = self.call_started, self.error, self.latest, self.calls
        if started is not None and time.monotonic() - started > DISCOVERY_CALL_TIMEOUT_SECS:
            return "err", (f"{self.name()} has not returned for "
                           f"{time.monotonic() - started:.0f} s (it is still running here)")
        if error is not None:
            return "err", f"{self.name()} raised {error}"
        if calls == 0 or latest is None:
            return "err", f"{self.name()} has not answered yet"
        return "ok", "".join(f"{line}\n" for line in self.ex._lines(latest))

    def _serve(self):
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                try:
                    status, text = self.answer()
                    conn.sendall(f"{status}\n{text}".encode())
                except Exception as e:  # noqa: BLE001 - one broken answer, not the server
                    try:
                        conn.sendall(f"err\nthe executor could not answer: {e}".encode())
                    except OSError:
                        pass

    def wait_for_slots(self, num_proc, min_hosts, timeout):
        """Blocks until the latest answer has num_proc slots on min_hosts hosts; says what
        it waits for; raises at the deadline or when the first call fails."""
        deadline = time.monotonic() + timeout
        said_at = None
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self.calls > 0 or self.stopped,
                                   timeout=max(0.0, deadline - time.monotonic()))
                calls, latest, error = self.calls, self.latest, self.error
                started = self.call_started
            if calls == 0:
                raise RuntimeError(f"{self.name()} did not answer within {timeout} s")
            if latest is None and error is not None:
                raise RuntimeError(f"{self.name()} failed on its first call: {error}")
            usable = self.ex._usable(latest or {})
            slots = sum(usable.values())
            if slots >= num_proc and len(usable) >= min_hosts:
                return usable
            now = time.monotonic()
            if started is not None and now - started > DISCOVERY_CALL_TIMEOUT_SECS:
                raise RuntimeError(f"{self.name()} has not returned for {now - started:.0f} s")
            if now >= deadline:
                raise RuntimeError(
                    f"timed out after {timeout} s (elastic_timeout) waiting for {num_proc} "
                    f"slots on at least {min_hosts} host(s): {self.name()} lists "
                    f"{_listing(usable)}")
            if said_at is None or now - said_at >= 10:
                said_at = now
                print(f"caf_hvd: waiting for {num_proc} slots (min_num_proc) on at least "
                      f"{min_hosts} host(s), {deadline - now:.0f} s left of elastic_timeout: "
                      f"{self.name()} lists {_listing(usable)}", file=sys.stderr, flush=True)
            with self.cond:
                seen = self.calls
                self.cond.wait_for(lambda: self.calls > seen or self.stopped,
                                   timeout=max(0.0, min(deadline - time.monotonic(), 1.0)))

    def stop(self):
        with self.cond:
            self.stopped = True
            self.cond.notify_all()
        try:
            self.server.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.server.close()
        self.serve.join(5)
        shutil.rmtree(self.dir, ignore_errors=True)


_SHIM = """# caf-hvd's discovery script for an ElasticRayExecutor: asks its process for the
# latest answer of the discovery object.
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(20)
try:
    s.connect({path})
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
except OSError as e:
    sys.stderr.write("the ElasticRayExecutor's process cannot be asked: %s\\n" % e)
    sys.exit(1)
status, _, text = data.decode().partition("\\n")
if status == "ok":
    sys.stdout.write(text)
    sys.exit(0)
sys.stderr.write(text + "\\n")
sys.exit(1)
"""


def _checked_mapping(got):
    if not isinstance(got, dict):
        raise TypeError(f"it returned {type(got).__name__}, not a dict of host name -> slots")
    for host, slots in got.items():
        if not isinstance(host, str) or not host or any(c.isspace() for c in host):
            raise ValueError(f"host name {host!r} is not a name")
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 0:
            raise ValueError(f"host {host!r} has {slots!r} slots, not a whole number >= 0")
    return dict(got)


def _listing(mapping):
    if not mapping:
        return "no host"
    return ", ".join(f"{h}:{s}" for h, s in mapping.items())


class ElasticRayExecutor:
    """horovod.ray.ElasticRayExecutor on caf-hvd (the guide's executors page says how each
    member behaves here).

        settings = ElasticRayExecutor.create_settings(min_num_proc=1, max_num_proc=4)
        settings.discovery = MyDiscovery()     # with override_discovery=False
        executor = ElasticRayExecutor(settings, cpus_per_slot=1, override_discovery=False)
        executor.start()
        results = executor.run(train_fn, callbacks=[print])
    """

    @staticmethod
    def create_settings(min_num_proc=1, max_num_proc=None, reset_limit=None, elastic_timeout=600,
                        timeout_s=30, ssh_identity_file=None, nics=None, min_np=None,
                        max_np=None, **kwargs):
        """Horovod's settings for an elastic job: min_num_proc (training waits below it),
        max_num_proc (no more processes beyond it), reset_limit (resets before the job
        fails), elastic_timeout (seconds to wait for min_num_proc slots), timeout_s (the
        start timeout), nics (the interfaces between hosts), ssh_identity_file (kept;
        agents need no ssh). min_np/max_np are the deprecated names. Among kwargs,
        Horovod's (verbose, cooldown_range, ...) and caf-hvd's: discovery_interval
        (seconds; default DISCOVER_HOSTS_FREQUENCY_SECS), cluster (HOST[:PORT], default
        $CAF_HVD_CLUSTER), cluster_dir, insecure, caf_hvd, python, extra_args."""
        if min_np is not None:
            min_num_proc = min_np
            warnings.warn('min_np is deprecated, use min_num_proc instead', DeprecationWarning)
        if max_np is not None:
            max_num_proc = max_np
            warnings.warn('max_np is deprecated, use max_num_proc instead', DeprecationWarning)
        unknown = sorted(set(kwargs) - set(_HOROVOD_SETTINGS) - set(_OWN_SETTINGS))
        if unknown:
            raise TypeError(f"create_settings() got unexpected keyword argument(s) {unknown}: "
                            f"it takes Horovod's {list(_HOROVOD_SETTINGS)} and caf-hvd's "
                            f"{list(_OWN_SETTINGS)}")
        for name in ("num_proc", "elastic"):
            kwargs.pop(name, None)  # set here, as Horovod does
        if not isinstance(min_num_proc, int) or min_num_proc < 1:
            raise ValueError(f"min_num_proc must be a whole number >= 1, not {min_num_proc!r}")
        if max_num_proc is not None and (not isinstance(max_num_proc, int)
                                         or max_num_proc < min_num_proc):
            raise ValueError(f"max_num_proc {max_num_proc!r} is below min_num_proc "
                             f"{min_num_proc}")
        if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
            raise ValueError(f"timeout_s must be a positive number of seconds, not {timeout_s!r}")
        if not (isinstance(elastic_timeout, (int, float)) and elastic_timeout > 0):
            raise ValueError(f"elastic_timeout must be a positive number of seconds, not "
                             f"{elastic_timeout!r}")
        ssh_identity_file = ssh_identity_file or os.path.expanduser("~/ray_bootstrap_key.pem")
        return ElasticSettings(discovery=None, min_num_proc=min_num_proc,
                               max_num_proc=max_num_proc, elastic_timeout=elastic_timeout,
                               reset_limit=reset_limit, num_proc=min_num_proc,
                               ssh_identity_file=ssh_identity_file, nics=nics,
                               start_timeout=timeout_s, key=None, **kwargs)

    def __init__(self, settings, use_gpu=False, cpus_per_slot=1, gpus_per_slot=None,
                 env_vars=None, override_discovery=True):
        if gpus_per_slot and not use_gpu:
            raise ValueError("gpus_per_slot is set, but use_gpu is False. "
                             "use_gpu must be True if gpus_per_slot is set. ")
        gpus_per_slot = gpus_per_slot or int(use_gpu)
        if use_gpu and gpus_per_slot < 1:
            raise ValueError(f"gpus_per_slot must be >= 1: Got {gpus_per_slot}.")
        if settings is None:
            raise TypeError("settings is required: ElasticRayExecutor.create_settings(...)")
        self._cluster = default_cluster(getattr(settings, "cluster", None))
        if override_discovery:
            settings.discovery = RayHostDiscovery(
                use_gpu=use_gpu, cpus_per_slot=cpus_per_slot, gpus_per_slot=gpus_per_slot,
                cluster=self._cluster, cluster_dir=getattr(settings, "cluster_dir", None),
                caf_hvd=getattr(settings, "caf_hvd", None))
        elif getattr(settings, "discovery", None) is None or not callable(
                getattr(settings.discovery, "find_available_hosts_and_slots", None)):
            raise ValueError("override_discovery=False needs settings.discovery: an object "
                             "with find_available_hosts_and_slots() -> {host: slots}")
        self.cpus_per_slot = cpus_per_slot
        self.gpus_per_slot = gpus_per_slot
        self.use_gpu = use_gpu
        self.settings = settings
        self.override_discovery = override_discovery
        self.env_vars = env_vars or {}
        self.driver = None  # set by start(): what Horovod's driver shows discovery objects
        self.rendezvous = None  # the job's own (its driver serves it once run() starts it)
        self._discovery = None
        self._elastic = None
        self._running = False
        self._nodes = None  # name -> (address, port), the cluster's nodes as last listed
        self._nodes_at = 0.0
        self._binary = getattr(settings, "caf_hvd", None)
        if isinstance(settings.discovery, TestDiscovery):
            settings.discovery.executor = self

    # -- hosts ---------------------------------------------------------------------------

    def _interval(self):
        value = getattr(self.settings, "discovery_interval", None)
        return float(value if value is not None else DISCOVER_HOSTS_FREQUENCY_SECS)

    def _node_table(self, refresh=False):
        if not self._cluster:
            return {}
        now = time.monotonic()
        if self._nodes is None or (refresh and now - self._nodes_at >= 2.0):
            self._nodes_at = now
            try:
                nodes = _cluster_nodes(self._binary or find_binary(), self._cluster,
                                       getattr(self.settings, "cluster_dir", None))
                self._nodes = {n["name"]: (n["address"], n["port"]) for n in nodes}
            except Exception as e:  # noqa: BLE001 - said; names stay unknown until it answers
                print(f"caf_hvd: warning: cannot list the cluster's nodes to resolve the "
                      f"discovery object's names: {e}", file=sys.stderr, flush=True)
                if self._nodes is None:
                    return {}
        return self._nodes

    def _where(self, name):
        """HOST:PORT of the agent a discovery name means, or None (said once)."""
        if ":" in name:
            return name  # an agent's HOST:PORT
        nodes = self._node_table()
        if name not in nodes:
            nodes = self._node_table(refresh=True)
        if name in nodes:
            return "%s:%d" % nodes[name]
        if not self._cluster:
            return name  # a host name: the agent on the default port
        if name not in self._discovery.warned:
            self._discovery.warned.add(name)
            print(f"caf_hvd: warning: {self._discovery.name()} lists host {name!r}, which is "
                  f"no node of the cluster at {self._cluster} (its nodes: "
                  f"{', '.join(sorted(nodes)) or 'none'}) and not an agent's HOST:PORT; "
                  f"it is left out", file=sys.stderr, flush=True)
        return None

    def _usable(self, mapping):
        return {h: s for h, s in mapping.items() if s > 0 and self._where(h) is not None}

    def _lines(self, mapping):
        out = []
        for host, slots in mapping.items():
            where = self._where(host) if slots > 0 else None
            if where is not None:
                out.append(f"{where}:{slots}")  # HOST:PORT:SLOTS, or Horovod's HOST:SLOTS
        return out

    def _planned(self):
        """Host -> slots the driver plans on: the latest listing, in order, up to
        max_num_proc."""
        d = self._discovery
        if d is None:
            return {}
        with d.cond:
            latest = dict(d.latest or {})
        cap = self.settings.max_num_proc
        out, total = {}, 0
        for host, slots in self._usable(latest).items():
            if cap is not None:
                slots = min(slots, cap - total)
            if slots <= 0:
                break
            out[host] = slots
            total += slots
        return out

    def _same_host(self, row_host, name):
        if row_host == name:
            return True
        where = self._where(name) if ":" in name else None
        nodes = self._nodes or {}
        return where is not None and "%s:%d" % nodes.get(row_host, ("", 0)) == where

    def _fail_host(self, name):
        """A forceful removal (TestDiscovery(_graceful=False)): the running job counts the
        host as failed (its ranks are killed, the host is blacklisted)."""
        if self._elastic is not None and self._elastic._job is not None:
            self._elastic._job.fail_host(name)

    # -- Horovod's members ---------------------------------------------------------------

    def start(self):
        """Starts discovery (the object is called every interval from now on) and waits
        until it lists num_proc slots on at least one host, saying what it waits for
        (elastic_timeout bounds the wait). The job's rendezvous server, NIC detection and
        the workers' environment come with run(), when `caf-hvd driver` starts."""
        if self._discovery is not None:
            raise ExecutorError("start() was called already")
        self.driver = _DriverView(self)  # before the first call: the object may look at it
        self._discovery = _Discovery(self, self.settings.discovery, self._interval())
        try:
            self._discovery.wait_for_slots(self.settings.num_proc, 1,
                                           self.settings.elastic_timeout)
        except Exception:
            self._discovery.stop()
            self._discovery = None
            raise

    def run(self, worker_fn, callbacks=None):
        """Runs worker_fn on every worker of every generation (hvd.elastic's state handling
        inside it); every dict a worker logs (caf_hvd.ray_logger.log) reaches each
        callback, in the order that worker logged them. Returns the final generation's
        values in rank order; raises RuntimeError (ExecutorError) when the job fails."""
        if self._discovery is None:
            raise ExecutorError("call start() before run()")
        if self._elastic is not None:
            raise ExecutorError("run() was called already; make a new ElasticRayExecutor")
        s = self.settings
        nics = getattr(s, "nics", None)
        if isinstance(nics, str):
            nics = [n for n in nics.split(",") if n]
        where = {}
        if self.override_discovery and self._cluster:
            # the cluster's table answers the driver itself (holds, drains, labels)
            where["cluster"] = self._cluster
            self._discovery.stop()
        else:
            where["discovery_script"] = self._discovery.script
        self._elastic = ElasticExecutor(
            min_workers=s.min_num_proc, max_workers=s.max_num_proc, reset_limit=s.reset_limit,
            cooldown_range=getattr(s, "cooldown_range", None), elastic_timeout=s.elastic_timeout,
            cluster_dir=getattr(s, "cluster_dir", None), insecure=getattr(s, "insecure", False),
            start_timeout=getattr(s, "start_timeout", 30) or 30,
            network_interface=",".join(sorted(nics)) if nics else None,
            cpus_per_worker=self.cpus_per_slot, discovery_interval=self._interval(),
            use_gpu=self.use_gpu, gpus_per_worker=self.gpus_per_slot if self.use_gpu else None,
            verbose=bool(getattr(s, "verbose", 0)) and getattr(s, "verbose", 0) >= 2,
            python=getattr(s, "python", None), caf_hvd=self._binary,
            extra_args=tuple(getattr(s, "extra_args", ()) or ()), **where)
        env = {"PYTHONUNBUFFERED": "1"}
        env.update({str(k): str(v) for k, v in self.env_vars.items()})
        self._elastic.start(extra_env_vars=env)
        self._running = True
        try:
            return self._elastic.run(worker_fn, callbacks=list(callbacks or []))
        finally:
            self._running = False
            self._discovery.stop()
