#!/usr/bin/python3
"""Where an executor call's cost goes: the CPU time and the voluntary context switches of
every thread of every process taking part (the owner, the caf-hvd driver, the node agents
and the ranks), per call, over many `execute(lambda w: None)` calls on 8 workers over two
node agents with mutual TLS (or on 8 local workers with --local).

usage: bench/executor_cost.py [--calls N] [--local] [--build DIR]

On a machine with two cores a call's wall time follows its total CPU time and its
wake-ups (each context switch costs tens of microseconds in a VM), so these two columns
show what a change to the call path saves, with less noise than timing the calls.
Prints the wall time per call and a Markdown table per process kind, thread by thread
(threads of one role summed; a caf-hvd thread's role is told by the system call it
idles in after the calls: epoll_wait is CAF's multiplexer, read a channel's reader, a
futex wait CAF's scheduler or a channel's writer). Needs Debian's python3-cloudpickle (run with /usr/bin/python3); Linux
/proc."""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_env import ROOT  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, "python"))

from caf_hvd import Executor  # noqa: E402
from harness import Cluster  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
IDLE_IN = {"0": "read", "7": "poll", "202": "futex", "232": "epoll_wait", "281": "epoll_wait",
           "128": "sigtimedwait", "230": "sleep", "35": "sleep", "61": "wait4"}


def noop(_=None):
    return None


def kind_of(argv, pid):
    if pid == os.getpid():
        return "owner (Python)"
    if os.path.basename(argv[0]) == "caf-hvd" and len(argv) > 1:
        return {"driver": "caf-hvd driver", "node": "caf-hvd node agent",
                "run": "caf-hvd run"}.get(argv[1])
    if "caf_hvd.worker" in argv:
        return "rank (Python)"
    return None


def ours():
    """This process and its descendants (the driver, the agents, the ranks)."""
    children = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            children.setdefault(int(stat[stat.rindex(")") + 2:].split()[1]), []).append(int(pid))
        except (OSError, ValueError, IndexError):
            continue  # a process that ended while it was read
    mine, todo = set(), [os.getpid()]
    while todo:
        pid = todo.pop()
        mine.add(pid)
        todo += children.get(pid, [])
    return mine


def threads():
    """(pid, tid) -> (kind, thread name, voluntary switches, CPU ticks)."""
    out = {}
    for pid in map(str, ours()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
            kind = kind_of(argv, int(pid))
            if not kind:
                continue
            for tid in os.listdir(f"/proc/{pid}/task"):
                base = f"/proc/{pid}/task/{tid}"
                with open(f"{base}/status") as f:
                    status = f.read()
                switches = int(status.split("voluntary_ctxt_switches:")[1].split()[0])
                with open(f"{base}/stat") as f:
                    stat = f.read()
                fields = stat[stat.rindex(")") + 2:].split()
                with open(f"{base}/comm") as f:
                    name = f.read().strip()
                if kind.startswith("caf-hvd"):
                    with open(f"{base}/syscall") as f:
                        call = f.read().split()[0]
                    name = f"idle in {IDLE_IN.get(call, 'syscall ' + call)}"
                out[(pid, tid)] = (kind, name, switches, int(fields[11]) + int(fields[12]))
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended while it was read
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--local", action="store_true")
    ap.add_argument("--build", default=None)
    a = ap.parse_args()
    c = Cluster()
    try:
        if a.local:
            ex = Executor(num_workers=8)
            setup = "8 local workers"
        else:
            c.node("b1")
            c.node("b2")
            ex = Executor(num_workers=8, hosts=f"{c.spec('b1', 4)},{c.spec('b2', 4)}")
            setup = "2 node agents x 4 workers, mutual TLS"
        with ex:
            ex.start()
            for _ in range(100):
                ex.execute(noop)
            time.sleep(0.2)  # every thread idles in its own system call when read
            before = threads()
            t0 = time.perf_counter()
            for _ in range(a.calls):
                ex.execute(noop)
            wall = time.perf_counter() - t0
            time.sleep(0.2)
            after = threads()
    finally:
        c.close()
    rows = {}
    for key, (kind, name, switches, ticks) in after.items():
        if key not in before:
            continue
        _, _, s0, t0 = before[key]
        row = rows.setdefault((kind, name), [0, 0, set()])
        row[0] += switches - s0
        row[1] += ticks - t0
        row[2].add(key)
    n = a.calls
    print(f"execute(no-op), {setup}, {n} calls: {wall / n * 1000:.3f} ms per call\n")
    print("| process | threads | per call: context switches | CPU ms |")
    print("|---|---|---|---|")
    total_sw = total_cpu = 0
    for (kind, name), (sw, ticks, keys) in sorted(rows.items()):
        if sw == 0 and ticks == 0:
            continue
        total_sw += sw
        total_cpu += ticks
        print(f"| {kind} | {len(keys)} x {name} | {sw / n:.2f} | {ticks / TICK / n * 1000:.3f} |")
    print(f"| all | | {total_sw / n:.1f} | {total_cpu / TICK / n * 1000:.3f} |")


if __name__ == "__main__":
    main()
