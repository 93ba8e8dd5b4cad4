"""Ranks run as their owner's account (issue 37): an agent that can switch users runs a
job's ranks as the account named like its driver certificate. A rank of alice's job
attacks what is not hers on an agent that also runs a rank of bob's job: the agent's key,
bob's rank's environment and process, the agent's process, bob's uid, capabilities. Once
with the agent as root, once as a user of its own with only CAP_SETUID, CAP_SETGID,
CAP_KILL, CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH (the packaged unit's). The accounts exist only in the agent's
private mount namespace (bind-mounted passwd and group files), never in the machine's.
Skips with a clear message when not run as root. Prints 'N passed, N failed'."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import (command_ran, free_port, issue, leftover_ranks, rank_lines,  # noqa: E402
                     read_line, reap, run_suite)

CAF_HVD = os.environ.get("CAF_HVD", "caf-hvd")
ATTACK = os.path.join(HERE, "isolation_attack.py")
FORGE = os.environ.get("CAF_HVD_BASP_FORGE", "caf-hvd-basp-forge")
CAF_FORGE = os.environ.get("CAF_HVD_CAF_FORGE", "caf-hvd-caf-forge")
AGENT_UID, ALICE, BOB, JOBACCT, DAEMON = 20000, 20001, 20002, 20003, 120
CAPS = "+setuid,+setgid,+kill,+sys_ptrace,+dac_read_search"


def why_not():
    if os.geteuid() != 0:
        return "isolation tests need root (accounts, mount namespaces)"
    for tool in ("unshare", "setpriv", "mount"):
        if not shutil.which(tool):
            return f"isolation tests need '{tool}' (util-linux, mount)"
    return None


WHY_NOT = why_not()


@unittest.skipIf(WHY_NOT, WHY_NOT or "")
class IsolationTest(unittest.TestCase):
    def setUp(self):
        self.procs = []
        self.addCleanup(reap, self.procs)
        self.dir = tempfile.mkdtemp(prefix="caf-hvd-iso-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        os.chmod(self.dir, 0o755)
        # the accounts, seen only by the agent (and so its ranks)
        homes = os.path.join(self.dir, "home")
        os.mkdir(homes)
        os.chmod(homes, 0o755)
        accounts = (("cafagent", AGENT_UID), ("alice", ALICE), ("bob", BOB),
                    ("jobacct", JOBACCT), ("olddaemon", DAEMON))
        names = {n for n, _ in accounts} | {"gpulike"}
        ids = {str(u) for _, u in accounts} | {"20100"}

        def without_ours(path):
            # this machine's own entries of these names or ids (an account 'alice' of
            # another uid) would be found first: the namespace's files drop them
            with open(path) as f:
                return "".join(line for line in f
                               if line.split(":")[0] not in names
                               and (line.split(":") + ["", "", ""])[2] not in ids)

        passwd = without_ours("/etc/passwd")
        group = without_ours("/etc/group")
        for name, uid in accounts:
            home = os.path.join(homes, name)
            os.mkdir(home)
            os.chown(home, uid, uid)
            os.chmod(home, 0o700)
            passwd += f"{name}:x:{uid}:{uid}:{name}:{home}:/bin/sh\n"
            group += f"{name}:x:{uid}:\n"
        group += f"gpulike:x:20100:alice\n"  # one of alice's own supplementary groups
        self.passwd = os.path.join(self.dir, "passwd")
        self.group = os.path.join(self.dir, "group")
        for path, text in ((self.passwd, passwd), (self.group, group)):
            with open(path, "w") as f:
                f.write(text)
            os.chmod(path, 0o644)
        self.mark = os.path.join(self.dir, "release")
        self.drivers = {n: issue("driver", n)
                        for n in ("alice", "bob", "carol", "cafagent", "olddaemon", "root")}

    def agent(self, as_user, *extra, name="iso"):
        """An agent with --rank-user owner in a mount namespace where the accounts exist:
        as root, or (as_user) as cafagent with the packaged unit's capabilities. Its own
        copy of the node credentials belongs to the user it runs as."""
        creds = os.path.join(self.dir, f"node-creds-{name}")
        shutil.copytree(issue("node", "iso"), creds)
        owner = AGENT_UID if as_user else 0
        for root, dirs, files in os.walk(creds):
            for n in dirs + files:
                os.chown(os.path.join(root, n), owner, owner)
        os.chown(creds, owner, owner)
        os.chmod(creds, 0o700)
        self.key = os.path.join(creds, "node.key")
        self.port = free_port()
        become = (["setpriv", f"--reuid={AGENT_UID}", f"--regid={AGENT_UID}", "--clear-groups",
                   f"--inh-caps={CAPS}", f"--ambient-caps={CAPS}", "--"] if as_user else [])
        script = (f'mount --bind {self.passwd} /etc/passwd && '
                  f'mount --bind {self.group} /etc/group && exec "$@"')
        p = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh",
             *become, CAF_HVD, "node", "--port", str(self.port), "--name", name, "--bind",
             "127.0.0.1", "--cluster-dir", creds, "--rank-user", "owner", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.procs.append(p)
        self.agent_lines = []
        # never past that line (read_line): communicate(timeout=...) reads the descriptor,
        # even for this one pipe, and would miss what p.stdout's reader had buffered
        deadline = time.monotonic() + 30
        while True:
            line = read_line(p.stdout.fileno(), deadline)
            if line:
                self.agent_lines.append(line)
            if not line.endswith("\n"):
                raise AssertionError(("the agent ended" if time.monotonic() < deadline else
                                      "no 'ranks run as' line within 30 s")
                                     + f": {''.join(self.agent_lines)}")
            if "ranks run as" in line:
                break
        self.agent_proc = p
        self.ports = getattr(self, "ports", {})
        self.ports[name] = self.port
        return p

    def driver(self, owner, *command, np=1):
        p = subprocess.Popen(
            [CAF_HVD, "driver", "--cluster-dir", self.drivers[owner], "-np", str(np), "-H",
             f"127.0.0.1:{self.port}:4", "--", *command],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
            cwd="/")
        self.procs.append(p)
        return p

    def attack(self, as_user):
        self.agent(as_user)
        self.assertIn("ranks run as their owner's account", "".join(self.agent_lines))
        # bob's rank: a secret in its environment, it waits to be released; its own
        # job's servers (on this machine, its driver root's) answer it
        tag = f"bob-rank-{os.getpid()}"
        bob = self.driver("bob", "/usr/bin/python3", ATTACK, "own", self.mark, tag)
        line = read_line(bob.stdout.fileno(), time.monotonic() + 60).strip()
        self.assertTrue(line.startswith("[0]<stdout>:"), f"no rank line within 60 s: {line!r}")
        own = json.loads(line.split(":", 1)[1])
        self.assertEqual(own["uid"], BOB)
        # the kernel's socket table names bob's account, which his agent reported
        self.assertEqual(own["own_rendezvous"], "got: HTTP/1.1 404 Not Found", own)
        self.assertEqual(own["own_store"], "got: open", own)
        alice = self.driver("alice", "/usr/bin/python3", ATTACK, str(self.agent_proc.pid),
                            self.key, tag, str(BOB), str(own["rendezvous_port"]),
                            str(own["store_port"]))
        out, err = alice.communicate(timeout=60)
        self.assertEqual(alice.returncode, 0, err)
        got = json.loads(rank_lines(out)[0][0])
        self.assertTrue(got["other_rank_found"], got)
        for what in ("agent_key", "other_environ", "signal_other", "signal_agent",
                     "setuid_other"):
            self.assertTrue(got[what].startswith("refused: Operation not permitted")
                            or got[what].startswith("refused: Permission denied"),
                            f"{what}: {got[what]}")
        # bob's servers close alice's connections unanswered: her socket is uid alice's
        self.assertEqual(got["other_rendezvous"],
                         "refused: the server closed the connection unanswered", got)
        self.assertTrue(got["other_store"].startswith("refused: the store"), got)
        self.assertEqual(got["caps"], {"CapInh": 0, "CapPrm": 0, "CapEff": 0, "CapAmb": 0})
        self.assertEqual((got["uid"], got["euid"], got["gid"]), (ALICE, ALICE, ALICE))
        self.assertEqual(got["groups"], [ALICE, 20100])
        self.assertEqual(got["env"], {"HOME": os.path.join(self.dir, "home", "alice"),
                                      "USER": "alice", "LOGNAME": "alice"})
        self.assertEqual(got["cwd"], "/")
        # bob's job was not harmed
        open(self.mark, "w").close()
        out, err = bob.communicate(timeout=60)
        self.assertEqual(bob.returncode, 0, err)
        self.assertEqual(rank_lines(out)[0][-1], "done")
        self.assertIn(f"refused a connection from 127.0.0.1: its socket on this machine is "
                      f"uid {ALICE}'s", err)
        self.assertIsNone(self.agent_proc.poll())

    def forge(self, creds, role, marker, max_id=300, mode="records", seed=None):
        """caf-hvd-basp-forge against the agent: its lines, attempt -> what happened."""
        args = [FORGE, creds, role, "127.0.0.1", str(self.port), marker, str(max_id), mode]
        if seed is not None:
            args.append(str(seed))
        r = subprocess.run(args, capture_output=True, text=True, timeout=180)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        got = dict(line.split(": ", 1) for line in r.stdout.splitlines() if ": " in line)
        self.assertEqual(got.get("connect"), "ok", r.stdout + r.stderr)
        # the sweep ends with a request to every id, which an actor answers only after it
        # has handled the sweep's earlier messages: every actor that handled anything has
        # handled everything, so what the sweep could start has started. The ids that
        # answer nothing keep every message unhandled (CAF's helper for this peer).
        self.assertEqual(got.get("ids that answered but not their last request"), "none",
                         r.stdout + r.stderr)
        answered = re.fullmatch(rf"(\d+) of {max_id} answered, (\d+) ids answered nothing",
                                got.get("sweep's last requests", ""))
        self.assertIsNotNone(answered, r.stdout + r.stderr)
        return got

    GUARDED = ("frame before the handshake", "handshake claiming the agent's own node id",
               "routed message to another node", "routed message posing as the agent's own actor",
               "down message for another node", "monitor message for another node",
               "ConfigServ lookup", "ConfigServ put", "oversized frame", "link message")

    def test_another_certificate_reaches_no_actor_of_alices_job(self):
        """Issue 48: with bob's driver certificate, a node certificate and an administrator's,
        a peer that writes BASP frames by hand tries every path past its connection while
        alice's job runs on a root agent (ranks as alice): each frame the wire guard must
        refuse closes the connection; the well-formed direct messages to actor ids 1..300
        (workers, launch batches, launch specs, calls, results, logs, output, SIGKILL) start
        nothing (the command would write the file), end nothing, and alice's job finishes
        with its own output only."""
        self.agent(False)
        mark = os.path.join(self.dir, "alice-release")
        scratch = tempfile.mkdtemp(prefix="caf-hvd-forge-")
        self.addCleanup(shutil.rmtree, scratch, True)
        os.chmod(scratch, 0o777)  # the command, had it run as alice, could write here
        marker = os.path.join(scratch, "ran")
        alice = self.driver("alice", "/bin/sh", "-c",
                            f"echo started; while [ ! -e {mark} ]; do sleep 0.05; done; "
                            f"echo done", np=2)
        self.assertIn("started", read_line(alice.stdout.fileno(), time.monotonic() + 60),
                      "no 'started' line within 60 s")
        bob = self.drivers["bob"]
        rogue = issue("node", "rogue")
        admin = issue("admin", "ops")
        for creds, role in ((bob, "driver"), (rogue, "node"), (admin, "admin")):
            got = self.forge(creds, role, marker)
            for attempt in self.GUARDED:
                self.assertEqual(got.get(attempt), "closed", f"{role}: {attempt}: {got}")
            if got.get("direct sweep of ids 1..300") != "sent, connection open":
                self.agent_proc.terminate()
                self.fail(f"{role}: {got}\nthe agent said:\n"
                          f"{self.agent_proc.communicate(timeout=30)[0][-3000:]}")
        # every actor that answered has handled its whole sweep (forge's last requests)
        self.assertFalse(command_ran(marker), "a forged launch of the sweep ran a command")
        # the same, one byte per TLS record
        got = self.forge(bob, "driver", marker, max_id=3, mode="bytes")
        for attempt in self.GUARDED:
            self.assertEqual(got.get(attempt), "closed", f"bytes: {attempt}: {got}")
        # a node id is bound to the certificate that claimed it first
        self.assertEqual(self.forge(rogue, "node", marker, 1, seed=4711)["claim of node id 4711"],
                         "open")
        self.assertEqual(self.forge(bob, "driver", marker, 1, seed=4711)["claim of node id 4711"],
                         "closed")
        # the same as an ordinary CAF program: caf-hvd's own message types over a connection
        # opened as a driver opens one, to a proxy of each actor id from the BASP broker
        r = subprocess.run([CAF_FORGE, bob, "127.0.0.1", str(self.port), marker, "300"],
                           capture_output=True, text=True, timeout=180)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("connect: ok", r.stdout)
        counts = {m.group(1): tuple(int(x) for x in m.groups()[1:])
                  for m in re.finditer(r"^(.+): answered (\d+), refused (\d+), no answer (\d+)$",
                                       r.stdout, re.M)}
        self.assertEqual(set(counts), {"node info", "workers", "launch batch", "rank launch"},
                         r.stdout)
        for kind, (answered, _, _) in counts.items():
            self.assertEqual(answered, 0, f"alice's actors answered bob's {kind}: {r.stdout}")
        # the proxies reached alice's colocator and both her workers: they refused
        self.assertGreaterEqual(counts["node info"][1], 1, r.stdout)
        self.assertGreaterEqual(counts["workers"][1], 1, r.stdout)
        self.assertGreaterEqual(counts["rank launch"][1], 2, r.stdout)
        # the agent counts what it refused, per certificate, in `caf-hvd status`
        r = subprocess.run([CAF_HVD, "status", "--cluster", f"127.0.0.1:{self.port}",
                            "--cluster-dir", self.drivers["alice"]],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        refused = {m.group(1): (int(m.group(2)), int(m.group(3)))
                   for m in re.finditer(r"^iso +('\S+' \(\w+\)) +(\d+) +(\d+) *$", r.stdout,
                                        re.M)}
        # every guarded attempt closed a connection (bob's also one byte per record, and
        # his claim of a bound node id); the direct messages were refused by the actors
        self.assertGreaterEqual(refused.get("'bob' (driver)", (0, 0))[0], 2 * len(self.GUARDED) + 1,
                                r.stdout)
        self.assertGreaterEqual(refused["'bob' (driver)"][1], 3, r.stdout)
        self.assertGreaterEqual(refused.get("'rogue' (node)", (0, 0))[0], len(self.GUARDED),
                                r.stdout)
        self.assertGreaterEqual(refused.get("'ops' (admin)", (0, 0))[0], len(self.GUARDED),
                                r.stdout)
        self.assertFalse(command_ran(marker), "a forged launch ran a command")
        # alice's job was not touched: both ranks finish, with nothing forged in its output
        open(mark, "w").close()
        out, err = alice.communicate(timeout=60)
        self.assertEqual(alice.returncode, 0, err)
        self.assertEqual(sorted(l for l in out.splitlines() if l.endswith("done")),
                         ["[0]<stdout>:done", "[1]<stdout>:done"], out)
        self.assertNotIn("forged", out + err)
        self.assertIsNone(self.agent_proc.poll())
        self.agent_proc.terminate()
        agent_out = self.agent_proc.communicate(timeout=30)[0]
        self.assertIn("caf-hvd: refused 'bob' (driver) from 127.0.0.1:", agent_out)
        self.assertIn("a routed message: this node forwards nothing", agent_out)
        self.assertRegex(agent_out, r"a (colocator|worker) refused")

    def test_a_rank_reaches_nothing_of_another_owner_nor_the_root_agent(self):
        self.attack(as_user=False)

    def test_a_rank_reaches_nothing_of_another_owner_nor_an_agent_with_capabilities(self):
        self.attack(as_user=True)

    def test_the_gloo_abort_reaches_ranks_of_another_account(self):
        """An elastic job of alice's on three agents running as cafagent with the unit's
        capabilities: a rank is killed, and the survivors' agents cut the broken
        generation's Gloo connections (between the survivors) in alice's processes
        (listing a rank's descriptors needs CAP_DAC_READ_SEARCH across accounts,
        pidfd_getfd CAP_SYS_PTRACE), so recovery does not wait for Gloo's timeout."""
        allreduce = os.environ.get("CAF_HVD_ALLREDUCE", "caf-hvd-allreduce")
        for n in ("ha", "hb", "hc"):
            self.agent(True, name=n)
        hosts = os.path.join(self.dir, "hosts")
        with open(hosts, "w") as f:
            f.write("".join(f"127.0.0.1:{self.ports[n]}:1\n" for n in ("ha", "hb", "hc")))
        script = os.path.join(self.dir, "discover.sh")
        with open(script, "w") as f:
            f.write(f"#!/bin/sh\ncat {hosts}\n")
        os.chmod(script, 0o755)
        events = os.path.join(self.dir, "events.jsonl")
        p = subprocess.Popen(
            [CAF_HVD, "driver", "--cluster-dir", self.drivers["alice"],
             "--host-discovery-script", script, "--discovery-interval", "0.2", "--min-np", "1",
             "--events", events, "--", allreduce, "--elastic", "--steps", "300", "--step-ms",
             "20"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
            cwd="/")
        self.procs.append(p)
        seen, deadline = [], time.monotonic() + 120
        while True:
            line = read_line(p.stdout.fileno(), deadline)
            if line:
                seen.append(line)
            if not line.endswith("\n"):
                timed_out = time.monotonic() >= deadline
                if timed_out:
                    p.kill()
                p.wait(timeout=30)
                how = ("no 'step 20 size 3' within 120 s" if timed_out
                       else f"the job ended early (exit {p.returncode})")
                self.fail(f"{how}:\n{''.join(seen)[-2000:]}\n{p.stderr.read()[-3000:]}")
            if "step 20 size 3" in line:
                break
        victim = None
        for entry in os.listdir("/proc"):
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    env = f.read()
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmd = f.read()
            except OSError:
                continue
            if cmd.startswith(allreduce.encode()) and b"HOROVOD_HOSTNAME=hb\0" in env:
                victim = int(entry)
                self.assertEqual(os.stat(f"/proc/{entry}").st_uid, ALICE)
        self.assertIsNotNone(victim)
        os.kill(victim, signal.SIGKILL)
        out, err = p.communicate(timeout=120)
        self.assertEqual(p.returncode, 0, err[-3000:])
        self.assertIn("elastic run done: 300 steps, checksum 45150", "".join(seen) + out)
        with open(events) as f:
            aborts = [json.loads(l)["context"] for l in f if '"gloo.abort"' in l]
        survivors = [a for a in aborts if a["host"] in ("ha", "hc")]
        self.assertTrue(survivors and all(a["problem"] is None for a in survivors), aborts)
        self.assertGreater(sum(a["cut"] for a in survivors), 0, aborts)

    def test_owners_that_must_not_run_are_refused_saying_both_ways_out(self):
        self.agent(True)
        # no account named carol: refused, with both ways out
        p = self.driver("carol", "id")
        out, err = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 1, err)
        self.assertIn("node agent 'iso' will not run job", err)
        self.assertIn("there is no account named 'carol' (the job's owner) on this node: create "
                      "an account 'carol' on this node, give the agent a job account for owners "
                      "without one (--job-account NAME; CAF_HVD_NODE_JOB_ACCOUNT in "
                      "/etc/default/caf-hvd-node), or run ranks as the agent's user "
                      "(--rank-user agent)", err)
        # the agent's own account is never a rank's
        p = self.driver("cafagent", "id")
        out, err = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 1, err)
        self.assertIn("the job's owner 'cafagent' is the agent's own account: ranks never run as "
                      "it", err)
        # nor a system account, nor root
        p = self.driver("olddaemon", "id")
        out, err = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 1, err)
        self.assertIn(f"the job's owner 'olddaemon' is a system account (uid {DAEMON}, outside "
                      "UID_MIN", err)
        p = self.driver("root", "id")
        out, err = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 1, err)
        self.assertIn("the job's owner 'root' is uid 0: ranks run as root only on an agent "
                      "started with --allow-root-ranks", err)

    def test_an_owner_without_an_account_runs_as_the_job_account(self):
        self.agent(False, "--job-account", "jobacct")
        p = self.driver("carol", "sh", "-c", "echo $(id -u) $USER $HOME")
        out, err = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 0, err)
        self.assertEqual(rank_lines(out)[0], [f"{JOBACCT} jobacct "
                                              f"{os.path.join(self.dir, 'home', 'jobacct')}"])


if __name__ == "__main__":
    if WHY_NOT:
        print(f"isolation tests skipped: {WHY_NOT}")
    sys.exit(run_suite(IsolationTest, sys.argv[1:], leftover_ranks))
