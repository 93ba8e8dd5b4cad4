"""Multi-host tests on network namespaces this suite creates (tests/cluster/netns.py):
NIC discovery across hosts whose interface names differ, with decoy interfaces.
Skips with a clear message when not run as root. Prints 'N passed, N failed'."""

import os
import re
import shutil
import signal
import subprocess
import tempfile
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netns  # noqa: E402
from harness import (describe_pids, pid_with_env, pids_matching, rank_envs,  # noqa: E402
                     rank_lines, read_line, run_suite)

CAF_HVD = os.environ.get("CAF_HVD", "caf-hvd")
ALLREDUCE = os.environ.get("CAF_HVD_ALLREDUCE", "caf-hvd-allreduce")
WHY_NOT = netns.available()


@unittest.skipIf(WHY_NOT, WHY_NOT or "")
class MultiHostTest(unittest.TestCase):
    def hosts(self, count):
        h = netns.Hosts(count)
        self.addCleanup(h.close)
        for i in range(count):
            h.start_node(i, CAF_HVD)
        return h

    def driver(self, h, slots, args, timeout=120, options=()):
        spec = ",".join(f"{x['good_addr']}:24780:{s}" for x, s in zip(h.hosts, slots))
        return h.run(0, [CAF_HVD, "driver", *options, "-np", str(sum(slots)), "-H", spec, "--",
                         *args], timeout=timeout)

    def head_driver(self, h, options, words):
        """A driver in host 0's namespace whose ranks echo `words` (shell) and sleep; returns
        it and the words of the first rank's line."""
        p = subprocess.Popen(["ip", "netns", "exec", h.hosts[0]["ns"], CAF_HVD, "driver",
                              *options, "--", "sh", "-c", f"echo {words}; exec sleep 60"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
        h.procs.append(p)
        line = read_line(p.stdout.fileno(), time.monotonic() + 60)
        if ":" not in line:
            raise AssertionError(f"no rank line from the driver within 60 s: {line!r}")
        return p, line.split(":", 1)[1].split()

    def test_three_hosts_allreduce_over_differently_named_interfaces(self):
        h = self.hosts(3)
        rc, out, err = self.driver(h, [2, 1, 1], [ALLREDUCE, "--sizes", "4K,1M"])
        self.assertEqual(rc, 0, err)
        lines = rank_lines(out)
        self.assertIn("caf-hvd-allreduce: all sums correct (2 sizes x global/local/cross)",
                      lines[0])
        host_of_rank = [0, 0, 1, 2]
        for r, hi in enumerate(host_of_rank):
            host = h.hosts[hi]
            self.assertIn(f"on {host['name']}:", lines[r][0])
            self.assertIn(f"iface {host['good']},", lines[r][0])
            self.assertIn(f"rendezvous {h.hosts[0]['good_addr']}:", lines[r][0])

        rc, out, err = self.driver(h, [2, 1, 1], ["env"])
        self.assertEqual(rc, 0, err)
        envs = rank_envs(out)
        for r, hi in enumerate(host_of_rank):
            e, host = envs[r], h.hosts[hi]
            self.assertEqual(e["HOROVOD_HOSTNAME"], host["name"])  # the UTS hostname
            self.assertEqual(e["HOROVOD_GLOO_IFACE"], host["good"])
            self.assertEqual(e["NCCL_SOCKET_IFNAME"], host["good"])
            self.assertEqual(e["MASTER_ADDR"], h.hosts[0]["good_addr"])
            self.assertEqual(e["HOROVOD_GLOO_RENDEZVOUS_ADDR"], h.hosts[0]["good_addr"])
        self.assertEqual([envs[r]["HOROVOD_CROSS_SIZE"] for r in range(4)], ["3", "1", "3", "3"])

    def test_elastic_host_joins_then_a_host_fails(self):
        """Hosts 0 and 1 start; host 2 joins through the discovery script (it probes its
        NIC against the running hosts, past its decoy); then host 1's rank is killed and
        the job finishes on hosts 0 and 2."""
        h = self.hosts(3)
        work = tempfile.mkdtemp(prefix="caf-hvd-mh-elastic-")
        self.addCleanup(shutil.rmtree, work, True)
        listing, script = os.path.join(work, "hosts"), os.path.join(work, "discover.sh")

        def publish(indexes):
            with open(listing + ".tmp", "w") as f:
                for i in indexes:
                    f.write(f"{h.hosts[i]['good_addr']}:24780:1\n")
            os.replace(listing + ".tmp", listing)

        publish([0, 1])
        with open(script, "w") as f:
            f.write(f"#!/bin/sh\ncat {listing}\n")
        os.chmod(script, 0o700)
        p = subprocess.Popen(["ip", "netns", "exec", h.hosts[0]["ns"], CAF_HVD, "driver",
                              "--host-discovery-script", script, "--discovery-interval", "0.1",
                              "--min-np", "2", "--", ALLREDUCE, "--elastic", "--steps", "200",
                              "--step-ms", "20"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
        h.procs.append(p)
        out_lines = []

        def wait_for(pattern, timeout=30):
            # never past the matched line (read_line): communicate() gets every line after it
            deadline = time.monotonic() + timeout
            while True:
                line = read_line(p.stdout.fileno(), deadline)
                if line:
                    out_lines.append(line)
                if not line.endswith("\n"):
                    break
                if re.search(pattern, line):
                    return
            raise AssertionError(f"no {pattern!r}:\n{''.join(out_lines)[-2000:]}")

        wait_for(r"step 10 size 2 ")
        publish([0, 1, 2])
        wait_for(r"step \d+ size 3 ")
        victim = pid_with_env(ALLREDUCE, prefix=True, HOROVOD_HOSTNAME=h.hosts[1]["name"])
        self.assertIsNotNone(victim)
        os.kill(victim, signal.SIGKILL)
        try:
            out, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            raise AssertionError(f"elastic driver did not finish:\n{err}")
        text = "".join(out_lines) + out
        self.assertEqual(p.returncode, 0, err)
        self.assertIn("elastic run done: 200 steps, checksum 20100", text)
        names = [x["name"] for x in h.hosts]
        self.assertIn(f"generation 2: 3 ranks on {names[0]}:1,{names[1]}:1,{names[2]}:1 "
                      f"(added {names[2]})", err)
        self.assertIn(f"host {names[1]} is blacklisted", err)
        self.assertIn(f"generation 3: 2 ranks on {names[0]}:1,{names[2]}:1 (removed {names[1]})",
                      err)
        joins = re.findall(r"joined generation (\d+): slot (\S+):0 is rank (\d+) of (\d+) "
                           r"\(.*\) iface (\S+)", text)
        by_gen = {}
        for g, host, r, n, iface in joins:
            by_gen.setdefault(int(g), {})[host] = (int(r), int(n), iface)
        good = {x["name"]: x["good"] for x in h.hosts}
        self.assertEqual(by_gen[3], {names[0]: (0, 2, good[names[0]]),
                                     names[2]: (1, 2, good[names[2]])})
        self.assertEqual(by_gen[2][names[2]], (2, 3, good[names[2]]))

    def test_the_jobs_servers_refuse_a_host_that_is_not_in_the_job(self):
        h = self.hosts(3)
        spec = ",".join(f"{x['good_addr']}:24780:1" for x in h.hosts[:2])
        p, (addr, port, master) = self.head_driver(
            h, ["-np", "2", "-H", spec],
            "$HOROVOD_GLOO_RENDEZVOUS_ADDR $HOROVOD_GLOO_RENDEZVOUS_PORT $MASTER_PORT")
        probe = ("import socket, sys\n"
                 "s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)\n"
                 "s.sendall(b'GET /global/none HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n')\n"
                 "try:\n"
                 "    print(repr(s.recv(100)))\n"
                 "except ConnectionResetError:\n"
                 "    print(repr(b''))\n")
        def ask(i, port_):
            rc, out, err = h.run(i, [sys.executable, "-c", probe, addr, port_], timeout=30)
            return out.strip()
        self.assertEqual(ask(2, port), "b''")           # a stranger: closed unanswered
        self.assertIn("404 Not Found", ask(1, port))     # a host of the job: served
        self.assertEqual(ask(2, master), "b''")          # the torch store, likewise
        os.kill(p.pid, signal.SIGINT)
        _, err = p.communicate(timeout=30)
        stranger = h.hosts[2]["good_addr"]
        self.assertIn(f"the rendezvous server refused a connection from {stranger}: not an "
                      "address of this job's hosts", err)
        self.assertIn(f"the torch store refused a connection from {stranger}", err)

    def test_loopback_on_the_head_speaks_only_for_the_heads_own_host(self):
        """Loopback used to count as every host: a local user on the head node could vote in
        rank_and_size for a remote host's slot, write its ranks' keys and scopes, or
        register its notification service. Now a client on 127.0.0.1 of the head speaks
        for the head's own host only; the remote host itself still may."""
        h = self.hosts(2)
        work = tempfile.mkdtemp(prefix="caf-hvd-mh-loopback-")
        self.addCleanup(shutil.rmtree, work, True)
        listing, script = os.path.join(work, "hosts"), os.path.join(work, "discover.sh")
        with open(listing, "w") as f:
            f.write("".join(f"{x['good_addr']}:24780:1\n" for x in h.hosts))
        with open(script, "w") as f:
            f.write(f"#!/bin/sh\ncat {listing}\n")
        os.chmod(script, 0o700)
        p, (addr, port) = self.head_driver(
            h, ["--host-discovery-script", script, "--min-np", "2"],
            "$HOROVOD_GLOO_RENDEZVOUS_ADDR $HOROVOD_GLOO_RENDEZVOUS_PORT")
        probe = ("import socket, sys\n"
                 "s = socket.socket()\n"
                 "if sys.argv[1] != '-':\n"
                 "    s.bind((sys.argv[1], 0))\n"
                 "s.settimeout(1.5)\n"
                 "s.connect((sys.argv[2], int(sys.argv[3])))\n"
                 "s.sendall(f'{sys.argv[4]} {sys.argv[5]} HTTP/1.1\\r\\nHost: x\\r\\n'\n"
                 "          'Content-Length: 1\\r\\n\\r\\nx'.encode())\n"
                 "try:\n"
                 "    print(s.recv(100).split()[1].decode())\n"
                 "except socket.timeout:\n"
                 "    print('held')\n")

        def ask(i, source, method, path):
            rc, out, err = h.run(i, [sys.executable, "-c", probe, source, addr, port, method,
                                     path], timeout=30)
            self.assertEqual(rc, 0, err)
            return out.strip()

        head, remote = h.hosts[0]["name"], h.hosts[1]["name"]
        # from the head's loopback: the remote host's slot, rank keys, scope, registration
        self.assertEqual(ask(0, "127.0.0.1", "GET", f"/rank_and_size/{remote}:0"), "403")
        self.assertEqual(ask(0, "127.0.0.1", "PUT", "/global/rank_1"), "403")  # remote's rank
        self.assertEqual(ask(0, "127.0.0.1", "PUT", f"/local_{remote}/x"), "403")
        self.assertEqual(ask(0, "127.0.0.1", "PUT", f"/worker_addresses/{remote}:0"), "403")
        # ... and its own host's, which it is
        self.assertEqual(ask(0, "127.0.0.1", "PUT", f"/local_{head}/x"), "200")
        self.assertEqual(ask(0, "127.0.0.1", "PUT", "/global/rank_0"), "200")
        # the remote host speaks for itself (its vote is held for the next generation)
        self.assertEqual(ask(1, "-", "PUT", f"/local_{remote}/x"), "200")
        os.kill(p.pid, signal.SIGINT)
        _, err = p.communicate(timeout=30)
        self.assertIn(f"the rendezvous server refused a vote for host {remote} from 127.0.0.1",
                      err)

    def test_host_whose_routable_interface_is_down(self):
        h = self.hosts(3)
        down = h.hosts[2]
        netns.sh("ip", "-n", down["ns"], "link", "set", down["good"], "down")
        t0 = time.monotonic()
        rc, _, err = self.driver(h, [1, 1, 1], ["true"], options=["--start-timeout", "2"])
        self.assertNotEqual(rc, 0)
        self.assertIn(f"node agent {down['good_addr']}:24780", err)
        self.assertIn("no TCP connection within 2 s", err)
        self.assertLess(time.monotonic() - t0, 6)

    def test_network_interface_naming_a_decoy(self):
        h = self.hosts(2)
        decoy = h.hosts[0]["decoy"]
        rc, _, err = self.driver(h, [1, 1], ["true"],
                                 options=["--network-interface", f"{decoy},{h.hosts[1]['decoy']}"])
        self.assertEqual(rc, 1, err)
        self.assertIn(f"interface {decoy} on host {h.hosts[0]['name']} does not reach every "
                      f"other host", err)

    def test_network_interface_missing_on_a_host(self):
        h = self.hosts(2)
        rc, _, err = self.driver(h, [1, 1], ["true"], options=["--network-interface", "eth0"])
        self.assertEqual(rc, 1, err)
        self.assertIn(f"host {h.hosts[1]['name']} has no interface named eth0", err)

    def test_network_interface_naming_the_good_ones(self):
        h = self.hosts(2)
        names = f"{h.hosts[0]['good']},{h.hosts[1]['good']}"
        rc, out, err = self.driver(h, [1, 1], ["env"], options=["--network-interface", names])
        self.assertEqual(rc, 0, err)
        envs = rank_envs(out)
        self.assertEqual(envs[1]["HOROVOD_GLOO_IFACE"], h.hosts[1]["good"])

    def test_single_remote_host_honours_network_interface(self):
        """One remote host: nothing to probe, but --network-interface still decides the
        interface (and a name the host lacks is an error)."""
        h = self.hosts(2)
        remote = h.hosts[1]
        job = ["-np", "1", "-H", f"{remote['good_addr']}:24780:1", "--", "env"]
        rc, out, err = h.run(0, [CAF_HVD, "driver", "--network-interface", remote["decoy"], *job])
        self.assertEqual(rc, 0, err)
        self.assertEqual(rank_envs(out)[0]["HOROVOD_GLOO_IFACE"], remote["decoy"])
        rc, _, err = h.run(0, [CAF_HVD, "driver", "--network-interface", "nosuch0", *job])
        self.assertEqual(rc, 1, err)
        self.assertIn(f"host {remote['name']} has no interface named nosuch0", err)

    def test_torch_program_on_two_hosts_by_two_ranks(self):
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        setup = subprocess.run([os.path.join(root, "scripts", "setup-torch.sh")],
                               capture_output=True, text=True)
        if setup.returncode != 0:
            self.skipTest("Debian's python3-torch could not be installed: "
                          + setup.stderr.strip()[-300:])
        h = self.hosts(2)
        rc, out, err = self.driver(h, [2, 2], ["/usr/bin/python3",
                                               os.path.join(root, "examples",
                                                            "torch_ddp_gloo.py")],
                                   timeout=300)
        self.assertEqual(rc, 0, err)
        lines = rank_lines(out)
        for r in range(4):
            host = h.hosts[r // 2]
            self.assertIn(f"rank {r}/4 (local {r % 2}, group {r // 2}, master "
                          f"{h.hosts[0]['good_addr']}:", lines[r][0])
            self.assertIn(f"gloo iface {host['good']})", lines[r][0])
            self.assertIn("weights identical on all ranks", lines[r][0])


SSHD = "/usr/sbin/sshd"
SETUP = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                     "scripts", "setup-launchers.sh")


def ssh_ready():
    """None when sshd and ssh can run the ssh tests here, else why not. Installs Debian's
    openssh-server when it is missing (as root)."""
    if WHY_NOT:
        return WHY_NOT
    if not (os.path.exists(SSHD) and shutil.which("ssh") and shutil.which("ssh-keygen")):
        r = subprocess.run([SETUP, "ssh"], capture_output=True, text=True)
        if r.returncode != 0 or not os.path.exists(SSHD):
            return ("the ssh tests need Debian's openssh-server, which scripts/setup-launchers.sh "
                    "could not install: " + r.stderr[-300:])
    return None


@unittest.skipIf(WHY_NOT, WHY_NOT or "")
class SshLauncherTest(unittest.TestCase):
    """Agents started over ssh on network-namespace hosts, each running Debian's sshd with
    a key made for the test (root login by key only)."""

    @classmethod
    def setUpClass(cls):
        why = ssh_ready()
        if why:
            raise unittest.SkipTest(why)

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="caf-hvd-sshd-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation directory
        self.key = os.path.join(self.dir, "id")
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", self.key], check=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                        os.path.join(self.dir, "host_key")], check=True)
        shutil.copy(self.key + ".pub", os.path.join(self.dir, "authorized_keys"))
        self.sshd = {}

    def start_sshd(self, h, i):
        host = h.hosts[i]
        conf = os.path.join(self.dir, f"sshd_{i}.conf")
        with open(conf, "w") as f:
            f.write(f"""Port 22
ListenAddress {host['good_addr']}
HostKey {self.dir}/host_key
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
AuthorizedKeysFile {self.dir}/authorized_keys
StrictModes no
PidFile none
""")
        p = subprocess.Popen(["ip", "netns", "exec", host["ns"], "unshare", "--uts", "sh", "-c",
                              f'hostname {host["name"]} && exec {SSHD} -D -e -f {conf}'],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
        h.procs.append(p)
        self.sshd[i] = p
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # listening once a TCP connect succeeds
            r = subprocess.run(["ip", "netns", "exec", host["ns"], "bash", "-c",
                                f"exec 3<>/dev/tcp/{host['good_addr']}/22"], capture_output=True)
            if r.returncode == 0:
                return
            time.sleep(0.05)
        raise AssertionError(f"sshd on {host['name']} did not listen")

    def hosts(self, count):
        h = netns.Hosts(count)
        self.addCleanup(h.close)
        for i in range(count):
            self.start_sshd(h, i)
        return h

    def ssh_args(self):
        return ["--launcher", "ssh", "-i", self.key,
                "--ssh-option", f"UserKnownHostsFile={self.dir}/known_hosts"]

    def only_sshd_left(self, h):
        """True when nothing but sshd runs in any host namespace."""
        for host in h.hosts:
            for pid in netns.sh("ip", "netns", "pids", host["ns"], check=False).stdout.split():
                try:
                    with open(f"/proc/{pid}/comm") as f:
                        if f.read().strip() != "sshd":
                            return False
                except OSError:
                    pass
        return True

    def wait_only_sshd(self, h, what):
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.only_sshd_left(h):
                return
            time.sleep(0.1)
        self.fail(f"processes left on the hosts after {what}")

    def test_three_hosts_over_ssh_with_nic_checks(self):
        h = self.hosts(3)
        spec = ",".join(f"{x['good_addr']}:{s}" for x, s in zip(h.hosts, [2, 1, 1]))
        rc, out, err = h.run(0, [CAF_HVD, "driver", *self.ssh_args(), "-np", "4", "-H", spec,
                                 "--", ALLREDUCE, "--sizes", "4K"])
        self.assertEqual(rc, 0, err)
        lines = rank_lines(out)
        self.assertIn("caf-hvd-allreduce: all sums correct", lines[0][-1])
        for r, hi in enumerate([0, 0, 1, 2]):
            host = h.hosts[hi]
            self.assertIn(f"iface {host['good']},", lines[r][0])
            self.assertIn(f"rendezvous {h.hosts[0]['good_addr']}:", lines[r][0])
        self.wait_only_sshd(h, "the job")

    def test_a_host_whose_sshd_is_down(self):
        h = self.hosts(2)
        os.killpg(self.sshd[1].pid, signal.SIGKILL)
        self.sshd[1].wait()
        spec = ",".join(f"{x['good_addr']}:1" for x in h.hosts)
        rc, out, err = h.run(0, [CAF_HVD, "driver", *self.ssh_args(), "-np", "2", "-H", spec,
                                 "--", "true"])
        self.assertEqual(rc, 1)
        self.assertIn(f"host {h.hosts[1]['good_addr']}: ssh ended with exit code 255", err)
        self.assertIn("Connection refused", err)
        self.wait_only_sshd(h, "the refused start")

    def test_ctrl_c_and_driver_sigkill_leave_nothing_on_any_host(self):
        h = self.hosts(2)
        spec = ",".join(f"{x['good_addr']}:1" for x in h.hosts)
        for sig, code in ((signal.SIGINT, 130), (signal.SIGKILL, -9)):
            p = subprocess.Popen(["ip", "netns", "exec", h.hosts[0]["ns"], CAF_HVD, "driver",
                                  *self.ssh_args(), "-np", "2", "-H", spec, "--", "sh", "-c",
                                  "echo up; exec sleep 300"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 start_new_session=True)
            h.procs.append(p)
            seen = 0
            while seen < 2:
                line = p.stdout.readline()
                self.assertTrue(line, p.stderr.read() if p.poll() is not None else "no output")
                seen += "up" in line
            os.kill(p.pid, sig)
            self.assertEqual(p.wait(timeout=30), code)
            self.wait_only_sshd(h, f"signal {sig}")


def slurm_ready():
    """None when a Slurm cluster can be built here, else why not (installs Debian's
    Slurm 22.05 and munge when they are missing, as root)."""
    if WHY_NOT:
        return WHY_NOT
    tools = ("/usr/sbin/slurmd", "/usr/sbin/slurmctld", "/usr/sbin/munged")
    if not all(os.path.exists(t) for t in tools) or not shutil.which("salloc"):
        r = subprocess.run([SETUP, "slurm"], capture_output=True, text=True)
        if r.returncode != 0 or not all(os.path.exists(t) for t in tools):
            return ("the Slurm tests need Debian's slurmd, slurmctld, slurm-client and munge, "
                    "which scripts/setup-launchers.sh could not install: " + r.stderr[-300:])
    return None


@unittest.skipIf(WHY_NOT, WHY_NOT or "")
class SlurmLauncherTest(unittest.TestCase):
    """A real Slurm cluster (slurmctld + one slurmd per host) on network-namespace hosts;
    `salloc -N2 caf-hvd driver --launcher slurm` starts the agents as one srun step."""

    @classmethod
    def setUpClass(cls):
        why = slurm_ready()
        if why:
            raise unittest.SkipTest(why)
        cls.munged = None
        if not subprocess.run(["pgrep", "-x", "munged"], capture_output=True).stdout:
            os.makedirs("/run/munge", exist_ok=True)
            shutil.chown("/run/munge", "munge", "munge")
            subprocess.run(["su", "-s", "/bin/sh", "munge", "-c", "/usr/sbin/munged"], check=True)
            cls.munged = True

    @classmethod
    def tearDownClass(cls):
        if getattr(cls, "munged", None):
            subprocess.run(["pkill", "-x", "munged"])

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="caf-hvd-slurm-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.h = netns.Hosts(3)
        self.addCleanup(self.h.close)
        names = ["sA", "sB", "sC"]
        d = self.dir
        nodes = "\n".join(f"NodeName={n} NodeAddr={x['good_addr']} CPUs=2"
                           for n, x in zip(names, self.h.hosts))
        self.conf = os.path.join(d, "slurm.conf")
        with open(self.conf, "w") as f:
            f.write(f"""ClusterName=cafhvd
SlurmctldHost=sA({self.h.hosts[0]['good_addr']})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/%n/spool
SlurmdPidFile={d}/%n/slurmd.pid
SlurmctldPidFile={d}/slurmctld.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/%n/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
{nodes}
PartitionName=p Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
        with open(os.path.join(d, "cgroup.conf"), "w") as f:
            f.write("CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\n"
                    "CgroupAutomount=no\n")
        os.makedirs(os.path.join(d, "state"))
        for n in names:
            os.makedirs(os.path.join(d, n, "spool"))
        self.env = dict(os.environ, SLURM_CONF=self.conf)

        def daemon(i, name, cmd):
            p = subprocess.Popen(["ip", "netns", "exec", self.h.hosts[i]["ns"], "unshare", "--uts",
                                  "sh", "-c", f"hostname {name} && exec {cmd}"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 env=self.env, start_new_session=True)
            self.h.procs.append(p)

        daemon(0, "sA", f"/usr/sbin/slurmctld -D -i -f {self.conf}")
        for i, n in enumerate(names):
            daemon(i, n, f"/usr/sbin/slurmd -D -f {self.conf}")
        deadline = time.monotonic() + 60
        states = ""
        while time.monotonic() < deadline:
            states = self.in_host(["sinfo", "-h", "-N", "-o", "%N %T"]).stdout
            if states.count("idle") == 3:
                return
            time.sleep(0.5)
        log = open(os.path.join(d, "slurmctld.log")).read()[-1500:] \
            if os.path.exists(os.path.join(d, "slurmctld.log")) else ""
        raise AssertionError(f"the Slurm nodes did not turn idle: {states!r}\n{log}")

    def in_host(self, args, timeout=120):
        return subprocess.run(["ip", "netns", "exec", self.h.hosts[0]["ns"], *args],
                              capture_output=True, text=True, env=self.env, timeout=timeout)

    def agents_left(self):
        for host in self.h.hosts:
            for pid in netns.sh("ip", "netns", "pids", host["ns"], check=False).stdout.split():
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        if b"--exit-on-stdin-eof" in f.read():
                            return True
                except OSError:
                    pass
        return False

    def test_agents_as_one_srun_step_over_the_allocation(self):
        r = self.in_host(["salloc", "-N3", "--ntasks-per-node=1", "-t", "5", CAF_HVD, "driver",
                          "--launcher", "slurm", "--", ALLREDUCE, "--sizes", "4K,64K"])
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = rank_lines(r.stdout)
        self.assertEqual(sorted(lines), [0, 1, 2], r.stdout + r.stderr)
        self.assertIn("caf-hvd-allreduce: all sums correct (2 sizes x global/local/cross)",
                      lines[0][-1])
        for rank, node in enumerate(["sA", "sB", "sC"]):
            self.assertIn(f"on {node}:", lines[rank][0])  # the agent named after its node
        self.assertIn("3 hosts from Slurm job", r.stderr)
        self.assertIn("Relinquishing job allocation", r.stderr)
        deadline = time.monotonic() + 15
        while self.agents_left() and time.monotonic() < deadline:
            time.sleep(0.1)
        self.assertFalse(self.agents_left(), "the step's agents outlived the job")
        # a driver SIGKILLed mid-job: the step, its agents and their ranks go with it (the
        # ranks' command is this test's own: a `sleep 300` of anyone else does not count)
        rank_cmd = f"sleep 300.{os.getpid()}{time.monotonic_ns() % 1000}"
        p = subprocess.Popen(["ip", "netns", "exec", self.h.hosts[0]["ns"], "salloc", "-N2",
                              "--ntasks-per-node=2", "-t", "5", CAF_HVD, "driver", "--launcher",
                              "slurm", "--", "sh",
                              "-c", f"echo up; exec {rank_cmd}"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=self.env, start_new_session=True)
        self.h.procs.append(p)
        seen = 0
        while seen < 4:
            line = p.stdout.readline()
            self.assertTrue(line, "the job ended early")
            seen += "up" in line
        driver = [pid for pid in pids_matching("--launcher slurm") if pid != p.pid]
        drivers = [pid for pid in driver
                   if open(f"/proc/{pid}/cmdline", "rb").read().startswith(CAF_HVD.encode())]
        self.assertEqual(len(drivers), 1, driver)
        os.kill(drivers[0], signal.SIGKILL)
        deadline = time.monotonic() + 20
        # the ranks themselves: command lines starting with their command (salloc's own
        # command line names it too while it relinquishes the allocation)
        while ((self.agents_left() or pids_matching(rank_cmd, prefix=True))
               and time.monotonic() < deadline):
            time.sleep(0.2)
        self.assertFalse(self.agents_left(), "agents outlived a SIGKILLed driver")
        self.assertEqual(describe_pids(pids_matching(rank_cmd, prefix=True)), [],
                         "ranks outlived a SIGKILLed driver")
        p.wait(timeout=30)
        # outside an allocation it says what it needs
        r = self.in_host([CAF_HVD, "driver", "--launcher", "slurm", "--", "true"])
        self.assertEqual(r.returncode, 2)
        self.assertIn("--launcher slurm runs inside a Slurm allocation", r.stderr)


def leftover_namespaces():
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return f"namespaces left behind: {left}" if not WHY_NOT and "chv" in left else None


if __name__ == "__main__":
    if WHY_NOT:
        print(f"multi-host tests skipped: {WHY_NOT}")
    code = run_suite(MultiHostTest, sys.argv[1:])
    code |= run_suite(SshLauncherTest, sys.argv[1:])
    code |= run_suite(SlurmLauncherTest, sys.argv[1:], leftover_namespaces)
    sys.exit(code)
