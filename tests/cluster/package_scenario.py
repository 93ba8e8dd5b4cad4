"""Runs inside a fresh Debian chroot (tests/cluster/run_package_tests.py starts it in its
own PID namespace, after apt installed the package's dependencies): installs the package, uses it as a site would
(a local job, the Python package, the node agent started as caf-hvd-node.service would
start it, a driver job against it, then docs/operating.md's steps on this one machine: a
second agent that joins the first, a job the table places over both, status, an
operator's drain across the member's restart and undrain, a revoked certificate after
the reload), purges it and checks what is left.
usage: python3 package_scenario.py DEB PORT
Prints one line per step; exits 1 with the reason at the first step that fails."""

import os
import re
import shlex
import signal
import subprocess
import sys
import time

DEB, PORT = sys.argv[1], int(sys.argv[2])
# Files that may differ after `dpkg -P`: the system user (Debian keeps system users),
# dpkg's and apt's own records and logs, the admin's credentials under /etc/caf-hvd and
# this test's own files.
ALLOWED_LEFT = re.compile(r"^/(etc/(passwd|group|shadow|gshadow)-?|etc/caf-hvd(/.*)?|"
                          r"var/lib/dpkg/.*|var/log/.*|var/cache/(apt|debconf|ldconfig)/.*|"
                          r"var/lib/apt/.*|root/.*|tmp/.*)$")
SKIP_DIRS = ("/proc", "/sys", "/dev", "/run", "/tmp", "/pkg")


def step(name):
    print(f"package scenario: {name}", flush=True)


def fail(message):
    print(f"package scenario: FAILED: {message}", flush=True)
    sys.exit(1)


def run(cmd, timeout=120, env=None, ok=True, **kw):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, **kw)
    except subprocess.TimeoutExpired:
        fail(f"{shlex.join(cmd)} did not end within {timeout} s")
    if ok and p.returncode != 0:
        fail(f"{shlex.join(cmd)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p


def tree():
    files = set()
    for root, dirs, names in os.walk("/"):
        dirs[:] = [d for d in dirs if os.path.join(root, d) not in SKIP_DIRS]
        for n in dirs + names:
            files.add(os.path.join(root, n))
    return files


def apt_env():
    return dict(os.environ, DEBIAN_FRONTEND="noninteractive")


def systemd_words(line, env):
    """ExecStart's words as systemd makes them: ${VAR} is one word, $VAR splits."""
    words = []
    for token in shlex.split(line):
        m = re.fullmatch(r"\$\{(\w+)\}", token)
        if m:
            words.append(env.get(m.group(1), ""))
            continue
        m = re.fullmatch(r"\$(\w+)", token)
        if m:
            words += env.get(m.group(1), "").split()
            continue
        if "$" in token:
            fail(f"ExecStart word {token!r}: this test does not expand it")
        words.append(token)
    return words


def unit_command(unit_path, default_path, config=None):
    """The agent's command line, user and environment as the unit would start it (with
    `config` as the text of its EnvironmentFile, if given)."""
    env, user, exec_start, caps = {}, None, None, []
    for line in open(unit_path):
        line = line.strip()
        if line.startswith("Environment="):
            for assignment in shlex.split(line[len("Environment="):]):
                k, _, v = assignment.partition("=")
                env[k] = v
        elif line.startswith("EnvironmentFile="):
            path = line[len("EnvironmentFile="):].lstrip("-")
            if path != default_path:
                fail(f"the unit reads {path}, the package installs {default_path}")
            for l in (config.splitlines() if config is not None else open(path)):
                l = l.strip()
                if l and not l.startswith("#"):
                    k, _, v = l.partition("=")
                    env[k] = " ".join(shlex.split(v))
        elif line.startswith("User="):
            user = line[len("User="):]
        elif line.startswith("AmbientCapabilities="):
            caps = line[len("AmbientCapabilities="):].split()
        elif line.startswith("ExecStart="):
            exec_start = line[len("ExecStart="):]
    if not exec_start or not user:
        fail(f"{unit_path} has no ExecStart= or User=")
    return systemd_words(exec_start, env), user, env, caps


def start_agent(log_path, config=None):
    """The agent as caf-hvd-node.service starts it (its user, capabilities, environment),
    once it listens."""
    cmd, user, unit_env, caps = unit_command("/lib/systemd/system/caf-hvd-node.service",
                                             "/etc/default/caf-hvd-node", config)
    print("  ExecStart:", shlex.join(cmd), f"(User={user}, capabilities {caps})", flush=True)
    given = ",".join("+" + c.lower().removeprefix("cap_") for c in caps)
    agent_env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/var/lib/caf-hvd",
                 "LANG": "C.UTF-8", **unit_env}
    log = open(log_path, "w+")
    agent = subprocess.Popen(["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups",
                              f"--inh-caps={given}", f"--ambient-caps={given}", "--"] + cmd,
                             env=agent_env, stdout=log, stderr=subprocess.STDOUT,
                             cwd="/var/lib/caf-hvd")
    wait_for_log(log_path, "listening on", "the agent to listen", agent)
    return agent


def wait_for_log(log_path, text, what, proc=None, seconds=30):
    deadline = time.monotonic() + seconds
    while text not in open(log_path).read():
        if (proc is not None and proc.poll() is not None) or time.monotonic() > deadline:
            fail(f"no {what} within {seconds} s ({log_path} has no {text!r}):\n"
                 f"{open(log_path).read()}")
        time.sleep(0.2)


def stop_agent(agent, log_path):
    agent.send_signal(signal.SIGTERM)
    try:
        rc = agent.wait(timeout=60)
    except subprocess.TimeoutExpired:
        agent.kill()
        fail("the agent did not stop within 60 s of SIGTERM")
    if rc != 0:
        fail(f"the agent exited {rc} on SIGTERM:\n{open(log_path).read()}")


def operators_page(config):
    """docs/operating.md's steps 4-9 with the installed package on this one machine: a
    second agent started as the unit starts it joins the first (CAF_HVD_NODE_JOIN), the
    table places a job over both, an operator drains and undrains, status reads the
    cluster, a revoked certificate is refused after the agents' reload. Returns the
    member agent (stopped with the first)."""
    table = f"127.0.0.1:{PORT}"
    step("operating page 3-4: a member's credentials, and its agent joins the table")
    run(["caf-hvd", "cluster", "add-node", "pkgmember", "/root/cluster"])
    if any(os.path.exists(f"/root/cluster/issued/pkgmember/{f}")
           for f in ("ca.key", "driver.key")):
        fail("the issued directory of a node holds a CA or driver key")
    run(["cp", "-a", "/root/cluster/issued/pkgmember", "/etc/caf-hvd/member"])
    run(["chown", "-R", "caf-hvd:caf-hvd", "/etc/caf-hvd/member"])
    run(["install", "-d", "-o", "caf-hvd", "-g", "caf-hvd", "-m", "0700",
         "/var/lib/caf-hvd/member"])
    member_config = config + (f"\nCAF_HVD_NODE_PORT={PORT + 1}\nCAF_HVD_NODE_NAME=pkgmember\n"
                              f"CAF_HVD_NODE_JOIN=127.0.0.1:{PORT}\n"
                              "CAF_HVD_CLUSTER_DIR=/etc/caf-hvd/member\n"
                              "CAF_HVD_NODE_STATE_DIR=/var/lib/caf-hvd/member\n")
    member = start_agent("/tmp/member.log", member_config)
    wait_for_log("/tmp/member.log", "joined", "join of the member", member)

    step("operating page 5: a first job, placed by the table over both agents")
    p = run(["caf-hvd", "driver", "--cluster-dir", "/root/driver", "--cluster", table,
             "-np", "4", "--", "sh", "-c", "echo on $HOROVOD_HOSTNAME"], timeout=120)
    hosts = sorted(re.findall(r"(?m)^\[\d+\]<stdout>:on (\S+)$", p.stdout))
    if hosts != ["pkgmember", "pkgmember", "pkgnode", "pkgnode"]:
        fail(f"the table placed the 4 ranks on {hosts}, not 2 on each node:\n{p.stdout}{p.stderr}")

    step("operating page 7-8: status, and an operator's drain and undrain")
    run(["caf-hvd", "cluster", "add-admin", "ops", "/root/cluster", "--out", "/root/ops"])
    status = ["caf-hvd", "status", "--cluster", table, "--cluster-dir", "/root/driver"]
    out = run(status).stdout
    if not (re.search(r"(?m)^\s*pkgmember\s+alive", out)
            and re.search(r"(?m)^\s*pkgnode\s+alive", out)):
        fail(f"status does not show both nodes alive:\n{out}")
    run(["caf-hvd", "drain", "pkgmember", "--cluster", table, "--cluster-dir", "/root/ops"])
    wait_for_log("/tmp/member.log", "drained by the cluster's administrator",
                 "drain reaching the member")
    out = run(status).stdout
    if not re.search(r"(?m)^\s*pkgmember\s+drained", out):
        fail(f"status does not show pkgmember drained:\n{out}")
    p = run(["caf-hvd", "driver", "--cluster-dir", "/root/driver", "--cluster", table,
             "-np", "1", "-H", f"127.0.0.1:{PORT + 1}:1", "--", "true"], ok=False)
    if p.returncode == 0 or "is drained" not in p.stderr:
        fail(f"a job naming the drained node was not refused saying so ({p.returncode}):\n"
             f"{p.stderr}")
    # the upgrade's step: the drained member's agent restarts (as the package's upgrade
    # restarts the unit) and comes back drained, from its state directory
    if not os.path.exists("/var/lib/caf-hvd/member/drained"):
        fail("the drain is not kept in the member's state directory")
    stop_agent(member, "/tmp/member.log")
    member = start_agent("/tmp/member.log", member_config)
    wait_for_log("/tmp/member.log", "drained, as before this start", "drain kept across the "
                 "member's restart", member)
    wait_for_log("/tmp/member.log", "joined", "join of the restarted member", member)
    p = run(["caf-hvd", "driver", "--cluster-dir", "/root/driver", "--cluster", table,
             "-np", "1", "-H", f"127.0.0.1:{PORT + 1}:1", "--", "true"], ok=False)
    if p.returncode == 0 or "is drained" not in p.stderr:
        fail(f"the restarted member took a job while drained ({p.returncode}):\n{p.stderr}")
    run(["caf-hvd", "undrain", "pkgmember", "--cluster", table, "--cluster-dir", "/root/ops"])
    wait_for_log("/tmp/member.log", "undrained: it takes jobs again",
                 "undrain reaching the member")
    run(["caf-hvd", "driver", "--cluster-dir", "/root/driver", "-np", "1",
             "-H", f"127.0.0.1:{PORT + 1}:1", "--", "true"])

    step("operating page 9: a revoked driver certificate, after the agents' reload")
    run(["caf-hvd", "cluster", "add-driver", "mallory", "/root/cluster", "--out", "/root/mallory"])
    run(["caf-hvd", "cluster", "revoke", "mallory", "/root/cluster"])
    for d in ("/etc/caf-hvd/cluster", "/etc/caf-hvd/member"):
        run(["install", "-o", "caf-hvd", "-g", "caf-hvd", "-m", "0600",
             "/root/cluster/crl.pem", f"{d}/crl.pem"])
    return member


def main():
    before = tree()

    step("dpkg -i")
    run(["dpkg", "-i", DEB], timeout=300, env=apt_env())
    for path in ("/usr/bin/caf-hvd", "/usr/bin/caf-hvd-exec", "/usr/bin/caf-hvd-allreduce",
                 "/lib/systemd/system/caf-hvd-node.service", "/etc/default/caf-hvd-node",
                 "/usr/share/man/man1/caf-hvd.1.gz", "/usr/share/man/man8/caf-hvd-node.8.gz",
                 "/usr/lib/python3/dist-packages/caf_hvd/__init__.py", "/var/lib/caf-hvd"):
        if not os.path.exists(path):
            fail(f"the package installed no {path}")
    run(["getent", "passwd", "caf-hvd"])

    step("caf-hvd run -np 2 -- caf-hvd-allreduce")
    p = run(["caf-hvd", "run", "-np", "2", "--", "caf-hvd-allreduce"], timeout=120)
    if "caf-hvd-allreduce: all sums correct" not in p.stdout:
        fail(f"caf-hvd-allreduce printed no result:\n{p.stdout}")

    step("import caf_hvd and an Executor call (no CAF_HVD, no PYTHONPATH)")
    env = {k: v for k, v in os.environ.items() if k not in ("CAF_HVD", "PYTHONPATH")}
    code = ("import os, caf_hvd\n"
            "assert caf_hvd.find_binary() == '/usr/bin/caf-hvd', caf_hvd.find_binary()\n"
            "ex = caf_hvd.Executor(num_workers=2)\n"
            "ex.start()\n"
            "print(ex.run(lambda x: x * int(os.environ['HOROVOD_RANK']) + 1, args=(10,)))\n"
            "ex.shutdown()\n")
    p = run(["/usr/bin/python3", "-c", code], timeout=120, env=env, cwd="/")
    if p.stdout.strip() != "[1, 11]":
        fail(f"the executor returned {p.stdout.strip()!r}, expected [1, 11]\n{p.stderr}")

    step("credentials for the node and a driver (caf-hvd cluster)")
    run(["caf-hvd", "cluster", "init", "/root/cluster"])
    run(["caf-hvd", "cluster", "add-node", "pkgnode", "/root/cluster"])
    run(["caf-hvd", "cluster", "add-driver", "pkghead", "/root/cluster", "--out", "/root/driver"])
    run(["install", "-d", "-o", "caf-hvd", "-g", "caf-hvd", "-m", "0700", "/etc/caf-hvd"])
    run(["cp", "-a", "/root/cluster/issued/pkgnode", "/etc/caf-hvd/cluster"])
    run(["chown", "-R", "caf-hvd:caf-hvd", "/etc/caf-hvd/cluster"])
    config = open("/etc/default/caf-hvd-node").read()
    config = re.sub(r"(?m)^CAF_HVD_NODE_PORT=.*$", f"CAF_HVD_NODE_PORT={PORT}", config)
    config = re.sub(r"(?m)^CAF_HVD_NODE_NAME=.*$", "CAF_HVD_NODE_NAME=pkgnode", config)
    config = re.sub(r"(?m)^CAF_HVD_NODE_SLOTS=.*$", "CAF_HVD_NODE_SLOTS=2", config)
    open("/etc/default/caf-hvd-node", "w").write(config)

    step("the agent as caf-hvd-node.service starts it")
    agent = start_agent("/tmp/agent.log")

    step("a driver job against the agent")
    p = run(["caf-hvd", "driver", "--cluster-dir", "/root/driver", "-np", "2",
             "-H", f"127.0.0.1:{PORT}:2", "--", "caf-hvd-allreduce"], timeout=120)
    if "caf-hvd-allreduce: all sums correct" not in p.stdout:
        fail(f"the driver job printed no result:\n{p.stdout}")
    p = run(["caf-hvd", "driver", "--cluster-dir", "/root/driver", "-np", "1",
             "-H", f"127.0.0.1:{PORT}:2", "--", "sh", "-c", "id -un; echo $HOROVOD_HOSTNAME"],
            timeout=120)
    # the driver certificate 'pkghead' names no account here: the job account runs it
    if "caf-hvd-job" not in p.stdout or "pkgnode" not in p.stdout:
        fail(f"the rank did not run as caf-hvd-job on node pkgnode:\n{p.stdout}")
    if "ranks run as their owner's account" not in open("/tmp/agent.log").read():
        fail(f"the packaged agent does not switch users:\n{open('/tmp/agent.log').read()}")

    member = operators_page(config)

    step("SIGHUP (systemctl reload) reloads, SIGTERM stops the agent")
    for proc, log_path in ((agent, "/tmp/agent.log"), (member, "/tmp/member.log")):
        proc.send_signal(signal.SIGHUP)
        wait_for_log(log_path, "SIGHUP: reloaded the credentials", "reload after SIGHUP",
                     seconds=10)
    # the revoked certificate: refused by both agents, with the reason
    for port in (PORT, PORT + 1):
        p = run(["caf-hvd", "driver", "--cluster-dir", "/root/mallory", "-np", "1",
                 "-H", f"127.0.0.1:{port}:1", "--", "true"], ok=False)
        if p.returncode == 0 or "revoked" not in p.stderr:
            fail(f"the revoked certificate was not refused by the agent at {port} saying so "
                 f"({p.returncode}):\n{p.stderr}")
    stop_agent(member, "/tmp/member.log")
    stop_agent(agent, "/tmp/agent.log")

    step("dpkg -P caf-hvd leaves nothing behind")
    run(["dpkg", "-P", "caf-hvd"], timeout=300, env=apt_env())
    after = tree()
    left = sorted(f for f in after - before if not ALLOWED_LEFT.match(f))
    gone = sorted(f for f in before - after if not ALLOWED_LEFT.match(f))
    if left or gone:
        fail(f"after dpkg -P: left behind {left}, removed {gone}")
    step("ok")


main()
