"""A rank that tries to reach what is not its own (run by the isolation suite as the rank
of one owner's job, on an agent that also runs another owner's rank):

  isolation_attack.py AGENT_PID AGENT_KEY OTHER_MARK OTHER_UID OTHER_RDZV OTHER_STORE

Prints one JSON line: for each attempt, "refused: <errno name>" or what it got. The
attempts: read the agent's TLS key; find the other job's rank by OTHER_MARK in its command
line and read its environment; signal that rank and the agent; become OTHER_UID; ask the
other job's rendezvous server and torch store on this machine (their ports); and the
rank's own identity and capability sets.

  isolation_attack.py own RELEASE_FILE

is the other job's rank: it prints one JSON line (its servers' ports, what its own
rendezvous server and torch store answer it), waits for RELEASE_FILE, prints "done"."""

import json
import os
import signal
import socket
import sys
import time


def ask_rendezvous(port):
    """The first line of the server's answer to a read of a planned scope."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
        c.sendall(b"GET /global/0 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        try:
            answer = c.recv(200)
        except ConnectionResetError:
            answer = b""
    if not answer:
        raise ConnectionRefusedError(111, "the server closed the connection unanswered")
    return answer.split(b"\r\n")[0].decode()


def ask_store(port):
    """Whether the torch store keeps a connection open (it waits for a request)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
        c.settimeout(1.0)
        try:
            if not c.recv(1):
                raise ConnectionRefusedError(111, "the store closed the connection")
        except socket.timeout:
            return "open"
        except ConnectionResetError:
            raise ConnectionRefusedError(111, "the store reset the connection")
    return "sent bytes unasked"


out = {}
if sys.argv[1] == "own":
    rdzv, store = (int(os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"]),
                   int(os.environ["MASTER_PORT"]))
    out = {"uid": os.getuid(), "rendezvous_port": rdzv, "store_port": store}
    for name, fn in (("own_rendezvous", lambda: ask_rendezvous(rdzv)),
                     ("own_store", lambda: ask_store(store))):
        try:
            out[name] = f"got: {fn()}"
        except OSError as e:
            out[name] = f"refused: {e.strerror}"
    print(json.dumps(out), flush=True)
    while not os.path.exists(sys.argv[2]):
        time.sleep(0.1)
    print("done", flush=True)
    sys.exit(0)

agent_pid, agent_key, other_mark, other_uid = (int(sys.argv[1]), sys.argv[2], sys.argv[3],
                                               int(sys.argv[4]))
other_rdzv, other_store = int(sys.argv[5]), int(sys.argv[6])


def attempt(name, fn):
    try:
        got = fn()
        out[name] = f"got: {got!r}"[:200]
    except OSError as e:
        out[name] = f"refused: {e.strerror or os.strerror(e.errno)}"


def other_rank():
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            if other_mark.encode() in cmdline and b"\0own\0" in cmdline:
                return int(entry)
        except OSError:
            continue
    return None


victim = other_rank()
out["other_rank_found"] = victim is not None
attempt("agent_key", lambda: open(agent_key, "rb").read(16))
if victim is not None:
    attempt("other_environ", lambda: open(f"/proc/{victim}/environ", "rb").read(64))
    attempt("signal_other", lambda: os.kill(victim, signal.SIGTERM))
attempt("signal_agent", lambda: os.kill(agent_pid, signal.SIGTERM))
attempt("other_rendezvous", lambda: ask_rendezvous(other_rdzv))
attempt("other_store", lambda: ask_store(other_store))
attempt("setuid_other", lambda: os.setuid(other_uid))
caps = {}
with open("/proc/self/status") as f:
    for line in f:
        key, _, value = line.partition(":")
        if key in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
            caps[key] = int(value.strip(), 16)
out["caps"] = caps
out["uid"] = os.getuid()
out["euid"] = os.geteuid()
out["gid"] = os.getgid()
out["groups"] = sorted(os.getgroups())
out["env"] = {k: os.environ.get(k) for k in ("HOME", "USER", "LOGNAME")}
out["cwd"] = os.getcwd()
print(json.dumps(out), flush=True)
