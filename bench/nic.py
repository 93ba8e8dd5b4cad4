#!/usr/bin/env python3
"""NIC discovery time on the network-namespace harness (needs root).

usage: bench/nic.py [--runs N] [--build DIR]

For 3 and 8 hosts (one rank each, one decoy interface per host), runs `caf-hvd driver
--verbose -- true` from host 0 and takes the time between the driver's 'nic: begins'
and 'launch: begins' lines: all-to-all probes from every interface of every host,
plus the choice."""

import argparse
import os
import re
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "cluster"))
os.environ.setdefault("CAF_HVD", os.path.join(ROOT, "build", "apps", "caf-hvd"))
import harness  # noqa: E402,F401  (creates a test cluster: TLS as by default)
import netns  # noqa: E402

STAMP = re.compile(r"caf-hvd \[\s*(\d+) ms\] (\w+): begins")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    a = ap.parse_args()
    why = netns.available()
    if why:
        sys.exit(why)
    caf = os.path.join(a.build, "apps", "caf-hvd")
    print("| hosts | NIC discovery median (ms) | min - max | whole job median (ms) |")
    print("|-------|---------------------------|-----------|-----------------------|")
    for count in (3, 8):
        h = netns.Hosts(count)
        try:
            for i in range(count):
                h.start_node(i, caf)
            spec = ",".join(f"{x['good_addr']}:24780:1" for x in h.hosts)
            nic, total = [], []
            for _ in range(a.runs):
                rc, _, err = h.run(0, [caf, "driver", "--verbose", "-np", str(count), "-H", spec,
                                       "--", "true"])
                if rc != 0:
                    sys.exit(err)
                stamps = {m.group(2): int(m.group(1)) for m in STAMP.finditer(err)}
                nic.append(stamps["launch"] - stamps["nic"])
                total.append(int(re.findall(r"\[\s*(\d+) ms\]", err)[-1]))
            print(f"| {count:>5} | {statistics.median(nic):>25} | {min(nic):>4} - {max(nic):<4}"
                  f"| {statistics.median(total):>21} |", flush=True)
        finally:
            h.close()


if __name__ == "__main__":
    main()
