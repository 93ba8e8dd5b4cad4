"""What every bench script needs before it imports the test harness: the repository root,
the build directory (`--build DIR` on the command line, else build/), CAF_HVD pointing into
it unless already set, and tests/cluster on the import path."""

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = sys.argv[sys.argv.index("--build") + 1] if "--build" in sys.argv[:-1] else \
    os.path.join(ROOT, "build")
os.environ.setdefault("CAF_HVD", os.path.join(BUILD, "apps", "caf-hvd"))
# Agents run ranks as their own user, as in the tests (throw-away certificates)
os.environ.setdefault("CAF_HVD_RANK_USER", "agent")
sys.path.insert(0, os.path.join(ROOT, "tests", "cluster"))


def named_build(spec):
    """argparse type of a NAME=PATH/TO/caf-hvd argument (scripts that compare builds)."""
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"'{spec}': give NAME=PATH/TO/caf-hvd")
    return name, path


def report_job(n, verdicts, rc, seconds, counted, faults, lost, why, left, log_path, out, err):
    """The chaos soaks' line for one job (verdicts, exit, time, `counted`, the faults; then
    what was lost, why it failed, what was left), printed; with `log_path`, the job's
    output appended there."""
    line = (f"job {n:3d}: {'/'.join(verdicts):24s} exit {rc:3d} {seconds:5.1f} s, "
            f"{counted}, faults: {', '.join(faults) or '-'}")
    if lost:
        line += f"\n          {lost}"
    if why and "ok" not in verdicts:
        line += f"\n          {why}"
    if left:
        line += f"\n          left: {'; '.join(str(x) for x in left[:4])}"
    print(line, flush=True)
    if log_path:
        with open(log_path, "a") as f:
            f.write(f"==== job {n}: {verdicts} {faults}\n{out}\n---- stderr\n{err}\n")


def cmdline(pid):
    """A process's command line, its arguments joined by spaces ("" once it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def start_collected(cmd):
    """Starts `cmd` in a session of its own; its stdout and stderr lines are collected by
    two threads into lists. Returns (process, out lines, err lines, reader threads)."""
    import subprocess
    import threading
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    out, err = [], []
    readers = [threading.Thread(target=lambda s=s, b=b: b.extend(iter(s.readline, "")),
                                daemon=True) for s, b in ((p.stdout, out), (p.stderr, err))]
    for t in readers:
        t.start()
    return p, out, err, readers


def end_collected(p, readers, deadline):
    """Waits for a process started by start_collected until `deadline` (monotonic); kills
    its session when it is still running then. Returns whether it hung."""
    import signal
    import subprocess
    import time
    hung = False
    try:
        p.wait(timeout=max(1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        hung = True
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    for t in readers:
        t.join(5)
    return hung
