"""A multi-host harness made of network namespaces: K hosts on one machine, each with
its own hostname (a UTS namespace), a routable interface on a shared bridge (which lives
in a namespace of its own) and a decoy interface that is up with an address but reaches
nothing (a veth whose peer is up alone in an otherwise empty namespace, in a subnet of
its own). Interface names differ between hosts, and on host 0 the decoy's name sorts
before the routable one. Addresses come from 10.213.0.0/16 and exist only inside these
namespaces. As on a real cluster, the hosts' names resolve to their routable addresses:
`ip netns exec` puts /etc/netns/NS/hosts in place of /etc/hosts (real Horovod's hvd.init()
ends with SIGSEGV on a host whose own name does not resolve). Everything is removed on
close(), at exit, and on SIGTERM/SIGINT."""

import atexit
import os
import shutil
import signal
import subprocess

from harness import reap

GOOD_NAMES = ["eth0", "ens5", "enp0s3", "eno1", "eth1", "ens6", "enp1s0", "eno2"]
DECOY_NAMES = ["dummy0", "zz-decoy", "aa-decoy", "bad0", "x0", "decoy1", "a1", "z1"]


def available():
    """None when the harness can run here, else why not."""
    if os.geteuid() != 0:
        return "multi-host tests need root (ip netns)"
    for tool in ("ip", "unshare"):
        if not shutil.which(tool):
            return f"multi-host tests need '{tool}' (apt-get install iproute2 util-linux)"
    return None


def sh(*args, check=True):
    r = subprocess.run(args, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {r.stderr.strip()}")
    return r


class Hosts:
    def __init__(self, count, tag=None):
        self.tag = tag or f"{os.getpid() % 10000}"
        self.count = count
        self.namespaces = []
        self.etc_dirs = []  # /etc/netns/NS: the hosts' /etc/hosts
        self.procs = []
        self.hosts = []  # dicts: name, ns, good, good_addr, decoy, decoy_addr
        atexit.register(self.close)
        self._old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
        for s in self._old:
            signal.signal(s, self._on_signal)
        try:
            self._build()
        except Exception:
            self.close()
            raise

    def _on_signal(self, signum, frame):
        self.close()
        raise SystemExit(128 + signum)

    def _ns(self, name):
        sh("ip", "netns", "add", name)
        self.namespaces.append(name)
        sh("ip", "-n", name, "link", "set", "lo", "up")
        return name

    def _build(self):
        t = self.tag
        bridge_ns = self._ns(f"chv{t}-br")
        sh("ip", "-n", bridge_ns, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", bridge_ns, "link", "set", "br0", "up")
        for i in range(self.count):
            name = f"chv{t}-h{i}"
            ns = self._ns(name)
            void = self._ns(f"chv{t}-v{i}")
            good, decoy = GOOD_NAMES[i % len(GOOD_NAMES)], DECOY_NAMES[i % len(DECOY_NAMES)]
            good_addr, decoy_addr = f"10.213.0.{i + 1}", f"10.213.{100 + i}.1"
            # routable: host <-> bridge
            sh("ip", "link", "add", f"chv{t}g{i}", "type", "veth", "peer", "name", f"chv{t}b{i}")
            sh("ip", "link", "set", f"chv{t}g{i}", "netns", ns, "name", good)
            sh("ip", "link", "set", f"chv{t}b{i}", "netns", bridge_ns)
            sh("ip", "-n", bridge_ns, "link", "set", f"chv{t}b{i}", "master", "br0", "up")
            sh("ip", "-n", ns, "addr", "add", f"{good_addr}/24", "dev", good)
            sh("ip", "-n", ns, "link", "set", good, "up")
            # decoy: host <-> an otherwise empty namespace, another subnet
            sh("ip", "link", "add", f"chv{t}d{i}", "type", "veth", "peer", "name", f"chv{t}e{i}")
            sh("ip", "link", "set", f"chv{t}d{i}", "netns", ns, "name", decoy)
            sh("ip", "link", "set", f"chv{t}e{i}", "netns", void)
            sh("ip", "-n", void, "link", "set", f"chv{t}e{i}", "up")
            sh("ip", "-n", ns, "addr", "add", f"{decoy_addr}/24", "dev", decoy)
            sh("ip", "-n", ns, "link", "set", decoy, "up")
            self.hosts.append(dict(name=name, ns=ns, good=good, good_addr=good_addr,
                                   decoy=decoy, decoy_addr=decoy_addr))
        names = "".join(f"{h['good_addr']}\t{h['name']}\n" for h in self.hosts)
        for h in self.hosts:
            os.makedirs(f"/etc/netns/{h['ns']}", exist_ok=True)
            self.etc_dirs.append(f"/etc/netns/{h['ns']}")
            with open(f"/etc/netns/{h['ns']}/hosts", "w") as f:
                f.write(f"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
                        f"{names}")

    def start_node(self, i, caf_hvd, port=24780, extra=()):
        """Starts `caf-hvd node` on host i under its own hostname; waits until it listens."""
        h = self.hosts[i]
        cmd = ["ip", "netns", "exec", h["ns"], "unshare", "--uts", "sh", "-c",
               f'hostname {h["name"]} && exec "$0" "$@"', caf_hvd, "node", "--port", str(port),
               *extra]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
        self.procs.append(p)
        line = p.stdout.readline()
        if "listening" not in line:
            raise RuntimeError(f"node on {h['name']} did not start: {line!r}")
        return p

    def run(self, i, args, timeout=120):
        """Runs a command inside host i's namespace; returns (rc, stdout, stderr)."""
        p = subprocess.Popen(["ip", "netns", "exec", self.hosts[i]["ns"], *args],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
        self.procs.append(p)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            raise AssertionError(f"{args} did not finish within {timeout}s:\n{err}")
        return p.returncode, out, err

    def close(self):
        reap(self.procs)
        for ns in reversed(self.namespaces):
            # Anything still running inside (started by the tests) dies with it.
            pids = sh("ip", "netns", "pids", ns, check=False).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            sh("ip", "netns", "del", ns, check=False)
        self.namespaces.clear()
        for d in getattr(self, "etc_dirs", []):
            shutil.rmtree(d, ignore_errors=True)
        self.etc_dirs = []
        if os.path.isdir("/etc/netns") and not os.listdir("/etc/netns"):
            os.rmdir("/etc/netns")
        for s, old in getattr(self, "_old", {}).items():
            signal.signal(s, old)
        self._old = {}
