"""Real processes for cluster tests: node agents on loopback, each its own host, and a
driver. Everything started here is killed and reaped on cleanup, also on failure."""

import atexit
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import time

CAF_HVD = os.environ.get("CAF_HVD", "caf-hvd")


def make_cluster(path):
    """Creates a cluster's credentials in `path` with `caf-hvd cluster init`."""
    r = subprocess.run([CAF_HVD, "cluster", "init", path], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"caf-hvd cluster init failed: {r.stderr}")
    return path


# Every node agent and driver the tests start uses the same, test-only cluster: tests
# run with mutual TLS, as users do by default.
_CLUSTER_TMP = tempfile.mkdtemp(prefix="caf-hvd-test-")
atexit.register(shutil.rmtree, _CLUSTER_TMP, True)
os.environ["CAF_HVD_CLUSTER_DIR"] = make_cluster(os.path.join(_CLUSTER_TMP, "cluster"))
# A node agent installed on this machine (/etc/default/caf-hvd-node) names no cluster for
# the tests' drivers; a test that wants one writes its own file.
os.environ["CAF_HVD_NODE_DEFAULTS"] = os.path.join(_CLUSTER_TMP, "no-installed-agent")
os.environ.pop("CAF_HVD_CLUSTER", None)
# The tests run as root with throw-away driver certificates named like no account: their
# agents run ranks as their own user (the isolation suite starts its own agents with
# --rank-user owner).
os.environ["CAF_HVD_RANK_USER"] = "agent"


def issue(role, name):
    """The credentials directory of a certificate of `role` (node, driver, admin) named
    `name` in the tests' cluster, issued on first use."""
    cluster = os.environ["CAF_HVD_CLUSTER_DIR"]
    out = os.path.join(cluster, "issued", name)
    if not os.path.exists(os.path.join(out, f"{role}.pem")):
        subprocess.run([CAF_HVD, "cluster", f"add-{role}", name, cluster], check=True,
                       capture_output=True)
    return out


_horovod_site = None


def horovod_site():
    """The site dir of the cached real Horovod build (scripts/setup-horovod.sh builds it
    once, outside the checkout); its failure fails the caller with the script's output."""
    global _horovod_site
    if _horovod_site is None:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        r = subprocess.run([os.path.join(root, "scripts", "setup-horovod.sh")],
                           capture_output=True, text=True)
        lines = r.stdout.strip().splitlines()
        if r.returncode != 0 or not lines or not os.path.isdir(lines[-1]):
            raise AssertionError(f"scripts/setup-horovod.sh failed (exit {r.returncode}):\n"
                                 f"{r.stderr[-3000:]}")
        _horovod_site = lines[-1]
    return _horovod_site


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pids_matching(pattern, prefix=False):
    """Pids of processes whose command line contains (or, with prefix, starts with)
    `pattern`."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        hit = cmd.startswith(pattern) if prefix else pattern in cmd
        if hit and int(entry) != os.getpid():
            out.append(int(entry))
    return out


def command_ran(path):
    """Whether a command that writes `path` (and names it on its command line) ran or is
    running. A rank starts with posix_spawn, which returns after the exec: once a launch
    has been handled, its process is either alive with `path` in its command line or has
    written the file. So this needs no grace period, only the handling as its event."""
    return bool(pids_matching(path)) or os.path.exists(path)


def pid_with_env(pattern, prefix=False, **env):
    """A pid among pids_matching(pattern, prefix) whose environment has every KEY=VALUE of
    `env`, or None."""
    want = {k.encode(): str(v).encode() for k, v in env.items()}
    for pid in pids_matching(pattern, prefix):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                have = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        if all(have.get(k) == v for k, v in want.items()):
            return pid
    return None


def pids_with_env_entry(key, value):
    """Pids of this machine's processes (not this one) whose environment has KEY=value:
    how a suite finds every process it started, wherever they ran from."""
    want = f"{key}={value}".encode()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if want in f.read().split(b"\0"):
                    out.append(int(entry))
        except OSError:
            continue
    return out


def raw_http(server, method, path, body=b"", host="x"):
    """(status, body) of one HTTP request to `server` ((address, port)), sent as raw bytes
    so that a path may hold any byte; the connection closes after the answer."""
    if isinstance(path, str):
        path = path.encode()
    with socket.create_connection(server, timeout=5) as s:
        s.sendall(f"{method} ".encode() + path + f" HTTP/1.1\r\nHost: {host}\r\n"
                  "Connection: close\r\nContent-Length: ".encode() + str(len(body)).encode()
                  + b"\r\n\r\n" + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), rest


def rendezvous_of(pid):
    """(address, port) of a rank's rendezvous server, from its environment."""
    with open(f"/proc/{pid}/environ", "rb") as f:
        env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
    return (env[b"HOROVOD_GLOO_RENDEZVOUS_ADDR"].decode(),
            int(env[b"HOROVOD_GLOO_RENDEZVOUS_PORT"]))


def none_left_with(key, value, timeout):
    """A test's closing check: waits up to `timeout` s until no process carries KEY=VALUE
    in its environment (the test's tag); kills those left, and then fails."""
    try:
        wait_until(lambda: not pids_with_env_entry(key, value), timeout,
                   "no process of the test left")
    finally:
        for pid in pids_with_env_entry(key, value):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def leftover_ranks():
    """A suite's closing check: rank shims (caf-hvd-exec) of this suite's agents still
    running (found by the suite's CAF_HVD_CLUSTER_DIR, which agents pass to their ranks,
    so another suite's or user's processes on the machine do not count), or None."""
    ours = set(pids_with_env_entry("CAF_HVD_CLUSTER_DIR", os.environ["CAF_HVD_CLUSTER_DIR"]))
    left = [p for p in pids_matching("caf-hvd-exec") if p in ours]
    return f"leftover rank processes: {describe_pids(left)}" if left else None


def describe_pids(pids):
    """"PID: command line" for each pid still there (for failure messages)."""
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            out.append(f"{pid}: {cmd}")
        except OSError:
            pass
    return out


def read_line(fd, deadline):
    """One line of the pipe `fd`, read a byte at a time so that nothing past it is taken
    from the pipe (p.communicate() later reads the descriptor, not what a reader of
    p.stdout buffered, and would miss such lines); "" at EOF or at the deadline (with the
    part read so far, if any)."""
    line = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return line.decode(errors="replace")
        byte = os.read(fd, 1)
        line += byte
        if not byte or byte == b"\n":
            return line.decode(errors="replace")


def wait_until(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class Cluster:
    """Starts node agents and drivers; `close()` kills all of them and their ranks."""

    def __init__(self):
        self.procs = []
        self.nodes = {}

    def node(self, name, slots=None, extra=()):
        port = free_port()
        args = [CAF_HVD, "node", "--port", str(port), "--name", name, "--bind", "127.0.0.1"]
        if slots is not None:
            args += ["--slots", str(slots)]
        args += list(extra)
        p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True, text=True)
        self.procs.append(p)
        line = p.stdout.readline()
        if "WARNING: --insecure" in line:  # said first by an agent without TLS
            line = p.stdout.readline()
        if "listening" not in line:
            raise AssertionError(f"node {name} did not start: {line!r}")
        # then, always, whose account its ranks run as (the tests read what follows)
        said = p.stdout.readline()
        if "ranks run as" not in said:
            raise AssertionError(f"node {name} did not say whose account ranks run as: {said!r}")
        self.nodes[name] = (p, port)
        return port

    def spec(self, name, slots):
        return f"127.0.0.1:{self.nodes[name][1]}:{slots}"

    def start(self, args, **kw):
        p = subprocess.Popen([CAF_HVD] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             start_new_session=True, text=True, **kw)
        self.procs.append(p)
        return p

    def run(self, args, timeout=60, **kw):
        p = self.start(args, **kw)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            raise AssertionError(f"caf-hvd {' '.join(args)} did not finish in {timeout}s:\n{err}")
        return p.returncode, out, err

    def close(self):
        reap(self.procs)


def reap(procs):
    """Kills every process group in `procs` that still runs, waits for all, closes pipes."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for s in (p.stdout, p.stderr):
            if s:
                s.close()
    procs.clear()


# Why a test may skip on a CI machine (CI=true) after the project's own set-up: what the
# machine or its network is, never what the set-up should have installed or given (root,
# torch, ssh, Slurm, Chromium): such a skip fails the run there instead of passing it.
CI_MAY_SKIP = (
    re.compile(r"is taken on this machine"),           # a fixed port another program holds
    re.compile(r"the hard descriptor limit is"),       # nothing to raise on this kernel
    re.compile(r"no Debian mirror could be reached"),  # the network, not the set-up
    re.compile(r"no systemd on this machine"),
)


def run_suite(case, argv, extra_check=None):
    """Runs the tests of `case` (those whose id contains an argument, if any), prints the
    closing 'N passed, N failed, N skipped' line and returns the process exit code.
    `extra_check` may return a problem found after the tests (counted as a failure).
    With CI=true in the environment, a skip for a reason outside CI_MAY_SKIP fails."""
    import unittest
    runner = unittest.TextTestRunner(verbosity=2)
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(case)
    if argv:
        suite = unittest.TestSuite(t for t in suite if any(a in t.id() for a in argv))
    result = runner.run(suite)
    failed = len(result.failures) + len(result.errors)
    passed = result.testsRun - failed - len(result.skipped)
    print(f"{passed} passed, {failed} failed, {len(result.skipped)} skipped")
    for test, why in result.skipped:
        print(f"  skipped {test.id()}: {why}")
    if os.environ.get("CI") == "true":
        wrong = [(t, why) for t, why in result.skipped
                 if not any(p.search(why) for p in CI_MAY_SKIP)]
        for test, why in wrong:
            print(f"FAILED (CI=true): {test.id()} skipped for a reason the project's set-up "
                  f"should have removed: {why}")
        failed += len(wrong)
    problem = extra_check() if extra_check else None
    if problem:
        print(problem)
        failed += 1
    return 1 if failed else 0


LINE = re.compile(r"^\[(\d+)\]<(stdout|stderr)>:(.*)$")


def rank_lines(text, stream="stdout"):
    """Maps rank -> list of lines it printed on `stream`."""
    out = {}
    for line in text.splitlines():
        m = LINE.match(line)
        if m and m.group(2) == stream:
            out.setdefault(int(m.group(1)), []).append(m.group(3))
    return out


def rank_envs(text):
    """Maps rank -> environment, from ranks that ran `env`."""
    envs = {}
    for rank, lines in rank_lines(text).items():
        envs[rank] = dict(l.split("=", 1) for l in lines if "=" in l)
    return envs
