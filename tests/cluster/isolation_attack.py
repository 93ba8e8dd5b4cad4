"""A rank that tries to reach what is not its own (run by the isolation suite as the rank
of one owner's job, on an agent that also runs another owner's rank):

  isolation_attack.py AGENT_PID AGENT_KEY OTHER_MARK OTHER_UID

Prints one JSON line: for each attempt, "refused: <errno name>" or what it got. The
attempts: read the agent's TLS key; find the other job's rank by OTHER_MARK in its command
line and read its environment; signal that rank and the agent; become OTHER_UID; and the
rank's own identity and capability sets."""

import json
import os
import signal
import sys

agent_pid, agent_key, other_mark, other_uid = (int(sys.argv[1]), sys.argv[2], sys.argv[3],
                                               int(sys.argv[4]))
out = {}


def attempt(name, fn):
    try:
        got = fn()
        out[name] = f"got: {got!r}"[:200]
    except OSError as e:
        out[name] = f"refused: {os.strerror(e.errno)}"


def other_rank():
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            if other_mark.encode() in cmdline and b"isolation_attack" not in cmdline:
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
