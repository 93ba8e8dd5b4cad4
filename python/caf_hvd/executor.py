"""Executor and ElasticExecutor: horovod.ray's RayExecutor and ElasticRayExecutor on
caf-hvd. The program that creates an executor starts one `caf-hvd run` (this machine)
or `caf-hvd driver` (node agents) with one end of a socketpair; the job's ranks run
`python -m caf_hvd.worker`, and calls, results and logs travel as frames through
caf-hvd, which never unpickles them."""

import atexit
import concurrent.futures
import json
import os
import queue
import shutil
import socket
import subprocess
import sys
import threading
import weakref

import cloudpickle

from caf_hvd import _frames

_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class WorkerError(Exception):
    """A call failed on a rank: the function raised there (exc_type and the remote
    traceback are set), or the rank's process died or was stopped (cause is set)."""

    def __init__(self, rank, host, exc_type=None, message="", remote_traceback="", cause=None):
        self.rank = rank
        self.host = host
        self.exc_type = exc_type
        self.message = message
        self.remote_traceback = remote_traceback
        self.cause = cause
        where = f"rank {rank}" + (f" on host {host}" if host else "")
        if exc_type:
            text = f"{where} raised {exc_type}: {message}"
            if remote_traceback:
                text += "\n\nremote traceback:\n" + remote_traceback.rstrip()
        else:
            text = f"{where}: {cause}"
        super().__init__(text)


class ExecutorError(RuntimeError):
    """The executor cannot take calls: not started, shut down, or its worker group failed."""


def _installed_bindir():
    """The bindir this copy of the package was installed with by `meson install` (a
    Debian package, a site's prefix), or None (a checkout, a pip install)."""
    try:
        from caf_hvd import _installed
    except ImportError:
        return None
    return _installed.BINDIR


def find_binary():
    """$CAF_HVD, else the caf-hvd installed with this package, else caf-hvd on PATH, else
    in /usr/local/bin or /usr/bin, else the project's build directory."""
    env = os.environ.get("CAF_HVD")
    if env:
        return env
    candidates = []
    bindir = _installed_bindir()
    if bindir:
        candidates.append(os.path.join(bindir, "caf-hvd"))
    found = shutil.which("caf-hvd")
    if found:
        candidates.append(found)
    # a pip-installed package with the binaries of a package or `meson install`, run
    # where PATH is short (services, cron)
    candidates += ["/usr/local/bin/caf-hvd", "/usr/bin/caf-hvd"]
    candidates += [os.path.join(os.path.dirname(_PACKAGE_PARENT), build, "apps", "caf-hvd")
                   for build in ("build", "build-test")]
    for path in candidates:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    raise ExecutorError("cannot find caf-hvd: set $CAF_HVD, put caf-hvd on PATH, install it "
                        "(the Debian package or meson install), or build the project "
                        "(scripts/setup.sh build)")


_live = weakref.WeakSet()


@atexit.register
def _shutdown_all():
    for ex in list(_live):
        try:
            ex.shutdown()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass


class _Job:
    """One caf-hvd process in executor mode and the frames to and from it."""

    def __init__(self, args, env, boot, callbacks=None):
        self.lock = threading.Lock()  # call ids and writes
        self.next_id = 1
        self.calls = {}  # id -> (futures by rank, callbacks)
        self.ranks = None  # the rank table (dicts), once every rank started
        self.ranks_event = threading.Event()
        self.ended = threading.Event()
        self.end_code = None
        self.end_cause = ""
        self.boot_results = {}
        self.boot_failures = {}
        self.elastic_callbacks = callbacks or []
        self.log_queue = queue.Queue()
        parent, child = socket.socketpair()
        self.sock = parent
        cmd = args[:1] + args[1:2] + ["--executor-fd", str(child.fileno())] + args[2:]
        try:
            self.proc = subprocess.Popen(cmd, pass_fds=[child.fileno()], env=env,
                                         stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
        except OSError as e:
            parent.close()
            raise ExecutorError(f"cannot start {args[0]}: {e}") from e
        finally:
            child.close()
        # caf-hvd's own messages (and the ranks' stderr lines) go on to this program's
        # stderr; its last words are kept for the errors raised here
        self.last_words = []
        self.stderr_pump = threading.Thread(target=self._pump_stderr, daemon=True)
        self.stderr_pump.start()
        self.reader = threading.Thread(target=self._read, name="caf-hvd-executor", daemon=True)
        self.reader.start()
        self.logger = threading.Thread(target=self._run_callbacks, name="caf-hvd-callbacks",
                                       daemon=True)
        self.logger.start()
        try:
            self._send(_frames.START, 0, 0, boot)
        except OSError:
            pass  # caf-hvd is gone already: the reader reports how it ended

    def _pump_stderr(self):
        out = getattr(sys.stderr, "buffer", None)
        for line in iter(self.proc.stderr.readline, b""):
            if out is not None:
                out.write(line)
                out.flush()
            else:
                sys.stderr.write(line.decode(errors="replace"))
            text = line.decode(errors="replace").rstrip()
            if text.startswith("caf-hvd") and "WARNING" not in text and ":" in text:
                self.last_words = (self.last_words + [text])[-5:]
            elif text.startswith("  ") and self.last_words:  # a message's detail lines
                self.last_words[-1] += " " + text.strip()
        self.proc.stderr.close()

    def said(self):
        """caf-hvd's last messages, for an error."""
        return "; ".join(self.last_words)

    # -- frames in ---------------------------------------------------------------------

    def _read(self):
        why = None
        frames = _frames.Reader(self.sock, 1 << 32)
        try:
            while True:
                f = frames.read()
                if f is None:
                    break
                self._on_frame(*f)
        except ConnectionResetError:
            pass  # caf-hvd is gone, as at EOF
        except (_frames.FrameError, OSError) as e:
            why = str(e)
        if not self.ended.is_set():
            try:
                code = self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                code = None
            self.stderr_pump.join(5)
            said = self.said()
            self._end(1, f"caf-hvd exited without reporting the job's end (exit code {code}"
                         + (f"; {why}" if why else "") + ")" + (f": {said}" if said else ""))
        self.log_queue.put(None)

    def host_of(self, rank):
        if self.ranks and 0 <= rank < len(self.ranks):
            return self.ranks[rank]["host"]
        return None

    def _on_frame(self, kind, ident, rank, _deadline, payload):
        if kind == _frames.RESULT:
            answer = cloudpickle.loads(payload)
            if ident == 0:
                self.boot_results[rank] = answer
                return
            self._settle(ident, rank, answer=answer)
        elif kind == _frames.FAILED:
            text = payload.decode(errors="replace")
            if ident == 0:
                self.boot_failures[rank] = text
                return
            self._settle(ident, rank, cause=text)
        elif kind == _frames.LOG:
            # The call's callbacks are taken now: its result (which follows its logs on the
            # same channel) may complete the call before the callback thread gets here.
            try:
                call, record = cloudpickle.loads(payload)
            except Exception as e:  # noqa: BLE001
                print(f"caf_hvd: a log record of rank {rank} cannot be read: {e}",
                      file=sys.stderr)
                return
            with self.lock:
                entry = self.calls.get(call)
                callbacks = list(entry[1]) if entry else []
            self.log_queue.put((rank, record, callbacks))
        elif kind == _frames.RANKS:
            table = json.loads(payload)
            self.ranks = table["ranks"]
            self.ranks_event.set()
        elif kind == _frames.END:
            self._end(ident, payload.decode(errors="replace"))

    def _settle(self, ident, rank, answer=None, cause=None):
        with self.lock:
            entry = self.calls.get(ident)
            if entry is None:
                return
            futures = entry[0]
            targets = list(futures) if rank == _frames.ALL_RANKS else [rank]
            done = []
            for r in targets:
                fut = futures.pop(r, None)
                if fut is not None:
                    done.append((r, fut))
            if not futures:
                del self.calls[ident]
        for r, fut in done:
            if answer is not None:
                if answer[0] == "ok":
                    fut.set_result(answer[1])
                else:
                    fut.set_exception(WorkerError(r, self.host_of(r), answer[1], answer[2],
                                                  answer[3]))
            else:
                fut.set_exception(WorkerError(r, self.host_of(r), cause=cause))

    def _end(self, code, cause):
        with self.lock:
            if self.ended.is_set():
                return
            self.end_code = code
            self.end_cause = cause
            pending = list(self.calls.items())
            self.calls.clear()
            self.ended.set()
        self.ranks_event.set()
        for _, (futures, _) in pending:
            for r, fut in futures.items():
                fut.set_exception(WorkerError(
                    r, self.host_of(r), cause=f"the worker group ended: {cause or 'shut down'}"))

    def _run_callbacks(self):
        while True:
            item = self.log_queue.get()
            if item is None:
                return
            rank, record, callbacks = item
            for cb in callbacks + list(self.elastic_callbacks):
                rec = dict(record)
                rec.setdefault("rank", rank)
                try:
                    cb(rec)
                except Exception as e:  # noqa: BLE001 - a callback must not stop the others
                    print(f"caf_hvd: callback {cb!r} raised {type(e).__name__}: {e}",
                          file=sys.stderr)

    # -- frames out --------------------------------------------------------------------

    def _send(self, kind, ident, rank, payload, deadline_ms=0):
        self.sock.sendall(_frames.encode(kind, ident, rank, payload, deadline_ms))

    def submit(self, payload, rank, callbacks=None, timeout=None):
        if self.ended.is_set():
            raise ExecutorError(f"the worker group has ended: {self.end_cause or 'shut down'}")
        deadline_ms = 0 if timeout is None else max(1, int(timeout * 1000))
        size = len(self.ranks)
        targets = range(size) if rank == _frames.ALL_RANKS else [rank]
        with self.lock:
            ident = self.next_id
            self.next_id += 1
            futures = {r: concurrent.futures.Future() for r in targets}
            self.calls[ident] = (futures, list(callbacks or []))
            try:
                self._send(_frames.CALL, ident, rank, payload, deadline_ms)
            except OSError as e:
                del self.calls[ident]
                raise ExecutorError(f"caf-hvd is gone ({e}); the worker group has ended") from e
        return [futures[r] for r in targets]

    def fail_host(self, name):
        """An elastic job kills the ranks on host `name` (a forceful removal): the job
        counts them as failed."""
        try:
            self._send(_frames.KILL_HOST, 0, 0, name.encode())
        except OSError:
            pass  # caf-hvd is gone: nothing runs there any more

    def shutdown(self, timeout):
        try:
            self._send(_frames.SHUTDOWN, 0, 0, b"")
        except OSError:
            pass
        self.ended.wait(timeout)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # its agents stop the ranks when the driver's link is gone
            self.proc.wait()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.reader.join(timeout)
        self.sock.close()
        self.logger.join(timeout)
        self.stderr_pump.join(timeout)


def _pickled(what, obj):
    try:
        return cloudpickle.dumps(obj)
    except Exception as e:
        raise TypeError(f"{what} cannot be pickled: {type(e).__name__}: {e}") from e


def installed_cluster():
    """HOST[:PORT] of the cluster this machine's installed node agent belongs to, or None:
    from /etc/default/caf-hvd-node (or the file $CAF_HVD_NODE_DEFAULTS names), as the
    caf-hvd command reads it: the agent it joins (CAF_HVD_NODE_JOIN), else the agent
    itself, which then holds the cluster's table (CAF_HVD_NODE_BIND or 127.0.0.1,
    CAF_HVD_NODE_PORT)."""
    path = os.environ.get("CAF_HVD_NODE_DEFAULTS") or "/etc/default/caf-hvd-node"
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    conf = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        conf[key.strip()] = value
    if conf.get("CAF_HVD_NODE_JOIN"):
        return conf["CAF_HVD_NODE_JOIN"]
    bind = conf.get("CAF_HVD_NODE_BIND") or ""
    host = "127.0.0.1" if bind in ("", "0.0.0.0") else bind
    port = conf.get("CAF_HVD_NODE_PORT")
    return f"{host}:{port}" if port else host


def default_cluster(cluster=None):
    """`cluster`, else $CAF_HVD_CLUSTER, else the installed agent's (installed_cluster)."""
    return cluster or os.environ.get("CAF_HVD_CLUSTER") or installed_cluster()


def _cluster(hosts, hostfile, cluster):
    """The cluster whose table places the ranks: `cluster` if given, else
    $CAF_HVD_CLUSTER, else the installed agent's, when no hosts are given (given hosts
    always win), as Ray's ray.init(address="auto") finds a running cluster."""
    if hosts or hostfile:
        return None
    return default_cluster(cluster)


def _common_args(*, hosts, hostfile, cluster_dir, insecure, start_timeout,
                 network_interface, verbose, extra_env_vars, cpus_per_worker, cluster=None):
    args = ["--start-timeout", str(start_timeout), "--quiet"]
    if verbose:
        args.append("--verbose")
    if hosts:
        args += ["-H", hosts if isinstance(hosts, str) else ",".join(hosts)]
    if hostfile:
        args += ["--hostfile", hostfile]
    if cluster:
        args += ["--cluster", cluster]
    if cluster_dir:
        args += ["--cluster-dir", cluster_dir]
    if insecure:
        args.append("--insecure")
    if network_interface:
        args += ["--network-interface", network_interface]
    env_vars = dict(extra_env_vars or {})
    if env_vars.get("PYTHONPATH"):
        # the ranks' own PYTHONPATH replaces the inherited one: caf_hvd must stay on it
        env_vars["PYTHONPATH"] = os.pathsep.join([_PACKAGE_PARENT, env_vars["PYTHONPATH"]])
    if cpus_per_worker:
        args += ["--cpus-per-slot", str(cpus_per_worker)]  # OMP_NUM_THREADS unless set
    for k, v in env_vars.items():
        args += ["--env", f"{k}={v}"]
    return args


def _process_env():
    env = dict(os.environ)
    # the ranks import caf_hvd and, like the caller, the script's own directory
    paths = [_PACKAGE_PARENT]
    if sys.path and sys.path[0]:
        paths.append(sys.path[0])
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


class Executor:
    """A group of persistent workers, one process per rank, each holding an instance of
    the executable class (horovod.ray.RayExecutor's API)."""

    def __init__(self, num_workers=None, num_hosts=None, num_workers_per_host=1,
                 cpus_per_worker=1, use_gpu=False, gpus_per_worker=None, hosts=None,
                 hostfile=None, cluster_dir=None, insecure=False, start_timeout=30,
                 network_interface=None, *, verbose=False, python=None, caf_hvd=None,
                 extra_args=(), cluster=None):
        gpus = gpus_per_worker if gpus_per_worker is not None else (1 if use_gpu else 0)
        if not isinstance(gpus, int) or gpus < 0:
            raise ValueError(f"gpus_per_worker must be a non-negative integer, not {gpus!r}")
        if num_workers is None:
            if num_hosts is None:
                raise ValueError("give num_workers, or num_hosts (with num_workers_per_host)")
            num_workers = num_hosts * num_workers_per_host
        if not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers must be a positive integer, not {num_workers!r}")
        if hosts and hostfile:
            raise ValueError("give hosts or hostfile, not both")
        if start_timeout <= 0:
            raise ValueError("start_timeout must be positive")
        self.num_workers = num_workers
        cluster = _cluster(hosts, hostfile, cluster)
        self._remote = bool(hosts or hostfile or cluster)
        self._opts = dict(hosts=hosts, hostfile=hostfile, cluster_dir=cluster_dir,
                          insecure=insecure, start_timeout=start_timeout,
                          network_interface=network_interface, verbose=verbose,
                          cluster=cluster)
        self._cpus = cpus_per_worker
        self._gpus = gpus
        self._start_timeout = start_timeout
        self._extra_args = list(extra_args)
        self._python = python or sys.executable
        self._binary = caf_hvd
        self._job = None
        self._shut = False

    # -- lifecycle ---------------------------------------------------------------------

    def start(self, executable_cls=None, executable_args=None, executable_kwargs=None,
              extra_env_vars=None):
        """Starts the workers; each builds ``executable_cls(*args, **kwargs)`` once it has its
        rank, rendezvous and network environment."""
        if self._job is not None or self._shut:
            raise ExecutorError("start() was called already; make a new Executor")
        boot = b""
        if executable_cls is not None:
            boot = _pickled("executable_cls and its arguments",
                            ("init", executable_cls, tuple(executable_args or ()),
                             dict(executable_kwargs or {})))
        binary = self._binary or find_binary()
        args = [binary, "driver" if self._remote else "run"]
        args += ["-np", str(self.num_workers)]
        args += _common_args(extra_env_vars=extra_env_vars, cpus_per_worker=self._cpus,
                             **self._opts)
        if self._gpus:
            args += ["--gpus-per-slot", str(self._gpus)]
        args += self._extra_args
        args += ["--", self._python, "-m", "caf_hvd.worker"]
        job = _Job(args, _process_env(), boot)
        self._job = job
        _live.add(self)
        # caf-hvd bounds the start by start_timeout; the margin covers its own start
        if not job.ranks_event.wait(self._start_timeout + 15) or job.ranks is None:
            cause = job.end_cause if job.ended.is_set() else \
                f"no rank table within {self._start_timeout + 15} s"
            self._abort()
            raise ExecutorError(f"the workers did not start: {cause}")
        if boot:
            self._wait_boot(executable_cls)

    def _wait_boot(self, cls):
        job = self._job
        while len(job.boot_results) + len(job.boot_failures) < self.num_workers:
            if job.ended.wait(0.01):
                break
        errors = []
        for r in range(self.num_workers):
            answer = job.boot_results.get(r)
            if answer is not None and answer[0] == "ok":
                continue
            if answer is not None:
                errors.append(WorkerError(r, job.host_of(r), answer[1], answer[2], answer[3]))
            else:
                errors.append(WorkerError(r, job.host_of(r), cause=job.boot_failures.get(
                    r, f"the worker group ended: {job.end_cause}")))
        if errors:
            self._abort()
            first = errors[0]
            raise ExecutorError(f"{cls.__name__}(...) failed on {len(errors)} of "
                                f"{self.num_workers} ranks; first: {first}") from first

    def _abort(self):
        if self._job:
            self._job.shutdown(10)
        self._shut = True
        _live.discard(self)

    def shutdown(self, timeout=30):
        """Stops every worker; nothing of the group is left running."""
        if self._job is None or self._shut:
            self._shut = True
            return
        self._shut = True
        _live.discard(self)
        self._job.shutdown(timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()
        return False

    # -- calls -------------------------------------------------------------------------

    def _usable(self):
        if self._shut:
            raise ExecutorError("the executor was shut down")
        if self._job is None:
            raise ExecutorError("the executor is not started; call start() first")
        return self._job

    @property
    def ranks(self):
        """The rank table: rank, host, local_rank, local_size, cross_rank, cross_size."""
        return list(self._usable().ranks)

    def _submit(self, message, rank=_frames.ALL_RANKS, callbacks=None, timeout=None):
        job = self._usable()
        payload = _pickled("the function or its arguments", message)
        return job.submit(payload, rank, callbacks, timeout)

    @staticmethod
    def _gather(futures):
        concurrent.futures.wait(futures)
        for f in futures:
            if f.exception() is not None:
                raise f.exception()
        return [f.result() for f in futures]

    def execute(self, fn, callbacks=None, timeout=None):
        """fn(executable) on every rank; the values in rank order."""
        return self._gather(self._submit(("execute", fn, (), {}), callbacks=callbacks,
                                         timeout=timeout))

    def execute_single(self, fn, timeout=None):
        """fn(executable) on rank 0."""
        return self._gather(self._submit(("execute", fn, (), {}), rank=0, timeout=timeout))[0]

    def run(self, fn, args=None, kwargs=None, callbacks=None, timeout=None):
        """``fn(*args, **kwargs)`` on every rank; the values in rank order."""
        return self._gather(self.run_remote(fn, args, kwargs, callbacks, timeout))

    def run_remote(self, fn, args=None, kwargs=None, callbacks=None, timeout=None):
        """``fn(*args, **kwargs)`` on every rank; one concurrent.futures.Future per rank."""
        return self._submit(("run", fn, tuple(args or ()), dict(kwargs or {})),
                            callbacks=callbacks, timeout=timeout)


class ElasticExecutor:
    """horovod.ray.ElasticRayExecutor on caf-hvd: hosts come from a discovery script, or
    from a cluster's table (its live nodes: `cluster`, else $CAF_HVD_CLUSTER); the worker
    function runs on every rank of each generation (with hvd.elastic's state handling
    inside it), and the values of the final generation's ranks are returned."""

    def __init__(self, min_workers=1, max_workers=None, discovery_script=None,
                 reset_limit=None, cooldown_range=None, elastic_timeout=600, cluster_dir=None,
                 insecure=False, start_timeout=30, network_interface=None, cpus_per_worker=1,
                 slots_per_host=None, discovery_interval=1, use_gpu=False, gpus_per_worker=None,
                 *, verbose=False, python=None, caf_hvd=None, extra_args=(), cluster=None):
        cluster = None if discovery_script else default_cluster(cluster)
        if not discovery_script and not cluster:
            raise ValueError("discovery_script is required: an executable that prints the "
                             "available hosts, one HOST:PORT:SLOTS per line (or a cluster "
                             "whose live nodes are the hosts: cluster=HOST[:PORT] or "
                             "CAF_HVD_CLUSTER)")
        if min_workers < 1:
            raise ValueError("min_workers must be at least 1")
        if max_workers is not None and max_workers < min_workers:
            raise ValueError(f"max_workers {max_workers} is below min_workers {min_workers}")
        where = ["--host-discovery-script", discovery_script] if discovery_script else \
            ["--cluster", cluster]
        self._flags = where + ["--min-np", str(min_workers),
                               "--elastic-timeout", str(elastic_timeout),
                               "--discovery-interval", str(discovery_interval)]
        if max_workers is not None:
            self._flags += ["--max-np", str(max_workers)]
        if reset_limit is not None:
            self._flags += ["--reset-limit", str(reset_limit)]
        if cooldown_range is not None:
            low, high = cooldown_range
            self._flags += ["--blacklist-cooldown-range", str(low), str(high)]
        if slots_per_host is not None:
            self._flags += ["--slots-per-host", str(slots_per_host)]
        gpus = gpus_per_worker if gpus_per_worker is not None else (1 if use_gpu else 0)
        if gpus:
            self._flags += ["--gpus-per-slot", str(gpus)]
        self._flags += list(extra_args)  # more caf-hvd flags (the RayExecutor's settings)
        self._opts = dict(hosts=None, hostfile=None, cluster_dir=cluster_dir, insecure=insecure,
                          start_timeout=start_timeout, network_interface=network_interface,
                          verbose=verbose)
        self._cpus = cpus_per_worker
        self._python = python or sys.executable
        self._binary = caf_hvd
        self._started = False
        self._executable = (None, (), {})
        self._env = {}
        self._job = None
        self._closed = False

    def start(self, executable_cls=None, executable_args=None, executable_kwargs=None,
              extra_env_vars=None):
        """Records what every rank builds before it runs the worker function (if a class
        is given, run's function is called with the instance)."""
        self._executable = (executable_cls, tuple(executable_args or ()),
                            dict(executable_kwargs or {}))
        self._env = dict(extra_env_vars or {})
        self._started = True

    def run(self, worker_fn, callbacks=None):
        """Runs the elastic job to its end; the final generation's values in rank order."""
        if not self._started:
            raise ExecutorError("call start() before run()")
        if self._job is not None:
            raise ExecutorError("run() was called already; make a new ElasticExecutor")
        boot = _pickled("the worker function", ("elastic", worker_fn, self._executable, {}))
        binary = self._binary or find_binary()
        args = [binary, "driver"] + self._flags
        args += _common_args(extra_env_vars=self._env, cpus_per_worker=self._cpus,
                             **self._opts)
        args += ["--", self._python, "-m", "caf_hvd.worker"]
        job = _Job(args, _process_env(), boot, callbacks)
        self._job = job
        _live.add(self)
        try:
            job.ended.wait()  # bounded by caf-hvd: elastic timeout, reset limit, failures
        finally:
            _live.discard(self)
            self.shutdown()
        if job.end_code != 0:
            raise ExecutorError(f"the elastic job failed (exit code {job.end_code}): "
                                f"{job.end_cause or 'no cause reported'}")
        values = []
        for r in range(len(job.ranks or [])):
            answer = job.boot_results.get(r)
            if answer is None:
                raise WorkerError(r, job.host_of(r), cause=job.boot_failures.get(r, "no value"))
            if answer[0] != "ok":
                raise WorkerError(r, job.host_of(r), answer[1], answer[2], answer[3])
            values.append(answer[1])
        return values

    def shutdown(self, timeout=30):
        """Stops the job if it still runs (run() does this when it returns or raises)."""
        if self._job is not None and not self._closed:
            self._closed = True
            self._job.shutdown(timeout)
